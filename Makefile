# The course in two commands:
#   make lab    set up (or refresh) .venv with the tested versions and open JupyterLab
#   make test   the same set-up, then every test: unit tests, notebooks, solutions, exercises
#
# Everything runs from a local virtual environment; nothing is installed system-wide.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
LOCK   := requirements/lock.txt
PYTEST := $(PY) -m pytest
FIRST  := notebooks/01_single_head_attention.ipynb
NBVAL  := --nbval-current-env --nbval-cell-timeout=300 -p no:cacheprovider

.PHONY: help install lab test notebooks exercises bench autograder lock clean

help:
	@echo "make lab        open the course in JupyterLab (sets up .venv first)"
	@echo "make test       run the whole test suite (sets up .venv first)"
	@echo "make notebooks  re-execute every notebook and solution in place"
	@echo "make exercises  regenerate exercises/ from solutions/"
	@echo "make bench      run every benchmark and print the ratios"
	@echo "make autograder build dist/autograder.zip for Gradescope"

# (Re)create the environment whenever the pins or the package metadata change.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --disable-pip-version-check -q -c $(LOCK) -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# LAB_ARGS passes options to JupyterLab, e.g. make lab LAB_ARGS="--no-browser --port 8899".
# As root (containers, some cloud machines) JupyterLab needs --allow-root.
LAB_ARGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. $(ROOT_FLAG) $(LAB_ARGS) $(FIRST)

test: $(STAMP)
	$(PYTEST) tests --ignore=tests/browser -n 2
	$(PYTEST) $(NBVAL) --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg -n 2 --dist loadscope notebooks solutions
	$(PYTEST) $(NBVAL) --nbval-lax -n 2 --dist loadscope exercises
	$(PYTEST) tests/browser -p no:cacheprovider

notebooks: $(STAMP)
	$(PY) tools/run_notebooks.py notebooks solutions

exercises: $(STAMP)
	$(PY) -m mhalib.grade.release

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

autograder: $(STAMP)
	$(PY) tools/build_autograder.py

# Refresh the pins from what is installed in .venv (after a deliberate upgrade).
lock: $(STAMP)
	{ echo "# Exact, tested versions (pip constraints). Regenerate with: make lock"; \
	  $(PIP) freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > $(LOCK)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis artifacts
