# The two set-up commands (see README.md): `make broker` and `make test`.
# Both create .venv with the project's own Python dependencies on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: broker test lint bench

$(BIN)/phpmq: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

broker: $(BIN)/phpmq
	$(BIN)/phpmq broker $(ARGS)

test: $(BIN)/phpmq
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(ARGS); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$status

bench: $(BIN)/phpmq
	$(BIN)/phpmq bench $(ARGS)
