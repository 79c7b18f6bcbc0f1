# omnipipe: two commands.
#   make demo   - create .venv, install omnipipe and its models, answer a written and a spoken question
#   make test   - install the test dependencies and run the whole test suite (make test-fast: the quick tier)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= demo-output

.PHONY: demo test test-fast install install-test system-deps lint lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the CPU build that lies on this kind of machine; never let a resolver pick a CUDA build.
# constraints.txt pins every other package to the versions the suite last passed with.
PIP_INSTALL := $(BIN)/pip install --quiet -c constraints.txt

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[models]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml constraints.txt
	$(PIP_INSTALL) -e '.[models,test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(BIN)/omnipipe download
	@mkdir -p $(OUT)
	@echo "== a written question =="
	$(BIN)/omnipipe generate "What is the capital of France?" --output $(OUT)/answer.wav --stats
	@echo "== a spoken question (made with the tts pipeline) =="
	$(BIN)/omnipipe generate --pipeline tts "What is the largest planet in our solar system?" --output $(OUT)/question.wav
	$(BIN)/omnipipe generate --audio-in $(OUT)/question.wav --output $(OUT)/spoken-answer.wav --stats
	@echo "== an image (the digits diffusion model) =="
	$(BIN)/omnipipe generate --pipeline image "draw a seven" --output $(OUT)/seven.png
	@echo "wrote $(OUT)/answer.wav, $(OUT)/spoken-answer.wav and $(OUT)/seven.png"

# What the suite needs from the system, installed here where we may (root with apt-get), else said loudly:
# Debian's chromium for the browser tests, libibverbs1 for the Mooncake relay's transfer engine (loaded even for tcp).
system-deps:
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium fonts-dejavu-core"; \
	ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' || missing="$$missing libibverbs1"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's$$missing for the test suite"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "*** missing system packages:$$missing, and apt-get cannot run as root here. SKIPPED because of it:"; \
	    echo "***   chromium: the browser tests (tests/browser); libibverbs1: the mooncake relay tests"; \
	    echo "*** Install them with: sudo apt-get install$$missing"; \
	  fi; \
	fi

# the whole suite, as CI runs it
test: install-test system-deps
	$(BIN)/omnipipe download
	$(BIN)/python -m pytest

# the tier to run while working: everything that loads no packaged model, starts no browser and is not marked slow
test-fast: install-test
	$(BIN)/python -m pytest -m "not models and not browser and not slow" -q

# ruff (rules in pyproject.toml), the dead-code check (vulture; what only frameworks call is in
# tools/vulture_whitelist.py), the type check of the core folders (mypy; the folders in pyproject.toml) and the
# import-cycle check of src/omnipipe (tools/import_cycles.py)
lint: install-test
	$(BIN)/python -m ruff check src tests tools
	$(BIN)/python -m vulture
	$(BIN)/python -m mypy
	$(BIN)/python tools/import_cycles.py

# after changing dependencies in pyproject.toml: install without the old pins, run the suite, then pin again
lock: install-test
	(echo "# Every package omnipipe installs, pinned to the versions the test suite last passed with (used as pip"; \
	 echo "# constraints by the Makefile). Regenerate after changing dependencies: make lock"; \
	 $(BIN)/pip freeze --exclude-editable | sed 's/+cpu$$//') > constraints.txt

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
