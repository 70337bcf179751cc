# CS336 assignment 2 report workbook.
#   make report                 set up (first time) and regenerate the report for this machine
#   make test                   the test suite (CPU; GPU tests skip without CUDA); what CI runs
#   make test-fast              the unit tests without the notebook runs and the multi-process jobs
#   make lint                   ruff's checks and format, the import layers (tools/lint_fix.sh applies fixes)
#   make report PROFILE=gpu NOTEBOOKS=01,03    a subset, a given profile
#   make lab | pdf | sync-notebooks | wheelhouse | clean
# On a node whose Python already has torch (e.g. an offline GPU node): make report PYTHON=python3

PROFILE   ?= auto
NOTEBOOKS ?=
OUT       ?=
VENV      ?= .venv
PYTHON    ?= $(VENV)/bin/python
# Without a GPU the CPU wheel of a tested torch release (and the Triton the GPU nodes run, for the
# interpreter tests); with one, the torch the GPU nodes run, with its own Triton (pyproject.toml's
# range allows no other CUDA wheel). No '<' or '>': the spec reaches the shell unquoted.
HAVE_GPU  := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_SPEC ?= $(if $(HAVE_GPU),torch~=2.11.0,torch==2.13.0 triton==3.6.0)
WHEELHOUSE ?= wheelhouse
OFFLINE_PACKAGES := papermill nbconvert nbformat ipykernel jupytext transformers ninja

export PYTHONPATH := $(CURDIR)/lib$(if $(PYTHONPATH),:$(PYTHONPATH))

ifeq ($(PYTHON),$(VENV)/bin/python)
SETUP := $(VENV)/.installed
else
SETUP :=
endif

.PHONY: setup report test test-fast lint lab sync-notebooks html pdf wheelhouse install-offline clean

setup: $(SETUP)

$(VENV)/.installed: pyproject.toml
	@echo "make: setting up $(VENV) (first time: torch, triton and the report's packages, a few minutes) ..."
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet $(TORCH_SPEC)
	$(VENV)/bin/python -m pip install --quiet -e ".[dev,report,lab,llama]"
	touch $@
	@echo "make: $(VENV) is ready"

report: $(SETUP)
	$(PYTHON) -m cs336_systems.report.run --profile $(PROFILE) $(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS)) $(if $(OUT),--out $(OUT)); \
	status=$$?; \
	if [ -n "$(CHROMIUM_FOUND)$(CHROMIUM)" ]; then $(PYTHON) -m cs336_systems.report.pdf --profile $(PROFILE) $(if $(OUT),--out $(OUT)); \
	else echo "(no Chromium: skipped writeup.pdf; \`make pdf\` installs it)"; fi; \
	exit $$status

test: $(SETUP)
	$(PYTHON) -m pytest -q -ra

# Markers in pyproject.toml: `slow` runs the notebooks, `multiprocess` starts distributed jobs.
test-fast: $(SETUP)
	$(PYTHON) -m pytest -q -ra -m "not slow and not multiprocess"

# ruff's rules and formatter as pyproject.toml's [tool.ruff] sets them (tools/lint_fix.sh applies what can be
# applied), then the import rules of the library (tools/import_layers.py; tests/test_import_layers.py runs it too).
lint: $(SETUP)
	$(PYTHON) -m ruff check --output-format concise .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) tools/import_layers.py

# jupytext's server extension (installed with jupytext) reads notebooks/jupytext.toml: saving a notebook
# in JupyterLab writes its NN_*.py too; opening one reads the cells from the .py (and refuses, showing
# the diff, when the .ipynb is newer and holds other cells). Jupyter refuses to start as root (the usual
# user in a GPU container) unless told --allow-root.
lab: $(SETUP)
	$(PYTHON) -m ipykernel install --sys-prefix --name cs336-systems --display-name "CS336 systems"
	cd notebooks && $(if $(findstring /,$(PYTHON)),$(abspath $(PYTHON)),$(PYTHON)) -m jupyter lab$(if $(filter 0,$(shell id -u)), --allow-root)

# After editing notebooks/NN_*.py outside JupyterLab: rewrite each NN_*.ipynb from its script, keeping
# the cell ids and metadata (a new NN_name.py gets its NN_name.ipynb). One direction on purpose:
# `jupytext --sync` takes the newer file of a pair, and a git checkout can make the .ipynb the newer.
# The other way, after changing an .ipynb outside JupyterLab: jupytext --to py:percent notebooks/NN_name.ipynb
sync-notebooks: $(SETUP)
	$(PYTHON) -m jupytext --update --to ipynb notebooks/[0-9][0-9]_*.py

CHROMIUM_FOUND = $(shell command -v chromium || command -v chromium-browser || command -v google-chrome)

pdf: $(SETUP)
	@if [ -z "$(CHROMIUM_FOUND)$(CHROMIUM)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make pdf: installing Chromium with apt-get"; apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "make pdf needs Chromium to print the HTML writeup: sudo apt-get install chromium (or set CHROMIUM=/path/to/chrome)"; exit 2; fi; \
	fi
	$(PYTHON) -m cs336_systems.report.pdf --profile $(PROFILE) $(if $(OUT),--out $(OUT))

# Wheels of everything the GPU nodes lack (papermill, nbconvert, jupyter bits, jupytext for the tests,
# transformers for the Llama reference, ninja for FlashAttention's C++ autograd node) for Python 3.12
# on x86-64 Linux;
# torch, triton, numpy, pandas, matplotlib and seaborn are expected on the node.
wheelhouse:
	python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --platform manylinux1_x86_64 --platform any -d $(WHEELHOUSE) $(OFFLINE_PACKAGES)
	@echo "wheels in $(WHEELHOUSE)/; on the node: make install-offline PYTHON=python3"

install-offline:
	$(PYTHON) -m pip install --quiet --no-index --find-links $(WHEELHOUSE) $(OFFLINE_PACKAGES)

clean:
	rm -rf reports/cpu reports/_scratch .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
