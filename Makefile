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

# The Pythons the course supports; requires-python in pyproject.toml and the README agree.
PY_OLDEST := 3.10
PY_NEWEST := 3.13
# PyTorch's index of CPU-only wheels. On Linux torch comes from there first: PyPI's Linux
# torch wheel is the CUDA build (about 530 MB, plus about 2.2 GB of CUDA libraries).
# make lab TORCH_CPU_INDEX= (empty) skips it.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_FLAGS := --disable-pip-version-check
TORCH_VERSION = $(shell sed -n 's/^torch==\([^;]*\).*/\1/p' $(LOCK))

.PHONY: help install lab test unit notebooks exercises grade student-release nbgrader bench autograder lock clean

help:
	@echo "make lab        open the course in JupyterLab (sets up .venv first)"
	@echo "make test       run the whole test suite (sets up .venv first), printing each stage's time"
	@echo "make unit       the unit tests alone, in the existing .venv (no set-up)"
	@echo "make notebooks  re-execute every notebook and solution in place"
	@echo "make exercises  regenerate exercises/ from solutions/ (never over an exercise someone changed)"
	@echo "make grade NB=exercises/01_single_head_attention.ipynb  grade your own notebook"
	@echo "make student-release  dist/mha-course-student.zip: the course without solutions/, to hand out"
	@echo "make nbgrader   install nbgrader 0.9.6 beside the course ($(NBGRADER_VENV)/bin/nbgrader)"
	@echo "make bench      run every benchmark and print the ratios"
	@echo "make autograder EXERCISE=NN  build the Gradescope zip for exercise NN (dist/)"

# Small Python programs the recipes below run (exported, read as "$$NAME").
# CHECK_PY: is this Python one the course supports? argv: oldest newest what advice
define CHECK_PY
import sys
oldest, newest, what, advice = sys.argv[1:5]
found = "%d.%d.%d" % tuple(sys.version_info[:3])
key = lambda v: tuple(int(p) for p in v.split("."))
if not key(oldest) <= tuple(sys.version_info[:2]) <= key(newest):
    sys.exit("make: %s is Python %s (%s); the course supports Python %s to %s.\n      %s"
             % (what, found, sys.executable, oldest, newest, advice))
print("==> Python %s (%s): supported (%s to %s)" % (found, sys.executable, oldest, newest))
endef
# PROBE_PY: does the package index argv[1] answer within 5 seconds?
define PROBE_PY
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception as error:
    print("    (%s: %s)" % (type(error).__name__, str(error)[:120]))
    sys.exit(1)
endef
# TORCH_BUILD_PY: which torch build is installed (from its metadata, without importing it)
define TORCH_BUILD_PY
from importlib import metadata
needs = metadata.requires("torch") or []
cuda = any(r.startswith(("nvidia", "cuda")) for r in needs)
print("==> torch %s is installed: the %s build" % (metadata.version("torch"), "CUDA" if cuda else "CPU"))
endef
export CHECK_PY PROBE_PY TORCH_BUILD_PY

# (Re)create the environment whenever the pins or the package metadata change.
# 1. check the Python (an existing $(VENV)'s own, or $(PYTHON) for a new one);
# 2. on Linux, torch first: the CPU build from $(TORCH_CPU_INDEX) when it answers, else
#    from the normal package index; 3. everything else, at the versions pinned in $(LOCK).
# 4. the course's JupyterLab extension, prebuilt in labextension/ (no Node.js needed); a
#    rebuild changes its package.json, and the next make installs it again.
LABEXT := labextension/pyproject.toml labextension/install.json labextension/mha-course-a11y/package.json
$(STAMP): pyproject.toml $(LOCK) $(LABEXT)
	@if [ -x $(PY) ]; then \
	  $(PY) -c "$$CHECK_PY" $(PY_OLDEST) $(PY_NEWEST) "the Python of $(VENV)" \
	    "Remove it with 'make clean', then run make again with a supported one, e.g. PYTHON=python$(PY_NEWEST)."; \
	else \
	  command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: no '$(PYTHON)' found. Install Python $(PY_OLDEST) to $(PY_NEWEST), or name one with PYTHON=, e.g. make lab PYTHON=python$(PY_NEWEST)" >&2; exit 1; }; \
	  $(PYTHON) -c "$$CHECK_PY" $(PY_OLDEST) $(PY_NEWEST) "'$(PYTHON)'" \
	    "Name a supported one with PYTHON=, e.g. make lab PYTHON=python$(PY_NEWEST)." && \
	  echo "==> Creating the virtual environment $(VENV): everything goes there, nothing system-wide" && \
	  $(PYTHON) -m venv $(VENV); \
	fi
	@echo "==> Installing into $(VENV). A first run downloads about 320 MB (torch, the CPU build, is about 185 MB of it); a few minutes."
	@set -e; if [ "$$(uname -s)" = Linux ]; then \
	  if [ -z "$(TORCH_CPU_INDEX)" ]; then \
	    echo "==> torch $(TORCH_VERSION): TORCH_CPU_INDEX is empty, so from the normal package index"; \
	    $(PIP) install $(PIP_FLAGS) -c $(LOCK) torch; \
	  elif echo "==> Asking PyTorch's CPU index ($(TORCH_CPU_INDEX)) for torch, 5 s at most" && \
	       $(PY) -c "$$PROBE_PY" "$(TORCH_CPU_INDEX)"; then \
	    echo "==> torch $(TORCH_VERSION), the CPU build (about 185 MB), from $(TORCH_CPU_INDEX)"; \
	    $(PIP) install $(PIP_FLAGS) --no-deps --index-url $(TORCH_CPU_INDEX) -c $(LOCK) torch; \
	  else \
	    echo "==> torch $(TORCH_VERSION): PyTorch's CPU index did not answer; from the normal package index instead."; \
	    echo "    WARNING: PyPI's Linux torch wheel is the CUDA build: about 530 MB, plus about 2.2 GB of CUDA"; \
	    echo "    libraries, unless pip already has the CPU wheel at hand (its cache, --find-links)."; \
	    $(PIP) install $(PIP_FLAGS) -c $(LOCK) torch; \
	  fi; \
	fi
	@echo "==> The course's packages at the versions pinned in $(LOCK), and mhalib from this folder (editable)"
	$(PIP) install $(PIP_FLAGS) -c $(LOCK) -e '.[dev]'
	@echo "==> The course's JupyterLab extension, prebuilt (labextension/): figures' alternative text and names for screen readers"
	$(PIP) install $(PIP_FLAGS) ./labextension
	@$(PY) -c "$$TORCH_BUILD_PY"
	@touch $(STAMP)
	@echo "==> $(VENV) is ready; later runs reuse it until $(LOCK), pyproject.toml or labextension/ change."

install: $(STAMP)

# LAB_ARGS passes options to JupyterLab, e.g. make lab LAB_ARGS="--no-browser --port 8899".
# As root (containers, some cloud machines) JupyterLab needs --allow-root.
LAB_ARGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. $(ROOT_FLAG) $(LAB_ARGS) $(FIRST)

# Stored outputs may not depend on the processor. PyTorch picks its kernels by the CPU
# (ATEN_CPU_CAPABILITY: default, avx2, avx512, ...), and they round differently; the
# notebooks whose numbers come from training, or from trained weights, run a second time with the portable kernels
# on one thread, so a machine with a wider vector unit still checks a narrower one
# (notebook 06 runs the trained language model too).
PORTABLE := notebooks/04_what_heads_learn.ipynb notebooks/05_heads_in_language.ipynb notebooks/06_kv_cache.ipynb notebooks/08_mha_to_gqa.ipynb \
            solutions/04_what_heads_learn.ipynb solutions/05_heads_in_language.ipynb solutions/08_mha_to_gqa.ipynb \
            solutions/10_choosing_a_variant.ipynb

# One stage of make test: its command, then its time (and FAILED when it failed).
define stage
	@echo "==> stage: $(1)"; start=$$(date +%s); $(2); status=$$?; \
	echo "==> stage: $(1): $$(( $$(date +%s) - start )) s$$([ $$status -eq 0 ] || echo ', FAILED')"; exit $$status
endef
UNIT := $(PYTEST) tests --ignore=tests/browser -n 2

# The README gives measured stage times. The unit stage grades submissions under
# bubblewrap on Linux (apt-get install bubblewrap; without it those tests are skipped,
# and fail under CI); the network stage needs the package index; the browser stage Chromium.
test: $(STAMP)
	@date +%s > $(VENV)/.test-start
	$(call stage,unit tests,$(UNIT) -m "not network and not under_load")
	$(call stage,network (pip resolution for every Python; nbgrader),$(PYTEST) tests --ignore=tests/browser -m network -p no:cacheprovider)
	$(call stage,notebooks and solutions (strict nbval),$(PYTEST) $(NBVAL) --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg -n 2 --dist loadscope notebooks solutions)
	$(call stage,trained notebooks with portable kernels (1 thread),ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 $(PYTEST) $(NBVAL) --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg -n 2 --dist loadscope $(PORTABLE))
	$(call stage,exercises (nbval-lax),$(PYTEST) $(NBVAL) --nbval-lax -n 2 --dist loadscope exercises)
	$(call stage,notebook 07 beside a busy process (an explorer cell never leaves the run waiting),$(PYTEST) tests/test_notebook07_under_load.py -m under_load -p no:xdist -p no:cacheprovider)
	$(call stage,browser,$(MAKE) --no-print-directory axe && $(PYTEST) tests/browser -p no:cacheprovider)
	@echo "==> make test passed in $$(( $$(date +%s) - $$(cat $(VENV)/.test-start) )) s"

# The unit tests alone, in the .venv that is there (never rebuilt): 2 to 10 minutes on 2 cores.
unit:
	@test -x $(PY) || { echo "make unit: no $(VENV) yet; run make test (or make lab) once first" >&2; exit 2; }
	$(UNIT) -m "not network and not under_load"

notebooks: $(STAMP)
	$(PY) tools/run_notebooks.py notebooks solutions
# The course site: the notebooks with their stored outputs, the exercises and the guides
# as static pages, searchable, nothing loaded from the network (tools/build_site.py). This
# and axe below share a paragraph with notebooks: the learners' copy (tools/student_release.py)
# has no tools/ or tests/ and leaves the paragraph out as a whole.
SITE_DIR ?= build/site
.PHONY: site axe
site: $(STAMP)
	$(PY) tools/build_site.py --out $(SITE_DIR)
# axe-core, the accessibility rules the browser stage checks the site and JupyterLab with: the
# version pinned in tests/browser/package-lock.json, installed by npm into $(VENV)/axe (ignored
# by git). Without npm the accessibility checks are skipped, saying so (and fail under CI).
AXE_DIR := $(VENV)/axe
AXE_JS  := $(AXE_DIR)/node_modules/axe-core/axe.min.js
axe: $(AXE_JS)
$(AXE_JS): tests/browser/package.json tests/browser/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  echo "==> axe-core as pinned in tests/browser/package-lock.json, into $(AXE_DIR) (npm ci)"; \
	  mkdir -p $(AXE_DIR) && cp tests/browser/package.json tests/browser/package-lock.json $(AXE_DIR)/ && \
	  npm ci --prefix $(AXE_DIR) --no-audit --no-fund --loglevel=error && touch $@; \
	else \
	  echo "==> npm not found: the browser stage's accessibility checks will be skipped (install Node.js and npm, e.g. sudo apt-get install npm)"; \
	fi

exercises: $(STAMP)
	$(PY) -m mhalib.grade.release

# A learner grades their own notebook: the same checks and points as a class run, with the
# code run as themselves (no sandbox needed; bubblewrap is for grading other people's work).
# NB is read from the folder make was started in, also with make -C COURSE_FOLDER grade: make
# runs the recipe in the course folder, $(CURDIR), and keeps the shell's PWD, the folder the
# learner was in. Without -C (which turns on make's -w, in MAKEFLAGS) that folder is $(CURDIR)
# itself, whatever a stale PWD says. A relative NB that is not there is read from $(CURDIR).
NB ?=
grade: $(STAMP)
	@test -n "$(NB)" || { echo "make grade NB=FILE.ipynb: name the notebook to grade, e.g. make grade NB=exercises/01_single_head_attention.ipynb" >&2; exit 2; }
	@nb="$(NB)"; here="$(PWD)"; dash_c="$(findstring w,$(filter-out -%,$(firstword $(MAKEFLAGS))))"; \
	case "$$nb" in /*) ;; *) \
	  if [ -z "$$dash_c" ] && [ -e "$$nb" ]; then :; \
	  elif [ -n "$$here" ] && [ "$$here" != "$(CURDIR)" ] && [ -e "$$here/$$nb" ]; then nb="$$here/$$nb"; fi;; \
	esac; \
	if [ ! -e "$$nb" ]; then \
	  echo "make grade: no notebook NB=$(NB) in $${here:-$(CURDIR)} (where make was started)$$([ "$${here:-$(CURDIR)}" = "$(CURDIR)" ] || echo ", nor in $(CURDIR) (the course folder)")" >&2; exit 2; \
	fi; \
	echo "$(PY) -m mhalib.grade --no-isolation \"$$nb\""; \
	$(PY) -m mhalib.grade --no-isolation "$$nb"

# What learners get: the course without solutions/ (and without the tests and tools that need them).
student-release: $(STAMP)
	$(PY) tools/student_release.py

# nbgrader 0.9.6 in an environment of its own (its pins differ from the course's), which also
# sees the course and its packages: $(NBGRADER_VENV)/bin/nbgrader. nbgrader starts the
# program `alembic` by name (nbgrader/api.py and dbutil.py, when it makes or upgrades
# gradebook.db), so that environment puts its own bin/ first on PATH whenever its Python
# starts (the import line of course.pth): $(NBGRADER_VENV)/bin/nbgrader then works as
# typed, with no environment activated.
NBGRADER_VENV := $(VENV)/nbgrader
define NBGRADER_PTH_PY
import sys, sysconfig
from pathlib import Path
course, packages = sys.argv[1:3]
on_path = ("import os, sys; b = os.path.dirname(sys.executable); p = os.environ.get('PATH', ''); "
           "b in p.split(os.pathsep) or os.environ.__setitem__('PATH', b + os.pathsep + p)")
Path(sysconfig.get_paths()["purelib"], "course.pth").write_text(course + "\n" + packages + "\n" + on_path + "\n")
endef
export NBGRADER_PTH_PY

nbgrader: $(STAMP)
	$(PY) -m venv $(NBGRADER_VENV)
	$(NBGRADER_VENV)/bin/python -m pip install $(PIP_FLAGS) nbgrader==0.9.6
	$(NBGRADER_VENV)/bin/python -c "$$NBGRADER_PTH_PY" "$(CURDIR)" "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	@echo "==> nbgrader is $(NBGRADER_VENV)/bin/nbgrader (see docs/instructors.md, Grading with nbgrader)"

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# One zip per Gradescope assignment: the exercise is fixed in the zip, whatever a notebook says.
EXERCISE ?=
autograder: $(STAMP)
	@test -n "$(EXERCISE)" || { echo "make autograder EXERCISE=NN: the zip grades one exercise; e.g. make autograder EXERCISE=01" >&2; exit 2; }
	$(PY) tools/build_autograder.py --exercise $(EXERCISE)

# Refresh the pins from what is installed in .venv (after a deliberate upgrade; a .venv
# made with Python 3.11 or newer). The lines for older Pythons, with a marker such as
# python_version < "3.11", are kept as they are: they are kept by hand, as the newest
# releases that still support Python $(PY_OLDEST). A frozen pin of the same package gets the
# opposite marker (>= "3.11"). Then check every Python: pytest tests/test_python_versions.py
define LOCK_PY
import re, subprocess, sys
lock, pip = sys.argv[1], sys.argv[2:]
if sys.version_info[:2] < (3, 11):
    sys.exit("make lock: the frozen pins are those for Python 3.11 and newer; this .venv has Python %d.%d" % sys.version_info[:2])
key = lambda name: re.sub(r"[-_.]+", "-", name.split("==")[0].strip()).lower()
old = open(lock).read().splitlines()
header = [line for line in old[:next(i for i, l in enumerate(old) if not l.startswith("#"))]]
kept = [line for line in old if re.search(r";\s*python(_full)?_version\s*<", line)]
newer = {key(line): re.sub(r"<(?!=)", ">=", line.split(";", 1)[1].strip()) for line in kept}
frozen = subprocess.run(pip + ["freeze", "--exclude-editable"], check=True, capture_output=True, text=True).stdout.split()
pins = kept + [re.sub(r"^(torch==[^+]*)\+cpu$$", r"\1", line) + ("; " + newer[key(line)] if key(line) in newer else "")
               for line in frozen]
pins.sort(key=lambda line: (line.split("==")[0].lower(), ">=" in line))
open(lock, "w").write("\n".join(header + pins) + "\n")
print("==> %s: %d pins from %s, %d kept for older Pythons" % (lock, len(frozen), sys.executable, len(kept)))
endef
export LOCK_PY

lock: $(STAMP)
	@$(PY) -c "$$LOCK_PY" $(LOCK) $(PIP)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis artifacts
