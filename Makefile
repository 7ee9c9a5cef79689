# Two commands on a fresh machine (Python >= 3.10):
#   make book   build the whole book into _build/html
#   make test   run every test
# Both create .venv and install requirements.txt the first time.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1

.PHONY: install book test bench clean

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

install: $(STAMP)

book: $(STAMP)
	@mkdir -p _build
	@$(VENV)/bin/jupyter-book build . -W -n --keep-going > _build/book.log 2>&1 \
		|| { tail -n 60 _build/book.log; echo; echo "Book build FAILED; full log: $(abspath _build/book.log)"; exit 1; }
	@echo "Book built: $(abspath _build/html/index.html)"
	@echo "Preview:    $(PY) -m http.server -d _build/html"

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/decoder.py

clean:
	rm -rf _build
