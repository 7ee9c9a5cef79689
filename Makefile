# Two commands on a fresh machine (Python >= 3.10):
#   make book   build the whole book into _build/html
#   make test   build the book, then run every test (library, notebooks, book, browser, Colab-like)
# Both create .venv and install requirements.txt the first time. For instructors,
# `make student` writes the chapters without their solutions into exercises/.

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed-stamp
BOOK_LOG := _build/book.log
BOOK_OK  := _build/book.ok
export HF_HUB_OFFLINE := 1

.PHONY: install book setup-cells student test bench clean

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

install: $(STAMP)

# Rewrite the setup cell of every notebook from repository.url / branch in _config.yml.
setup-cells: $(STAMP)
	@$(PY) _ext/setup_cell.py --write

# Student copies: every chapter with its solutions taken out, written to exercises/ (same
# file names; see tools/make_student.py). Commit them: a test fails when they are stale.
student: $(STAMP)
	@$(PY) tools/make_student.py

# Every page is rebuilt and every notebook executed (--all, execute_notebooks: force: a change
# in transformer_lib alone shows up); warnings are errors (-W -n). The whole
# output goes to _build/book.log; on failure the lines that matter and the log's path are shown.
# Outside CI the setup cells are first brought in line with _config.yml; in CI they are only
# checked (tests/test_book.py), so a commit that forgot them fails.
book: $(STAMP)
	@mkdir -p _build
	@rm -f $(BOOK_OK)
ifndef CI
	@$(PY) _ext/setup_cell.py --write
endif
	@echo "Building the book: every notebook is executed (log: $(abspath $(BOOK_LOG)))"
	@start=$$(date +%s); \
	if ! $(VENV)/bin/jupyter-book build . --all -W -n --keep-going > $(BOOK_LOG) 2>&1; then \
		echo "---- Sphinx warnings and errors ----"; \
		grep -E "(WARNING|ERROR|CRITICAL):" $(BOOK_LOG) | grep -v "IPKernelApp" | head -n 30; \
		echo "---- notebook that failed, the cell and its error ----"; \
		grep -m 1 -E "ExecutionError: /" $(BOOK_LOG); \
		sed -n '/Cell\(Execution\|Timeout\)Error/,/The above exception/p' $(BOOK_LOG) | head -n 60; \
		echo "---- end of the log ----"; tail -n 12 $(BOOK_LOG); echo; \
		echo "Book build FAILED; full log: $(abspath $(BOOK_LOG))"; \
		if [ -d _build/html/reports ]; then echo "Execution reports: $(abspath _build/html/reports)"; fi; \
		exit 1; \
	fi; \
	touch $(BOOK_OK); \
	echo "Book built in $$(( $$(date +%s) - start )) s: $(abspath _build/html/index.html)"
	@echo "Preview: $(PY) -m http.server -d _build/html  (then open http://127.0.0.1:8000)"

# The course's models are tiny, and PyTorch's two threads per process slow down many times
# over when the other core is busy (measured: training the reversal model took over 300 s
# instead of about 25 s). Book builds and tests run their kernels single-threaded.
book test: export OMP_NUM_THREADS := 1

# One build, then pytest: the library tests, nbval over chapters/, appendix/ and exercises/
# (see pyproject.toml), and the book, browser and Colab-like tests, which reuse _build/html.
# Outside CI the student copies are first regenerated (make student); in CI they are only
# checked (tests/test_student.py), so a commit that forgot them fails.
test: book
ifndef CI
	@$(PY) tools/make_student.py
endif
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/decoder.py

clean:
	rm -rf _build
