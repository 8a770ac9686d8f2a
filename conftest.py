"""Collects the examples of README.md and docs/*.md as tests (tests/docs_examples.py says how
they run): `pytest README.md docs`, and `make test` with the rest."""

import pytest

from docs_examples import DOCUMENTS

pytest_collect_file = DOCUMENTS.pytest()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A document's examples share one shell and one broker and run in their order (a
    `skip: next` applies to the block after it): under pytest-xdist each document is one
    xdist_group, so one worker runs all of it, in order."""
    for item in items:
        path = item.path
        if path.suffix == ".md":
            item.add_marker(pytest.mark.xdist_group(f"docs-{path.stem}"))
