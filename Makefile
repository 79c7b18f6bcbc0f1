# omnipipe: two commands.
#   make demo   - create .venv, install omnipipe and its models, answer a written and a spoken question
#   make test   - install the test dependencies and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= demo-output

.PHONY: demo test install install-test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the CPU build that lies on this kind of machine; never let a resolver pick a CUDA build
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[models]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install --quiet -e '.[models,test]'
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
	@echo "wrote $(OUT)/answer.wav and $(OUT)/spoken-answer.wav"

test: install-test
	$(BIN)/omnipipe download
	$(BIN)/python -m pytest

lint: install-test
	$(BIN)/python -m ruff check --select E9,F,I src tests

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
