# The two commands of the README. Both create .venv on first use (torch from the CPU build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install lint browser

# PyPI's Linux torch is the CUDA build (gigabytes of CUDA libraries); the CPU build comes
# from PyTorch's own index, and from PyPI only where that index cannot be reached.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(BIN)/tessera: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || \
		$(BIN)/pip install -q --retries 1 --timeout 20 torch==2.13.0 --index-url $(TORCH_INDEX) || \
		{ echo "$(TORCH_INDEX) is out of reach: torch from PyPI instead"; \
		  $(BIN)/pip install -q torch==2.13.0; }
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/tessera

install: $(BIN)/tessera

run: install
	$(BIN)/tessera run -p "The for statement" -n 64 --temp 0 --repeat-penalty 1.1

# The web UI's browser tests drive Debian's chromium through chromedriver (apt, as root or
# with sudo); installed once, when missing.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		echo "installing chromium and chromium-driver for the web UI's browser tests"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver; \
	fi

test: install browser
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: install
	$(BIN)/ruff check core backends models plugins tests training examples
