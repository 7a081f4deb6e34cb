# Two commands on a fresh machine: `make run` and `make test` (see README).
PYTHON ?= python3
VENV ?= .venv
# CPU build of torch from the local wheel; GPU machines: make TORCH_SPEC=torch ...
TORCH_SPEC ?= torch==2.13.0+cpu
BIN := $(VENV)/bin

# No network at run time, no telemetry.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export GX_ANALYTICS_ENABLED := False
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export TOKENIZERS_PARALLELISM := false
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Each of the pipeline's ~120 stages is a fresh Python process: let them keep the byte code of xmc/ and stages/
# (.gitignore and .dvcignore leave __pycache__ out of git and of the stages' dependency hashes).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run lab select seeds ablations test report push pull serve scale-bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

# The linear one-vs-all peer (PECOS XR-Linear) needs numpy < 2 and scipy < 1.14: its own small environment.
# libpecos without its optional deep-learning dependencies (XR-Linear uses none of them).
PECOS_VENV ?= .venv-pecos
$(PECOS_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(PECOS_VENV)
	$(PECOS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PECOS_VENV)/bin/python -m pip install -q "numpy>=1.24,<2" "scipy>=1.10,<1.14" "scikit-learn>=1.3,<1.6" \
		"pydantic>=2,<3" "pyyaml>=6" "tqdm>=4"
	$(PECOS_VENV)/bin/python -m pip install -q --no-deps "libpecos==1.2.8"
	touch $@

.dvc/config: | $(VENV)/.installed
	@if git rev-parse --git-dir >/dev/null 2>&1; then $(BIN)/dvc init -q; else $(BIN)/dvc init -q --no-scm; fi
	$(BIN)/dvc config core.analytics false

# DVC's cache holds each output once and the workspace links to it (a copy only where the file system cannot link):
# DVC's default copies every output into the cache, a second copy of every model on disk.
.dvc/config.local: .dvc/config
	$(BIN)/dvc config --local cache.type hardlink,symlink,copy

# the two environments install side by side (each pip mostly waits on downloads and unpacking, one core each)
setup:
	@$(MAKE) --no-print-directory -j2 $(VENV)/.installed $(PECOS_VENV)/.installed
	@$(MAKE) --no-print-directory .dvc/config.local

# The product pipeline (dvc.yaml): data, validation, features, one run of every method and peer, their packages,
# hybrids and the comparison report, all under results/<data.name>/. DATASET=debian-relations (a folder, or a name
# under DATASETS_ROOT) first sets data.dataset_dir and data.name in params.yaml; each dataset keeps its own folder.
DATASETS_ROOT ?= ../shared/datasets
# the current dataset's outputs (params.yaml data.name), read when a recipe runs
RESULTS = results/$$($(BIN)/python -m xmc.config.use_dataset --show-name)
run: setup
	@if [ -n "$(DATASET)" ]; then $(BIN)/python -m xmc.config.use_dataset "$(DATASET)" --root "$(DATASETS_ROOT)"; fi
	$(BIN)/dvc repro
	@echo
	@cat $(RESULTS)/reports/comparison.md
	@echo "Validation report: $(RESULTS)/reports/validation/report.html   Comparison: $(RESULTS)/reports/comparison.html"
	@echo "Model packages: $(RESULTS)/packages/<name>/  (xmc info astra; xmc predict astra --input texts.txt; xmc serve astra)"

# The model packages to and from the DVC remote (default: ../xmc-dvc-remote; see README "Registry"):
# after `make pull` a fresh clone predicts without training.
push: setup
	$(BIN)/dvc push package fuse

pull: setup
	$(BIN)/dvc pull package fuse

# The HTTP service of one package (MODEL=astra by default) on 127.0.0.1:8000
MODEL ?= astra
serve: setup
	$(BIN)/xmc serve $(MODEL)

# The lab (lab/dvc.yaml, lab/params.yaml): selection candidates, the papers' ablations, other training seeds and the
# rows the product dropped, each trained and evaluated on the product's data, and their reports in
# lab/results/<data.name>/reports/ (hours on 2 cores; it reads the product's outputs, so it runs `make run`'s stages
# first where they are missing).
LAB_REPORTS = lab/$(RESULTS)/reports
lab: setup
	$(BIN)/dvc repro lab/dvc.yaml
	@echo
	@cat $(LAB_REPORTS)/selection.md | head -40
	@echo "Reports: $(LAB_REPORTS)/selection.md, ablations.md, seeds.md"

# Every hand-picked setting decided on the validation split -> lab/results/<data.name>/reports/selection.{md,html,json}
select: setup
	$(BIN)/dvc repro lab/dvc.yaml:selection
	@echo
	@cat $(LAB_REPORTS)/selection.md

# The papers' ablations, each against its control, and the rows the product dropped -> .../reports/ablations.*
ablations: setup
	$(BIN)/dvc repro lab/dvc.yaml:report_ablations
	@echo
	@cat $(LAB_REPORTS)/ablations.md

# Seed variation of the bag-of-words methods -> .../reports/seeds.md
seeds: setup
	$(BIN)/dvc repro lab/dvc.yaml:report_seeds
	@echo
	@cat $(LAB_REPORTS)/seeds.md

# test files run on TEST_WORKERS processes (pytest-xdist; a file's tests stay together, they share fixtures),
# in tests/conftest.py's order: the slowest files first (--no-loadscope-reorder keeps that order)
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# the pipeline's cost curve on synthetic data, 10^4 to 10^6 labels (hours; a lab benchmark, not part of run or
# test): lab/bench/scale.json, lab/bench/scale.png. SIZES=1e4,1e5 for a shorter curve
SIZES ?= 1e4,1e5,1e6
scale-bench: setup
	$(BIN)/python -m lab.bench.scale --sizes $(SIZES)

report: setup
	@cat $(RESULTS)/reports/comparison.md
