# The two commands of the README. Both create .venv on first use (torch from the CPU build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install lint

$(BIN)/tessera: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/tessera

install: $(BIN)/tessera

run: install
	$(BIN)/tessera run -p "The for statement" -n 64 --temp 0 --repeat-penalty 1.1

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: install
	$(BIN)/ruff check core backends models plugins tests training examples
