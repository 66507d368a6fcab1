import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from no_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (CI: a skip is a failure)

ROOT = Path(__file__).resolve().parents[1]
# DeepSpeed compiles ops on first use; keep them where every test (and CI's later steps) finds them.
RUN_ENV = {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),
           "COLUMNS": "200"}


@pytest.fixture(autouse=True)
def isolated_config_home(tmp_path, tmp_path_factory, monkeypatch):
    """Keep the developer's ~/.config/grpo-launch, composition cache and $GRPO_RECIPES_PATH out of every test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.mktemp("compose-cache")))
    # Built tiny models are kept for the whole session, as between a user's runs (about 9 s a build here).
    monkeypatch.setenv("GRPO_MODEL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "prepared"))
    monkeypatch.delenv("GRPO_MODEL_CACHE", raising=False)
    # `import trl` (tests import it in-process) sets VLLM_LOGGING_LEVEL=ERROR in os.environ when vLLM is installed
    # (trl/_compat.py), which every process a test starts would inherit: keep vLLM's servers logging as they do for
    # a user, whose `grpo run` never imports TRL.
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("GRPO_RECIPES_PATH", raising=False)
    # pytest-xdist's workers set COLUMNS=80 and LINES=24, which the processes a test starts would take for a terminal
    # of that size: give them a pipe's environment, as a user's CI has (RUN_ENV sets a width where a test wants one).
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def free_port(span: int = 1) -> int:
    """A port nothing listens on right now, on 127.0.0.1, nor on the `span - 1` ports after it."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span <= 65536 and all(_free(p) for p in range(port + 1, port + span)):
            return port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# The ports a run listens on: free ones for each test, so that tests run side by side (the slow suite runs on two
# workers) never collide on the recipes' defaults (torch's 29500, vLLM's 8000 and on, the proxy's 8080).
PORT_KEYS = {"run.main_process_port": 1, "vllm.port": 4, "placement.async_lora.proxy.port": 1}


def free_ports(*overrides: str) -> tuple[str, ...]:
    """Overrides giving a run free ports for every key of PORT_KEYS that `overrides` leave at the recipe's."""
    return tuple(f"{key}={free_port(span)}" for key, span in PORT_KEYS.items()
                 if not any(o.startswith(f"{key}=") for o in overrides))


def grpo(*args: str, env: dict | None = None, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real `grpo` console entry point in a subprocess."""
    return subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def grpo_run(tmp_path, *overrides, env=None, timeout=600) -> tuple[subprocess.CompletedProcess, Path | None]:
    """`grpo run` under tmp_path/runs: its result and the run directory it names; free ports (free_ports) where the
    test sets none."""
    overrides = (*overrides, *free_ports(*overrides))
    result = subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
                             f"run.root={tmp_path / 'runs'}", *overrides], capture_output=True, text=True,
                            env={**os.environ, **RUN_ENV, **(env or {})}, cwd=tmp_path, timeout=timeout)
    match = re.search(r"run directory:? (\S+)", result.stdout)
    return result, Path(match.group(1)) if match else None


def plan_json(*overrides: str) -> dict:
    from grpo_launch.compose import compose
    from grpo_launch.plan import build_plan

    return json.loads(json.dumps(build_plan(compose(list(overrides))).to_json()))


def replanned(composed, *, model=None, dtype=None, nodes=None, zero=None, trainer=None, sleep_level=None, **vllm):
    """`composed` with the typed config's fields replaced (no Hydra), planned: model name and dtype, cluster nodes,
    zero as (stage, offload_optimizer, offload_param), trainer.* added, colocate's sleep level, vllm.* keys
    replaced."""
    from dataclasses import replace

    from grpo_launch.plan import build_plan

    c = composed.config
    model_changes = {k: v for k, v in (("name_or_path", model), ("dtype", dtype)) if v is not None}
    placement = c.placement if sleep_level is None else \
        replace(c.placement, colocate=replace(c.placement.colocate, sleep_level=sleep_level))
    config = replace(c, model=replace(c.model, **model_changes), vllm=replace(c.vllm, **vllm), placement=placement,
                     cluster=replace(c.cluster, nodes=nodes or c.cluster.nodes),
                     trainer={**c.trainer, **(trainer or {})})
    if zero is not None:
        config = replace(config, zero=replace(c.zero, stage=zero[0], offload_optimizer=zero[1], offload_param=zero[2]))
    composed = replace(composed, config=config)
    return composed, build_plan(composed)



class SmallDisks:
    """Real file systems of a few hundred KiB (tmpfs, mounted: the tests run as root), to fill up under a run: a
    write that does not fit fails with ENOSPC, as on a full disk. Each is unmounted when the test ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted: list[Path] = []

    def __call__(self, kib: int) -> Path:
        path = self.root / f"disk{len(self.mounted)}"
        path.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)], check=True)
        self.mounted.append(path)
        return path

    def grow(self, path: Path, kib: int) -> None:
        """Room again, its files kept (a user freed space)."""
        subprocess.run(["mount", "-o", f"remount,size={kib}k", str(path)], check=True)

    def unmount(self) -> None:
        for path in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    disks = SmallDisks(tmp_path / "disks")
    yield disks
    disks.unmount()
