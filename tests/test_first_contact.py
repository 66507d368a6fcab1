"""What a new user meets first: output a person can read in a pipe, a compact plan, CPU plans in CPU words, a recipe
file by its path, `grpo recipes show` as users type it, a sweep summary that adds up, and generated files that say
what they need (issue 19, "First contact")."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import plan_json

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.plan import build_plan
from grpo_launch.plan.documents import document_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def piped(monkeypatch):
    """Output as in CI or `grpo ... | less`: not a terminal (pytest captures it), no COLUMNS."""
    monkeypatch.delenv("COLUMNS", raising=False)


def out_of(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


# Output without a terminal


def test_recipes_are_one_line_each_in_a_pipe(piped, capsys):
    lines = out_of(capsys, "recipes").splitlines()
    shipped = sorted(p.stem for p in (ROOT / "recipes" / "recipe").glob("*.yaml"))
    assert [line.split()[0] for line in lines[1:]] == shipped  # no continuation lines
    assert any(len(line) > 80 for line in lines)


def test_a_plan_in_a_pipe_is_not_wrapped(piped, capsys):
    out = out_of(capsys, "plan", "recipe=qwen72b-colocate")
    trainer = next(line for line in out.splitlines() if line.startswith("trainer   TRL GRPOConfig("))
    assert trainer.endswith("seed=42)")  # the whole call on one line, no word split
    command = next(line for line in out.splitlines() if line.startswith("trainer-node0 "))
    assert command.rstrip().endswith("-m grpo_launch.trainer --run-dir .")


def test_columns_still_sets_the_width(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert max(map(len, out_of(capsys, "recipes").splitlines())) <= 80


# The compact plan


def test_plan_shows_a_memory_verdict_per_kind_and_the_tables_with_memory(piped, capsys):
    out = out_of(capsys, "plan", "recipe=qwen72b-server")
    assert "memory per GPU" not in out and "host memory per node" not in out and "(--memory:" in out
    gpu, host = (line for line in out.splitlines() if line.startswith(("  GPU ", "  host ")))
    assert gpu.split() == ["GPU", "fits", "·", "vLLM", "·", "node", "4", "·", "GPU", "4-7:", "generation", "73.5",
                           "of", "80", "GiB,", "headroom", "6.5"]
    assert host.startswith("  host     fits · trainer · node 0-3: training ")
    tables = out_of(capsys, "plan", "recipe=qwen72b-server", "--memory")
    assert "memory per GPU" in tables and "host memory per node" in tables and "(--memory:" not in tables
    assert len(tables.splitlines()) > len(out.splitlines()) + 20


def test_a_forced_misfit_names_the_devices_that_do_not_fit(piped, capsys):
    out = out_of(capsys, "plan", "recipe=qwen72b-colocate", "zero=2", "--force")
    (gpu,) = (line for line in out.splitlines() if line.startswith("  GPU "))
    assert gpu.startswith("  GPU      DOES NOT FIT · trainer + vLLM · node 0-3 · GPU 0-7: generation 210.7 of 80 GiB")


def test_a_vllm_only_node_has_no_trainer_rows():
    hosts = plan_json("recipe=qwen72b-server")["memory"]["hosts"]
    (serving,) = [h for h in hosts if h["role"] == "vLLM"]
    names = {c["name"] for p in serving["phases"] for c in p["components"]}
    assert names == {"processes"}  # not "0 ranks x ..." of offloaded optimizer states


# CPU plans in CPU words


def test_cpu_plan_words(piped, capsys):
    out = out_of(capsys, "plan", "recipe=tiny-cpu")
    assert out.splitlines()[0] == "tiny-cpu · placement=colocate · 1 node × 2 CPU processes · DDP · accelerate · " \
                                  "2 trainer ranks"
    header = next(line for line in out.splitlines() if line.startswith("process "))
    assert header.split() == ["process", "node", "port", "waits", "for", "command"]  # no GPUs column
    gpus = out_of(capsys, "plan", "recipe=qwen72b-colocate")
    assert "· 4 nodes × 8 GPUs (H100 80GB) ·" in gpus and "32 trainer ranks" in gpus
    assert next(line for line in gpus.splitlines() if line.startswith("process ")).split()[2] == "GPUs"


@pytest.mark.parametrize("recipe", ["tiny-cpu-server", "tiny-cpu-async-lora"])
def test_a_cpu_vllm_server_gets_no_gpu_memory_utilization(recipe):
    servers = [p for p in plan_json(f"recipe={recipe}")["processes"] if p["argv"][:2] == ["vllm", "serve"]]
    assert servers and all("--gpu-memory-utilization" not in p["argv"] for p in servers)
    assert all(p["env"]["VLLM_CPU_KVCACHE_SPACE"] for p in servers)  # what sizes a CPU engine's KV cache
    (gpu_server,) = [p for p in plan_json("recipe=qwen7b-server")["processes"] if p["role"] == "vllm"]
    assert gpu_server["argv"][gpu_server["argv"].index("--gpu-memory-utilization") + 1] == "0.9"


# A recipe file by its path


def _recipe_file(path: Path, max_steps: int = 7) -> Path:
    text = (ROOT / "recipes" / "recipe" / "tiny-cpu.yaml").read_text()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("max_steps: 20", f"max_steps: {max_steps}"))
    return path


def test_plan_takes_a_recipe_file_by_its_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _recipe_file(tmp_path / "my-recipe.yaml")
    data = json.loads(out_of(capsys, "plan", "./my-recipe.yaml", "trainer.learning_rate=0.02", "--json"))
    assert data["recipe"] == "my-recipe" and data["trainer_args"]["max_steps"] == 7
    assert data["trainer_args"]["learning_rate"] == 0.02
    _recipe_file(tmp_path / "my-recipe.yaml", max_steps=9)  # linked, not copied: an edit shows
    assert json.loads(out_of(capsys, "plan", "my-recipe.yaml", "--json"))["trainer_args"]["max_steps"] == 9
    # a recipe of a recipes directory, by its path; a sweep and `grpo recipes show` take a path too
    _recipe_file(tmp_path / "mine" / "recipe" / "other.yml", max_steps=11)
    assert json.loads(out_of(capsys, "plan", "mine/recipe/other.yml", "--json"))["trainer_args"]["max_steps"] == 11
    rows = json.loads(out_of(capsys, "plan", "-m", "my-recipe.yaml", "seed=1,2", "--json"))
    assert [r["plan"]["recipe"] for r in rows] == ["my-recipe"] * 2
    assert "max_steps: 9" in out_of(capsys, "recipes", "show", "./my-recipe.yaml")


def test_a_recipe_file_is_used_by_grpo_run_too(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _recipe_file(tmp_path / "my-recipe.yaml")
    out = out_of(capsys, "run", "my-recipe.yaml", "--dry-run")
    assert out.startswith("would write runs/my-recipe/")


BAD_FILES = [
    ("missing.yaml", None, "recipe file missing.yaml does not exist"),
    ("flat.yaml", "learning_rate: 1.0e-6\n", "does not start with '# @package _global_'"),
    ("my recipe.yaml", "# @package _global_\n", "'my recipe' is not a usable recipe name"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_recipe_file_is_refused(name, text, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / name).write_text(text)
    assert main(["plan", name]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "malformed" not in err


# grpo recipes show, as users type it


def test_recipes_show_takes_options_after_the_name_and_recipe_equals(tmp_path, capsys):
    d = tmp_path / "user"
    _recipe_file(d / "recipe" / "mine.yaml")
    shown = out_of(capsys, "recipes", "show", "mine", "--recipes-dir", str(d), "seed=3")
    assert shown.startswith("# recipe mine:") and "max_steps: 7" in shown and "seed: 3" in shown
    assert out_of(capsys, "recipes", "--recipes-dir", str(d), "show", "mine").startswith("# recipe mine:")
    assert out_of(capsys, "recipes", "show", "recipe=tiny-cpu").startswith("# recipe tiny-cpu:")
    assert "wrote" in out_of(capsys, "recipes", "new", "copy", "--from", "mine", "--recipes-dir", str(d),
                             "--to", str(tmp_path / "copies"))


# The sweep's summary and JSON


def test_a_layout_that_does_not_fit_is_counted_as_refused(piped, capsys):
    out = out_of(capsys, "plan", "-m", "recipe=qwen72b-colocate", "zero=2,3", "vllm.tensor_parallel_size=3,8")
    assert out.splitlines()[0] == "4 combinations of zero, vllm.tensor_parallel_size · 1 fit, 3 refused " \
                                  "(1 for memory)"


def test_swept_values_keep_their_types_in_json(capsys):
    rows = json.loads(out_of(capsys, "plan", "-m", "seed=1,2", "trainer.learning_rate=1e-6", "zero=0,2",
                             "trainer.report_to=none,wandb", "--json"))
    assert rows[0]["values"] == {"seed": 1, "zero": "0", "trainer.report_to": "none"}
    assert [r["values"]["seed"] for r in rows] == [1] * 4 + [2] * 4


# Generated files


def _files(*overrides: str) -> dict[str, str]:
    plan = build_plan(compose(list(overrides)))
    return {name: document_text(name, doc) for name, doc in plan.files.items()}


def test_accelerate_yaml_holds_no_address_reference_and_says_what_to_fill_in():
    text = _files("recipe=qwen72b-colocate")["accelerate.yaml"]
    assert "${" not in text and "main_process_ip" not in yaml.safe_load(text)
    assert "# main_process_ip, trainer node 0's address, is known only where the job runs (GRPO_HOST_0)" in text
    given = _files("recipe=qwen72b-colocate", "cluster.hosts=[10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4]")
    assert yaml.safe_load(given["accelerate.yaml"])["main_process_ip"] == "10.0.0.1"
    assert "--machine_rank K ..." in given["accelerate.yaml"]
    assert not _files("recipe=tiny-cpu")["accelerate.yaml"].startswith("#")  # one machine needs nothing added


def test_launch_sh_says_what_it_needs():
    text = _files("recipe=tiny-cpu-async-lora")["launch.sh"]
    header = " ".join(line[2:] for line in text.splitlines()[1:9])
    assert "without grpo-launch" not in text
    assert "It needs what they run, installed where it runs: grpo-launch (`python -m " \
           "grpo_launch.trainer.tiny_model`, `grpo proxy`, `python -m grpo_launch.trainer`), and python, vllm, " \
           "accelerate and python3 on the PATH." in header


@pytest.mark.parametrize("rank", ["9", "-1", "x", "0 1"])
def test_launch_sh_refuses_a_node_rank_the_run_does_not_have(rank, tmp_path):
    launch = tmp_path / "launch.sh"
    launch.write_text(_files("recipe=qwen72b-server")["launch.sh"])
    done = subprocess.run(["bash", str(launch)], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "NODE_RANK": rank})
    assert done.returncode == 2
    assert done.stderr == f"launch.sh: NODE_RANK={rank} is not a node of this run (nodes 0-4)\n"
    assert not (tmp_path / "logs").exists()  # nothing started


def test_job_sbatch_header_tells_how_it_finds_the_run_directory():
    text = _files("recipe=tiny-cpu", "scheduler=slurm")["job.sbatch"]
    assert "--chdir=RUN_DIR" not in text and 'cd "${SLURM_SUBMIT_DIR:-.}"' in text
    header = " ".join(line[2:] for line in text.splitlines()[1:7])
    assert "as one Slurm job on 1 node. Submit it from the run directory" in header
    assert "`cd RUN_DIR && sbatch job.sbatch`" in header and "which `sbatch --chdir` does not change" in header
    assert re.search(r"on 2 nodes\.", _files("recipe=tiny-cpu", "scheduler=slurm", "cluster.nodes=2")["job.sbatch"])


def test_ddp_is_not_asked_to_find_unused_parameters():
    assert plan_json("recipe=tiny-cpu")["trainer_args"]["ddp_find_unused_parameters"] is False
    assert plan_json("recipe=tiny-cpu", "trainer.ddp_find_unused_parameters=true")["trainer_args"][
        "ddp_find_unused_parameters"] is True  # a model with unused parameters says so
    for recipe in ("qwen7b-colocate", "qwen1.5b-async-lora"):  # ZeRO, FSDP2: no DDP
        assert "ddp_find_unused_parameters" not in plan_json(f"recipe={recipe}")["trainer_args"]
    assert "ddp_find_unused_parameters" not in plan_json("recipe=tiny-cpu-async-lora")["trainer_args"]  # 1 rank


def test_recipes_in_a_pipe_from_the_real_entry_point():
    """The console entry point with stdout a pipe and no COLUMNS: what CI and `grpo recipes | less` get."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "recipes"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 + len(list((ROOT / "recipes" / "recipe").glob("*.yaml")))
