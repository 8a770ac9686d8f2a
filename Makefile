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
	@# php-cli for the stock-client end-to-end test; in CI a missing php fails that test.
	@if [ -n "$$CI" ] && ! command -v php >/dev/null 2>&1; then \
	  apt-get install -y -q php-cli >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null && apt-get install -y -q php-cli >/dev/null; }; \
	fi
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(ARGS); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$status

bench: $(BIN)/phpmq
	$(BIN)/phpmq bench $(ARGS)
