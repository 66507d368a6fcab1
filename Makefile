# A newcomer needs two commands: `make run` and `make test`. Every target sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# DeepSpeed JIT-compiles ops on first use (~20 s, ~35 s for cpu_adam); keep them where later runs find them.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: it is the CPU wheel on disk; anything else downloads CUDA builds.
	$(BIN)/pip install -q -c constraints/cpu.txt torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q -c constraints/cpu.txt -e '.[train,deepspeed,dev]'
	touch $@

.PHONY: setup run test bench lint
setup: $(STAMP)

run: $(STAMP)
	$(BIN)/grpo run

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/plan_time.py
	$(BIN)/python benchmarks/run_overhead.py
	$(BIN)/python benchmarks/proxy_bench.py

lint: $(STAMP)
	$(BIN)/ruff check grpo_launch tests benchmarks
