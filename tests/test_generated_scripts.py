"""Nothing a recipe says is run by a file grpo-launch generates (issue 15 §1).

Every free-text field of the schema gets a hostile value (command substitutions, quotes, separators, globs, markup)
whose payload would create a canary file; every generated file of every placement and scheduler is then checked with
`bash -n` and shellcheck, and the scripts are run for real under `bash -x` with the commands they start replaced by
stubs that record their argv. The canary must never appear, and each process must receive exactly the argv and
environment of its plan. The fields that are not free text are refused with exit 2 when given such a value
(test_hostile_values_are_refused): names and scheduler fields by their form, every value with a control character.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from conftest import grpo

from grpo_launch.cli import main
from grpo_launch.compose import compose, schema
from grpo_launch.contracts import hosts, schedulers
from grpo_launch.contracts.plan import Plan
from grpo_launch.plan import build_plan
from grpo_launch.plan.documents import document_text
from grpo_launch.plan.launch_script import command_line

# Free-text keys that no generated script may execute: each gets the hostile value (or a list/map holding it).
HOSTILE_KEYS = {
    "model.name_or_path", "model.revision", "model.attn_implementation", "cluster.gpu_type", "data.path",
    "data.config", "data.split", "data.eval", "data.prompt_column", "data.answer_column", "data.system_prompt",
    "description", "vllm.extra_args", "lora.target_modules", "run.root", "run.dir", "env.set",
    "scheduler.slurm.sbatch", "trainer", "rewards",
}
# Keys that take text but are not set hostile here, and why.
NOT_HOSTILE = {
    "scheduler.setup": "shell by design: run as written (checked below to run exactly that)",
    "cluster.hosts": "addresses: checked to be hostnames or IP addresses (issue 15 §4)",
    "placement.async_lora.proxy.host": "an address: checked to be a hostname or IP address (issue 15 §4)",
    "placement.kind": "a placement's name: one of the placements, chosen with placement=NAME",
    **{f"scheduler.hf_jobs.{key}": "scheduler=hf-jobs checks its forms at plan time (plan/schedulers/hf_jobs.py: "
                                   "names, namespace/name, an absolute path, a duration, image references, the "
                                   "library's flavors, variable names)"
       for key in ("namespace", "secrets", "bucket", "mount_path", "timeout", "image.trainer", "image.vllm",
                   "flavor.trainer", "flavor.vllm")},
}


def hostile(canary: Path) -> str:
    """A value that creates `canary` if any shell ever evaluates it instead of passing it on as one word."""
    touch = f"touch {canary}"
    return (f"x $({touch}) `{touch}` ; {touch} && {touch} | {touch} & {touch}; '\" \\ * ? ~ ! # % > {canary}.out "
            f"< /dev/null {{a,b}} $HOME ${{HOME}} [bold]markup é --flag")


def _text_keys() -> list[tuple[str, dict]]:
    """Every schema key whose value holds text, with its metadata."""
    out = []
    for key, tp, _, meta in schema.schema_keys():
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        origin = typing.get_origin(args[0]) or args[0]
        if args[0] is str or origin in (list, dict):
            out.append((key, meta))
    return out


def test_every_text_key_is_hostile_here_or_refused_by_its_form():
    """A new free-text key must be added to HOSTILE_KEYS (or given a form): nothing slips through unchecked."""
    unclassified = [key for key, meta in _text_keys() if key not in HOSTILE_KEYS and key not in NOT_HOSTILE
                    and not meta.get("form") and not meta.get("choices") and key != "rewards"]
    assert unclassified == []


def _replaced(obj, path: list[str], value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replaced(getattr(obj, path[0]), path[1:], value)})


def hostile_plan(canary: Path, marker: Path, *overrides: str) -> tuple[Plan, str]:
    """The plan of a recipe with every hostile key set, its shell setup writing `marker`; and the hostile value."""
    h = hostile(canary)
    composed = compose(list(overrides))
    config = composed.config
    values = {
        "model.name_or_path": h, "model.revision": h, "model.attn_implementation": h, "cluster.gpu_type": h,
        "data.path": h + ".jsonl", "data.config": h, "data.split": h, "data.eval": h + ".jsonl",
        "data.prompt_column": h, "data.answer_column": h,
        "data.system_prompt": h + "\nand a second line", "description": h, "vllm.extra_args": [h, f"--x={h}"],
        "lora.target_modules": [h], "run.root": h, "run.dir": h, "env.set": {"GRPO_HOSTILE": h},
        "scheduler.slurm.sbatch": [f"--comment={h}"], "trainer": {**config.trainer, "output_dir": h, "run_name": h},
        "rewards": [dataclasses.replace(config.rewards[0], fn=f"{h}/rewards.py:score")],  # a module-named file
        "scheduler.setup": [f"echo 'setup ran as written' > {marker}"],
    }
    if config.placement.kind == "async-lora":
        values.pop("model.attn_implementation")  # async-lora takes sdpa or null only (a choice)
        values.pop("data.eval")  # TRL's async trainer cannot evaluate: refused for async-lora
    if config.scheduler.kind == "skypilot":
        values.pop("cluster.gpu_type")  # written as SkyPilot's accelerators: checked by that form
    data_source = dataclasses.replace(config.data, source="files")
    config = dataclasses.replace(config, data=data_source)
    for key, value in values.items():
        config = _replaced(config, key.split("."), value)
    return build_plan(dataclasses.replace(composed, config=config)), h


STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
name = os.path.basename(sys.argv[0])
if name == "scontrol" and sys.argv[1:3] == ["show", "hostnames"]:
    print("\\n".join(os.environ["STUB_NODES"].split()))
elif name == "scontrol" and sys.argv[1:3] == ["show", "node"]:
    print(f"NodeName={{sys.argv[3]}} NodeAddr=10.0.0.{{os.environ['STUB_NODES'].split().index(sys.argv[3])}}")
"""
STUBBED = ("setsid", "python", "python3", "srun", "scontrol", "sky", "sbatch")


@pytest.fixture
def stubs(tmp_path):
    """A PATH whose commands record their argv in a log instead of running."""
    bin_dir = tmp_path / "stubs"
    bin_dir.mkdir()
    for name in STUBBED:
        (bin_dir / name).write_text(STUB.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "stub.log"

    def run(argv: list[str], cwd: Path, **env: str) -> list[list[str]]:
        log.write_text("")
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(log), "HOME": str(cwd),
                                   **env})
        assert done.returncode == 0, done.stdout + done.stderr
        return [json.loads(line) for line in log.read_text().splitlines()]
    return run


def shellcheck(path: Path) -> None:
    if shutil.which("shellcheck") is None:  # a failure in CI (conftest: GRPO_NO_SKIPS)
        pytest.skip("shellcheck is not installed (`make test` installs it: apt-get install shellcheck)")
    done = subprocess.run(["shellcheck", "--shell=bash", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def bash_n(path: Path) -> None:
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def started(plan: Plan, node: int) -> list[list[str]]:
    """What launch.sh must hand each process of `node`: exactly its plan's environment and argv."""
    return [["setsid", *(["env", *(f"{k}={v}" for k, v in p.env.items())] if p.env else []), *p.argv]
            for p in plan.processes if p.node == node]


VARIANTS = {
    "colocate-local": ("recipe=tiny-cpu-colocate",),
    "server-slurm": ("recipe=tiny-cpu-server", "scheduler=slurm", "cluster.nodes=2"),
    "async-lora-skypilot": ("recipe=tiny-cpu-async-lora", "scheduler=skypilot",
                            "placement.async_lora.proxy.api_key_env=GRPO_PROXY_KEY"),
    "server-skypilot-gpus": ("recipe=qwen7b-server", "scheduler=skypilot", "cluster.nodes=2",
                             "scheduler.skypilot.accelerators=H100:8"),
    "colocate-slurm-gpus": ("recipe=qwen72b-colocate", "scheduler=slurm"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_hostile_values_reach_every_process_as_one_word_and_run_nothing(variant, tmp_path, stubs):
    canary, marker = tmp_path / "canary", tmp_path / "setup-marker"
    plan, h = hostile_plan(canary, marker, *VARIANTS[variant])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    texts = {name: document_text(name, doc) for name, doc in plan.files.items()}
    for name, text in texts.items():
        write(run_dir, name, text)
    # accelerate.yaml as a user would run it by hand: an address known only where the job runs stays out
    accelerate = {k: v for k, v in plan.files["accelerate.yaml"].items() if not hosts.variables_in(v)}
    assert yaml.safe_load(texts["accelerate.yaml"]) == accelerate and "${" not in texts["accelerate.yaml"]

    # launch.sh: each node starts exactly its processes, every value one word.
    launch = run_dir / "launch.sh"
    bash_n(launch)
    shellcheck(launch)
    addresses = {f"GRPO_HOST_{k}": f"10.0.0.{k}" for k in range(plan.nodes)}  # what a cluster's nodes export
    for node in range(plan.nodes):
        calls = stubs(["bash", "-x", str(launch)], run_dir, NODE_RANK=str(node), GRPO_PROXY_KEY="k" * 16,
                      GRPO_VLLM_API_KEY="v" * 16, **addresses)
        # (sorted: the processes start in the background, so their stubs log in any order)
        assert sorted(c for c in calls if c[0] == "setsid") == sorted(started(plan.with_addresses(addresses), node))
        resolved = plan.with_addresses(addresses)
        servers = {p.name: p for p in resolved.processes}
        assert [c[2:] for c in calls if c[0] == "python3"] == [  # wait_ready: URL, timeout, the key's variable
            [servers[d].ready_url, f"{servers[d].ready_timeout_s:g}", servers[d].probe_key_env or ""]
            for p in resolved.processes for d in p.depends_on]

    if "job.sbatch" in texts:  # the batch script as sbatch would run it, srun and scontrol stubbed
        job = run_dir / "job.sbatch"
        bash_n(job)
        shellcheck(job)
        assert f"#SBATCH --comment={h}\n" in texts["job.sbatch"]  # written as given: sbatch reads it, no shell
        nodes = " ".join(f"n{k}" for k in range(plan.nodes))
        calls = stubs(["bash", "-x", str(job)], run_dir, SLURM_SUBMIT_DIR=str(run_dir), SLURM_JOB_NODELIST="n[0-9]",
                      STUB_NODES=nodes)
        steps = [c for c in calls if c[0] == "srun"]
        assert steps and all(c[-3:-1] == ["bash", "-c"] for c in steps)
        step_command = steps[0][-1]  # what each node's step runs: the supervisor for that node's index
        for k in range(plan.nodes):
            calls = stubs(["bash", "-c", step_command], run_dir, GRPO_NODE_NAMES=nodes, SLURMD_NODENAME=f"n{k}")
            assert calls == [["python", "-m", "grpo_launch.launch", "--run-dir", ".", "--node", str(k)]]

    if "task.yaml" in texts:  # the SkyPilot task's setup and run, as SkyPilot runs them on a node
        task = yaml.safe_load(texts["task.yaml"])
        assert task == plan.files["task.yaml"]
        run = write(run_dir, "run.sh", "#!/bin/bash\n" + task["run"])
        bash_n(run)
        shellcheck(run)
        ips = "".join(f"10.0.0.{k}\n" for k in range(plan.nodes))
        calls = stubs(["bash", "-x", str(run)], run_dir, SKYPILOT_NODE_RANK="0", SKYPILOT_NODE_IPS=ips)
        assert calls == [["python", "-m", "grpo_launch.launch", "--run-dir", ".", "--node", "0"]]
        setup = write(run_dir, "setup.sh", task["setup"])
        bash_n(setup)
        stubs(["bash", "-x", str(setup)], run_dir)
    if "job.sbatch" in texts or "task.yaml" in texts:
        assert marker.read_text() == "setup ran as written\n"  # scheduler.setup is shell by design
    assert not canary.exists() and not Path(f"{canary}.out").exists()


@pytest.mark.parametrize("variant", ["server-slurm", "async-lora-skypilot"])
def test_the_plan_view_shows_every_command_as_launch_sh_runs_it(variant, tmp_path):
    """The commands `grpo plan` prints are the quoted ones launch.sh runs, markup shown as text; setup and extra
    sbatch options are shown apart, as run as written."""
    from rich.console import Console

    from grpo_launch.cli.plan_view import print_plan

    plan, h = hostile_plan(tmp_path / "canary", tmp_path / "marker", *VARIANTS[variant])
    out = io.StringIO()
    print_plan(plan, console=Console(file=out, width=100_000, highlight=False))
    text = out.getvalue()
    for p in plan.processes:
        assert command_line(p) in text
        assert command_line(p) in plan.files["launch.sh"]
    assert "as written in " in text and "scheduler.setup: echo 'setup ran as written'" in text
    if variant == "server-slurm":
        assert f"scheduler.slurm.sbatch: --comment={h}" in text


def test_the_printed_submit_command_runs_in_a_hostile_run_directory(tmp_path, stubs):
    """`grpo run` without SkyPilot installed says how to launch: that line, pasted into a shell, runs `sky launch`
    in the run directory, whatever its name."""
    canary = tmp_path / "canary"
    run_dir = tmp_path / f"run $(touch {canary}) '; touch {canary}"
    result = grpo("run", "recipe=tiny-cpu", "scheduler=skypilot", f"run.dir={_quoted(str(run_dir))}",
                  env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "COLUMNS": "100000"}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [ln.strip() for ln in result.stdout.splitlines() if "sky launch" in ln]
    calls = stubs(["bash", "-c", line], tmp_path)
    cluster = schedulers.skypilot_cluster("tiny-cpu", run_dir)  # the run's own (issue 27, 13)
    assert calls == [["sky", "launch", "--yes", "--cluster", cluster, "--down", "task.yaml"]]
    assert (run_dir / "task.yaml").is_file() and not canary.exists()


def _quoted(text: str) -> str:
    """A Hydra override value: single-quoted, with its quotes and backslashes escaped."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


HOSTILE_REFUSED = [
    # environment variable names, unquoted in `env NAME=value` and `export NAME`
    ("# @package _global_\nenv:\n  set:\n    '$(touch /tmp/grpo-canary)': '1'\n",
     "'env.set.$(touch /tmp/grpo-canary)' takes an environment variable name"),
    ("# @package _global_\nenv:\n  passthrough: [\"HF_TOKEN\\nrm -rf x\"]\n", "'env.passthrough[0]' holds the control"),
    ("# @package _global_\nenv:\n  passthrough: ['A B']\n", "'env.passthrough[0]' takes an environment variable name"),
    ("# @package _global_\nplacement:\n  async_lora:\n    proxy:\n      api_key_env: 'KEY;x'\n",
     "'placement.async_lora.proxy.api_key_env' takes an environment variable"),
    # scheduler fields: one token of what the scheduler accepts, no line break
    ("# @package _global_\nscheduler:\n  slurm:\n    partition: \"gpu\\ntouch /tmp/x\"\n",
     "'scheduler.slurm.partition' holds the control character '\\n'"),
    ("# @package _global_\nscheduler:\n  slurm:\n    partition: 'gpu --wrap=x'\n",
     "'scheduler.slurm.partition' takes Slurm names separated by commas"),
    ("# @package _global_\nscheduler:\n  slurm:\n    account: 'a;b'\n", "'scheduler.slurm.account' takes a Slurm name"),
    ("# @package _global_\nscheduler:\n  slurm:\n    qos: 'high $(x)'\n", "'scheduler.slurm.qos' takes a Slurm name"),
    ("# @package _global_\nscheduler:\n  slurm:\n    time_limit: '1 day'\n",
     "'scheduler.slurm.time_limit' takes a Slurm time limit"),
    ("# @package _global_\nscheduler:\n  slurm:\n    gres: 'gpu:`x`'\n", "'scheduler.slurm.gres' takes Slurm generic"),
    ("# @package _global_\nscheduler:\n  slurm:\n    sbatch: ['--mem=0', 'touch /tmp/x']\n",
     "'scheduler.slurm.sbatch[1]' takes one sbatch option per item"),
    ("# @package _global_\nscheduler:\n  slurm:\n    sbatch: [\"--mem=0\\ntouch /tmp/x\"]\n",
     "'scheduler.slurm.sbatch[0]' holds the control character"),
    ("# @package _global_\nscheduler:\n  setup: [\"module load x\\n\"]\n", "'scheduler.setup[0]' holds the control"),
    ("# @package _global_\nscheduler:\n  skypilot:\n    cluster_name: 'my cluster'\n",
     "'scheduler.skypilot.cluster_name' takes a SkyPilot cluster and task name"),
    ("# @package _global_\nscheduler:\n  skypilot:\n    cloud: 'aws; x'\n",
     "'scheduler.skypilot.cloud' must be one of"),
    ("# @package _global_\nscheduler:\n  skypilot:\n    accelerators: 'H100:8 x'\n",
     "'scheduler.skypilot.accelerators' takes SkyPilot accelerators"),
    # control characters in any value: a line break, a carriage return, an escape, a NUL, Unicode's line separator
    ("# @package _global_\nvllm:\n  extra_args: [\"--x\\n--y\"]\n", "'vllm.extra_args[0]' holds the control"),
    ("# @package _global_\nmodel:\n  name_or_path: \"org/m\\rx\"\n", "'model.name_or_path' holds the control"),
    ("# @package _global_\ndescription: \"\\e[31mred\"\n", "'description' holds the control character '\\x1b'"),
    ("# @package _global_\nenv:\n  set:\n    A: \"x\\0y\"\n", "'env.set.A' holds the control character '\\x00'"),
    ("# @package _global_\nrun:\n  root: \"runs\\u2028x\"\n", "'run.root' holds the control character '\\u2028'"),
]


@pytest.mark.parametrize(("body", "message"), HOSTILE_REFUSED, ids=[m for _, m in HOSTILE_REFUSED])
def test_hostile_values_are_refused(tmp_path, body, message, capsys):
    d = tmp_path / "mine"
    (d / "recipe").mkdir(parents=True)
    (d / "recipe" / "mine.yaml").write_text(body)
    assert main(["plan", "recipe=mine", "--recipes-dir", str(d)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


HOSTILE_PLANS = [
    (["scheduler=skypilot", "cluster.accelerator=cuda", "cluster.gpus_per_node=4", "cluster.gpu_type='H100 $(x)'"],
     "resources.accelerators 'H100 $(x):4' (cluster.gpu_type:cluster.gpus_per_node) is not SkyPilot accelerators"),
    (["scheduler=skypilot", "scheduler.skypilot.cloud=mars"], "'scheduler.skypilot.cloud' must be one of"),
]


@pytest.mark.parametrize(("overrides", "message"), HOSTILE_PLANS, ids=[m[:40] for _, m in HOSTILE_PLANS])
def test_scheduler_fields_from_elsewhere_are_refused(overrides, message, capsys):
    assert main(["plan", *overrides]) == 2
    assert message in capsys.readouterr().err


def test_a_recipe_name_that_is_not_a_name_is_refused(tmp_path, capsys):
    d = tmp_path / "mine"
    (d / "recipe").mkdir(parents=True)
    (d / "recipe" / "my recipe;x.yaml").write_text((Path(__file__).parents[1] / "recipes" / "recipe" /
                                                     "tiny-cpu.yaml").read_text())
    assert main(["plan", "recipe='my recipe;x'", "--recipes-dir", str(d)]) == 2
    assert "recipe name 'my recipe;x'" in capsys.readouterr().err


def test_skypilot_knows_the_clouds_and_names_we_check():
    """The SkyPilot forms grpo-launch checks are SkyPilot's own (its pinned version, in the Makefile's venv)."""
    from test_skypilot import SKY_PYTHON

    if not SKY_PYTHON.exists():  # a failure in CI (conftest: GRPO_NO_SKIPS)
        pytest.skip(f"SkyPilot is not installed at {SKY_PYTHON}")
    code = ("import json; from sky.skylet import constants; from sky import task; "
            "print(json.dumps([constants.ALL_CLOUDS, constants.CLUSTER_NAME_VALID_REGEX, task._VALID_NAME_REGEX]))")
    done = subprocess.run([str(SKY_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    clouds, cluster_regex, task_regex = json.loads(done.stdout.strip().splitlines()[-1])
    assert tuple(clouds) == schedulers.SKYPILOT_CLOUDS
    for name in ("grpo-tiny-cpu", "a", "a.b_c--d", "A1", "a__b"):
        assert schedulers.SKYPILOT_NAME.fits(name)
        assert re.fullmatch(cluster_regex, name) and re.fullmatch(task_regex, name)
    for name in ("1a", "a-", "-a", "a b", "a---b", "a.", "_a"):
        assert not schedulers.SKYPILOT_NAME.fits(name)
        assert not (re.fullmatch(cluster_regex, name) and re.fullmatch(task_regex, name))


SLURM_FORMS = [  # (form, values sbatch(1) documents, values that are not one option's value)
    (schedulers.SLURM_NAMES, ["gpu", "gpu,cpu", "a100-80gb.q"], ["gpu cpu", "gpu,", "$(x)", "gpu;x", ""]),
    (schedulers.SLURM_NAME, ["proj-1", "high", "my_account.x"], ["a b", "a,b", "`x`", ""]),
    (schedulers.SLURM_TIME, ["0", "90", "30:00", "12:00:00", "2-00", "2-12:30", "2-12:30:00", "UNLIMITED"],
     ["1 day", "1h", "2-", ":30", "-1"]),
    (schedulers.SLURM_GRES, ["gpu", "gpu:8", "gpu:h100:8", "gpu:h100:8,nic:1"], ["gpu:h100:8:1", "gpu 8", "gpu:$(x)"]),
    (schedulers.SBATCH_OPTION, ["--mem=0", "#SBATCH --constraint=h100", "-C h100"], ["mem=0", "touch /tmp/x"]),
]


@pytest.mark.parametrize(("form", "accepted", "refused"), SLURM_FORMS, ids=[f.what[:30] for f, _, _ in SLURM_FORMS])
def test_slurm_forms(form, accepted, refused):
    assert [v for v in accepted if not form.fits(v)] == []
    assert [v for v in refused if form.fits(v)] == []


@pytest.mark.parametrize("command", ["plan", "run", "rehearse"])
def test_help_says_what_runs_as_written(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"grpo {command} [OPTIONS] [recipe=NAME | RECIPE.yaml] [KEY=VALUE]..." in out  # a recipe file works in all
    assert "except scheduler.setup (shell commands) and scheduler.slurm.sbatch (sbatch options), which run as " \
           "written" in out
