"""Collects the examples of README.md and docs/*.md as tests (tests/docs_examples.py says how
they run): `pytest README.md docs`, and `make test` with the rest."""

from docs_examples import DOCUMENTS

pytest_collect_file = DOCUMENTS.pytest()
