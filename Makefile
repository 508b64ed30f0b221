# Two entry points for a fresh machine: `make run` (the main job on the embedded tiny
# configuration) and `make test` (the test suite). Both create .venv and install the project
# from pyproject.toml first; the install is redone only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp

# Offline copies of datasets and tokenizers (see README). Override for another location.
SETDLM_DATA_DIR ?= $(abspath ../shared/data)
export SETDLM_DATA_DIR
# Nothing may be fetched from the Hugging Face Hub at run time on development machines.
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
# Tests run on both cores, each test module on one worker (its module fixtures built once);
# PARALLEL= (FAST_PARALLEL= for test-fast) runs them in one process.
PARALLEL ?= -n 2 --dist loadfile
FAST_PARALLEL ?= -n 2
# Python may cache bytecode here (pytest's rewritten tests among it, and the dependencies'
# modules, which the install leaves uncompiled: below), whatever the shell says.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install run rehearsal check reference reference-rehearsal reference-models test \
	test-fast test-e2e slow-tests lint bench bench-workflow clean

install: $(STAMP)

# --no-compile: pip would byte-compile all 21,000 modules of the dependencies (74 of the
# install's 111 CPU-seconds, AMD EPYC); importing every setdlm module and the test and workflow
# tools once compiles the 6,000 that the project uses instead (cached in __pycache__), so that
# the first command after an install does not pay for it (setdlm/util/warm_bytecode.py).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e .
	$(BIN)/python -m setdlm.util.warm_bytecode
	touch $(STAMP)

# The main job: the workflow's all_tables on the embedded tiny configuration (trains the four
# tiny families, runs every task, fills MLflow, writes results/tables/tiny and
# results/figures/tiny, all git-ignored: a clone stays clean). Resumable: rerun it after an
# interruption and it continues.
run: $(STAMP)
	$(BIN)/snakemake --profile workflows/profiles/local all_tables

# The paper's DAG rehearsed on this machine's CPU (workflows/config/paper-rehearsal.yaml):
# every rule, task, table and figure of paper.yaml through the code a cluster run uses, with the
# stand-in checkpoints in a Hugging Face cache of its own (HF_HOME, offline) and its data folder,
# both under results/rehearsal/ (git-ignored; rebuilt when their code changes). Resumable.
REHEARSAL_DIR := results/rehearsal
REHEARSAL_CONFIG := workflows/config/paper.yaml workflows/config/paper-rehearsal.yaml
rehearsal: $(REHEARSAL_DIR)/hf/standins.json $(REHEARSAL_DIR)/data/SHA256SUMS
	HF_HOME=$(abspath $(REHEARSAL_DIR)/hf) HF_HUB_OFFLINE=1 $(BIN)/snakemake \
	    --profile workflows/profiles/local all_tables --configfile $(REHEARSAL_CONFIG)

$(REHEARSAL_DIR)/hf/standins.json: $(STAMP) setdlm/checkpoints/standins.py setdlm/workflow/rehearsal.py
	$(BIN)/setdlm rehearsal cache --hf-home $(REHEARSAL_DIR)/hf

$(REHEARSAL_DIR)/data/SHA256SUMS: $(STAMP) setdlm/workflow/rehearsal.py
	$(BIN)/setdlm rehearsal data --out $(REHEARSAL_DIR)/data

# The committed reference outputs (results/reference/tiny/) replaced by this run's tables and
# figures: the one way they change. Commit them with the change that explains the difference;
# the regression baseline has its own command (README: setdlm check ... --write).
REFERENCE := results/reference/tiny
reference: run
	rm -rf $(REFERENCE)/tables $(REFERENCE)/figures
	mkdir -p $(REFERENCE)
	cp -r results/tables/tiny $(REFERENCE)/tables
	cp -r results/figures/tiny $(REFERENCE)/figures
	@echo "$(REFERENCE) now holds this run's tables and figures; review git diff, then commit"

# The rehearsal's committed outputs (results/reference/rehearsal/: its tables and figures, each
# naming the stand-ins) and the baseline CI holds its run through SLURM to
# (results/baselines/rehearsal.json: every quality and counted speed): the one way they change.
REHEARSAL_REFERENCE := results/reference/rehearsal
reference-rehearsal: rehearsal
	rm -rf $(REHEARSAL_REFERENCE)
	mkdir -p $(REHEARSAL_REFERENCE)
	cp -r results/tables/paper-rehearsal $(REHEARSAL_REFERENCE)/tables
	cp -r results/figures/paper-rehearsal $(REHEARSAL_REFERENCE)/figures
	$(BIN)/setdlm check --baseline results/baselines/rehearsal.json \
	    results/runs/paper-rehearsal --write
	@echo "$(REHEARSAL_REFERENCE) and results/baselines/rehearsal.json rewritten; review, commit"

# The CI regression check of the decoder (a few minutes, no training, no network): the
# default's evaluation points decoded with the committed reference models
# (results/reference/models/) against results/baselines/decoding.json; then the engine's time
# per step relative to the backbone's against results/baselines/engine_speed.json (coarse: 1.5x).
check: $(STAMP)
	$(BIN)/setdlm check-decoding
	$(BIN)/setdlm check-speed

# The reference models the default evaluates, trained from scratch by the same DAG with the
# default's recipe (the overlay turns the reuse off and records learning curves), then copied
# into results/reference/models/ (each with its learning curve: make reference tabulates and draws
# them beside the reference tables). Commit
# them with the change that explains the difference; `make check` needs a new baseline after
# (setdlm check-decoding --write).
REFERENCE_MODELS := results/reference/models
TRAIN_RUN := results/runs/tiny-train
reference-models: $(STAMP)
	$(BIN)/snakemake --profile workflows/profiles/local all_models learning_curves \
	    --configfile workflows/config/tiny.yaml workflows/config/tiny-train.yaml
	$(BIN)/setdlm check-training $(TRAIN_RUN)/models \
	    || echo "make reference-models: the new trainings left the reference seeds' spread (above)"
	$(BIN)/setdlm export-references $(TRAIN_RUN)/models --out $(REFERENCE_MODELS)
	@echo "make reference-models: now make reference (the tables, figures and learning curves)"

# The test suite but its end-to-end tier (below). pytest exits 5 when it collects no tests:
# that is a broken suite, not a pass.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not e2e" $(PARALLEL) --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; \
	exit $$rc
# The end-to-end tier: the fault injection on the main job's DAG (its quick overlay, run once,
# then disturbed and recovered group by group), the MLflow UI in a browser (on make run's store
# when there is one), a real MLflow server, the wheel in a scratch environment, the
# whole-workflow tests (shards, a reduced workflow in a results folder with a space, dry runs),
# the check across CPU capabilities, the GPU-sized smokes (the GPU check on the CPU, the
# real-size decode) and, given a cluster, the SLURM test; on both cores, each module on one
# worker. .ci/run runs it after make run.
# E2E_MARK and E2E_ARGS narrow it, e.g. E2E_ARGS=tests/test_shards.py.
# The modules start in the order tests/conftest.py gives (the SLURM test, which mostly waits,
# first, then the longest modules, the short ones last), not by test count.
E2E_MARK ?= e2e
E2E_ARGS ?=
test-e2e: $(STAMP)
	$(BIN)/python -m pytest -q -m "$(E2E_MARK)" $(PARALLEL) --no-loadscope-reorder --durations=20 \
	    $(E2E_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; \
	exit $$rc

# The fast tier: the tests that need neither the trained tiny models nor a subprocess run of
# the workflow, on both cores; `make test` runs everything but the end-to-end tier.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow and not e2e" $(FAST_PARALLEL)

# Rewrites tests/slow_tests.txt: the fast tier measured, each test of 0.05 s or more marked slow
# (tests/slow_tests.py THRESHOLD_S).
slow-tests: $(STAMP)
	$(BIN)/python tests/slow_tests.py

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/setdlm bench decode

# The default's workflow from nothing in a scratch folder (the reference models copied), then
# where its time went: seconds per stage, job and point (setdlm/recipes/bench_workflow.py).
bench-workflow: $(STAMP)
	$(BIN)/setdlm bench workflow --fresh

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
