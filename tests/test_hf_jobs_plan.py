"""scheduler=hf-jobs, planned: the async post's layout as Jobs, every rendered `hf jobs run` checked by
huggingface_hub's own CLI (`hf jobs run --dry-run`, offline), the flavors and bad input checked against the
library's own hardware list, the wheel a Job installs, and the run's names as the script and the launcher derive
them."""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
from conftest import grpo
from test_generated_scripts import bash_n, shellcheck

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.contracts.rundir import REWARDS_DIR
from grpo_launch.contracts.schedulers import run_group
from grpo_launch.contracts.vllm import REPLICA_GUARD, VLLM_VERSION
from grpo_launch.launch.schedulers.hf_jobs import rewritten
from grpo_launch.materialize import materialize, run_files
from grpo_launch.plan import build_plan
from grpo_launch.plan.schedulers.hf_jobs import FLAVORS, library_flavors

SEED = ["recipe=qwen1.5b-async-lora", "scheduler=hf-jobs"]
BIN = str(Path(sys.executable).parent)


def planned(*overrides):
    return build_plan(compose(list(overrides)))


def test_the_async_posts_recipe_plans_the_posts_own_jobs():
    """One h200x2 Job for the trainer and the proxy beside it, one h200 Job per vLLM replica, each on a node of its
    own with the GPUs it uses; the vLLM Jobs first, mounting the run directory read-only at the trainer's path."""
    plan = planned(*SEED)
    jobs = plan.scheduler.jobs
    assert [j.name for j in jobs] == [f"vllm-{i}" for i in range(6)] + ["trainer"]
    trainer = jobs[-1]
    assert (trainer.node, trainer.flavor, trainer.gpus, trainer.processes) == (0, "h200x2", 2, ("proxy", "trainer"))
    assert trainer.supervisor and not trainer.read_only and trainer.expose == ()
    assert trainer.command[:2] == ("bash", "-c") and "exec python3 -m grpo_launch.launch --run-dir /grpo --node 0" \
        in trainer.command[2]
    for i, job in enumerate(jobs[:-1]):
        process = plan.process(f"vllm-{i}")
        assert (job.node, process.node, process.gpus, job.flavor, job.gpus) == (i + 1, i + 1, (0,), "h200", 1)
        assert job.read_only and job.expose == (8000,) and job.health == "/health" and job.max_restarts == 3
        assert job.image == f"vllm/vllm-openai:v{VLLM_VERSION}"
        # vLLM's image has no grpo-launch: its replica-key guard stays out of the Job (the Hub guards the port)
        assert "--middleware" in process.argv and "--middleware" not in job.command[2]
        served = [a for a in process.argv if a not in ("--middleware", REPLICA_GUARD)]
        assert job.command == ("bash", "-c", "cd /grpo && exec " + " ".join(shlex.quote(a) for a in served))
        assert job.address == f"${{HF_NETWORK_GROUP_PREFIX}}vllm-{i}:8000"
        assert f'GRPO_HOST_{i + 1}="${{HF_NETWORK_GROUP_PREFIX}}vllm-{i}"' in trainer.command[2]
    proxy = plan.process("proxy")
    assert [proxy.argv[k + 1] for k, a in enumerate(proxy.argv) if a == "--replica"] == \
        [f"http://${{GRPO_HOST_{i + 1}}}:8000" for i in range(6)]
    assert plan.gpu_map[0] == ("train 0", "train 1") and plan.gpu_map[1] == ("replica 0", "-")
    # The flavors' hourly prices (data with its source): 2 x $5 + 6 x ($5 + $0.01 for the exposed port).
    assert plan.scheduler.price_per_hour == pytest.approx(40.06)
    assert not any("idle" in w for w in plan.warnings)
    assert not any("trainer.output_dir" in w for w in plan.warnings)  # the bucket is every Job's run directory


def test_the_plan_view_and_dry_run_show_the_jobs_and_hf_jobs_sh():
    result = grpo("plan", *SEED, "--dry-run", env={"COLUMNS": "250"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "7 Jobs, submitted in this order · $40.06/h together" in out
    assert re.search(r"trainer\s+0\s+proxy, trainer\s+h200x2 \(2 GPU\)\s+10\.00", out)
    assert re.search(r"vllm-5\s+6\s+vllm-5\s+h200 \(1 GPU\)\s+5\.01\s+vllm/vllm-openai:v", out)
    assert "#!/usr/bin/env bash" in out and "hf jobs run --dry-run" in out and "wait_ready" in out


def _dry_run_configurations(stderr: str) -> list[dict[str, list[str]]]:
    """The 'Job configuration:' blocks `hf jobs run --dry-run` printed, as key -> value lines."""
    blocks = []
    for block in stderr.split("Job configuration:")[1:]:
        found: dict[str, list[str]] = {}
        key = None
        for line in block.splitlines():
            if line.startswith("(dry run)"):
                break
            match = re.match(r"  (\S+)\s+(.*)$", line)
            if match:
                key = match.group(1)
                found[key] = [match.group(2)]
            elif line.strip() and key:
                found[key].append(line.strip())
        blocks.append(found)
    return blocks


def test_every_job_of_hf_jobs_sh_is_resolved_by_the_hf_cli_offline(tmp_path):
    """`DRY_RUN=1 bash hf-jobs.sh`: each `hf jobs run` of the script, with `--dry-run`, through huggingface_hub's own
    CLI, offline: what it resolves is the plan's Job, volume spec parsed by the library itself."""
    from huggingface_hub.cli._cli_utils import parse_volumes

    composed = compose([*SEED, f"run.root={tmp_path}"])
    plan = build_plan(composed)
    run_dir = materialize(composed, plan, [])
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DRY_RUN": "1", "HF_JOBS_NAMESPACE": "alice",
           "HF_TOKEN": "hf_not_a_real_token", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", "hf-jobs.sh"], cwd=run_dir, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    resolved = _dry_run_configurations(done.stderr)
    group = run_group(plan.recipe, run_dir)
    assert len(resolved) == len(plan.scheduler.jobs)
    for job, seen in zip(plan.scheduler.jobs, resolved, strict=True):
        assert seen["image"] == [job.image]
        assert "\n".join(seen["command"]) == shlex.join(job.command)  # as the Job will run it
        assert seen["flavor"] == [job.flavor] and seen["timeout"] == ["6h"] and seen["namespace"] == ["alice"]
        assert sorted(seen["env"]) == sorted(f"{k}={v}" for k, v in job.env.items())
        assert seen["secrets"] == ["HF_TOKEN=***"]  # by name: its value never reaches the script
        assert seen["labels"] == [f"grpo-run={group}", f"name={group}-{job.name}"]
        assert seen["network_group"] == [group] and seen["network_aliases"] == [job.name]
        assert seen.get("expose", [""]) == [" ".join(map(str, job.expose))] if job.expose else "expose" not in seen
        (volume,) = parse_volumes(seen["volumes"])
        assert (volume.type, volume.source, volume.path, volume.mount_path, volume.read_only) == \
            ("bucket", "alice/grpo-runs", group, "/grpo", job.read_only)
    assert "hf_not_a_real_token" not in (run_dir / "hf-jobs.sh").read_text() + done.stdout + done.stderr


def test_run_group_is_what_hf_jobs_sh_derives(tmp_path):
    """The run's network group, Job-name prefix and bucket folder: the script's own line, run in run directories of
    several names, against the launcher's `run_group`."""
    for recipe in ("qwen1.5b-async-lora", "tiny-cpu-async-lora"):
        script = planned(f"recipe={recipe}", "scheduler=hf-jobs").files["hf-jobs.sh"].replace("\\\n", "")
        line = "; ".join(ln.partition("  #")[0] for ln in script.splitlines() if ln.startswith("run_id="))
        for name in ("20261129-171500", "My Run.2", "x" * 60):
            (tmp_path / name).mkdir(exist_ok=True)
            shell = subprocess.run(["bash", "-c", f'{line}; printf %s "$run_id"'], cwd=tmp_path / name,
                                   capture_output=True, text=True).stdout
            assert shell == run_group(recipe, tmp_path / name) and len(shell) <= 46
            assert re.fullmatch(r"[a-z0-9-]+", shell)


def test_runs_of_a_sweep_whose_names_look_alike_get_groups_of_their_own(tmp_path):
    """Issue 27, 12: the group was the run id cut to 46 characters, so two run directories sharing about 21 leading
    characters (`...-lr1e-5-bs64`, `...-bs128`) shared a network group, Job names and bucket folder, and the second
    resumed the first one's checkpoints. A hash of the run directory's full path ends every group."""
    names = ["20261203-sweep-lr1e-5-warmup100-bs64", "20261203-sweep-lr1e-5-warmup100-bs128"]
    groups = {run_group("qwen1.5b-async-lora", tmp_path / name) for name in names}
    assert len(groups) == 2 and all(len(g) <= 46 for g in groups)
    assert run_group("x", tmp_path / "a" / "run") != run_group("x", tmp_path / "b" / "run")


def test_hf_jobs_sh_passes_shellcheck_and_states_the_control_planes_bound(tmp_path):
    """hf-jobs.sh passes `bash -n` and shellcheck, and asks the Hub through its transient failures within
    scheduler.control_plane_timeout_s, rendered into it (issue 27, 3)."""
    for recipe in ("qwen1.5b-async-lora", "tiny-cpu-async-lora"):
        script = planned(f"recipe={recipe}", "scheduler=hf-jobs", "scheduler.control_plane_timeout_s=90.5").files[
            "hf-jobs.sh"]
        assert "\ncontrol_plane_timeout_s=90.5  # scheduler.control_plane_timeout_s\n" in script
        path = tmp_path / f"{recipe}.sh"
        path.write_text(script)
        bash_n(path)
        shellcheck(path)


def test_a_resume_uploads_again_exactly_what_materialize_writes():
    """`--resume` uploads only the files materialize wrote again (issue 27, 5): the launcher's list is
    materialize's, with the reward files' folder."""
    for recipe in SEED[:1] + ["recipe=tiny-cpu-async-lora"]:
        composed = compose([recipe, "scheduler=hf-jobs"])
        plan = build_plan(composed)
        assert sorted(rewritten(plan)) == sorted({*run_files(composed, plan, []), REWARDS_DIR})


def test_the_flavor_table_is_the_librarys_hardware_list():
    assert sorted(FLAVORS) == sorted(library_flavors())


def test_the_vllm_image_is_the_version_the_plans_argv_is_checked_against():
    assert metadata.version("vllm").split("+")[0] == VLLM_VERSION


@pytest.mark.parametrize(("overrides", "key", "message"), [
    (["scheduler.hf_jobs.secrets=['HF_TOKEN=hf_abc']"], "scheduler.hf_jobs.secrets[0]",
     "gives a secret's value (HF_TOKEN=...): secrets go by name only"),
    (["scheduler.hf_jobs.secrets=[HF-TOKEN]"], "scheduler.hf_jobs.secrets[0]", "not an environment variable's name"),
    (["scheduler.hf_jobs.mount_path=grpo"], "scheduler.hf_jobs.mount_path", "at this absolute path"),
    (["scheduler.hf_jobs.mount_path=/grpo/../etc"], "scheduler.hf_jobs.mount_path", "at this absolute path"),
    (["scheduler.hf_jobs.flavor.trainer=h100x2"], "scheduler.hf_jobs.flavor.trainer",
     "'h100x2', not a flavor of huggingface_hub's hardware list; did you mean 'h200x2'?"),
    (["scheduler.hf_jobs.flavor.vllm=cpu-basic"], "scheduler.hf_jobs.flavor.vllm", "a CPU flavor, for a plan on GPUs"),
    (["scheduler.hf_jobs.flavor.trainer=h200"], "scheduler.hf_jobs.flavor.trainer",
     "h200 (1 GPU(s)), but its Job runs on 2 GPUs"),
    (["scheduler.hf_jobs.bucket=grpo-runs"], "scheduler.hf_jobs.bucket", "'grpo-runs', not namespace/name"),
    (["scheduler.hf_jobs.bucket=alice/runs/x"], "scheduler.hf_jobs.bucket", "not namespace/name"),
    (["scheduler.hf_jobs.timeout=6 hours"], "scheduler.hf_jobs.timeout", "'6 hours'"),
    (["cluster.hosts=[a]"], "cluster.hosts", "scheduler=hf-jobs picks the machines"),
])
def test_bad_input_is_refused_before_anything(capsys, overrides, key, message):
    assert main(["plan", *SEED, *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and key.split("[")[0] in err and "Traceback" not in err


def test_bad_input_to_grpo_run_writes_and_submits_nothing(tmp_path):
    for overrides in (["scheduler.hf_jobs.secrets=['HF_TOKEN=hf_abc']"], ["scheduler.hf_jobs.mount_path=rel"],
                      ["scheduler.hf_jobs.flavor.vllm=h300"], ["scheduler.hf_jobs.bucket=no-namespace"]):
        result = grpo("run", *SEED, f"run.root={tmp_path / 'runs'}", *overrides, cwd=tmp_path)
        assert result.returncode == 2 and "error:" in result.stderr, result.stderr
        assert not (tmp_path / "runs").exists()
    result = grpo("run", "recipe=tiny-cpu", "--preflight", f"run.root={tmp_path / 'runs'}", cwd=tmp_path)
    assert result.returncode == 2 and "--preflight" in result.stderr and "scheduler=hf-jobs" in result.stderr
    result = grpo("run", *SEED, "--node-rank", "0", f"run.root={tmp_path / 'runs'}", cwd=tmp_path)
    assert result.returncode == 2 and "--node-rank is for scheduler=local" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_grpo_run_says_how_to_submit_where_the_token_is_missing(tmp_path):
    env = {"HF_TOKEN": "", "HF_HOME": str(tmp_path / "no-login"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    result = grpo("run", "recipe=tiny-cpu-async-lora", "scheduler=hf-jobs", f"run.root={tmp_path / 'runs'}", env=env,
                  cwd=tmp_path)
    assert result.returncode == 2 and "not logged in to the Hugging Face Hub" in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()


def test_the_wheel_a_job_installs_is_a_wheel_pip_installs(tmp_path):
    """The supervisor Jobs pip-install the wheel uploaded with the run directory: pip takes it, and what it
    installs runs the node supervisor."""
    from grpo_launch.launch.wheel import build_wheel

    wheel = build_wheel(tmp_path / "dist")
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    check = subprocess.run([sys.executable, "-c", "import grpo_launch.launch.__main__ as m, grpo_launch.plan; "
                                                  "print(m.__file__)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path)
    assert check.returncode == 0 and check.stdout.startswith(str(target)), check.stderr
    assert (target / "grpo_launch" / "recipes" / "scheduler" / "hf-jobs.yaml").is_file()


def test_the_async_posts_jobs_rehearse_here_as_one_local_run():
    """No Hub here: `grpo rehearse` runs the recipe's process graph with grpo-launch's own scheduler and says so."""
    from grpo_launch.plan.rehearse import COULD_NOT, derive

    composed = compose(SEED)
    rehearsal = derive(composed.config, build_plan(composed), host_memory_gib=24.0, hub="offline")
    features = {f.name: f for f in rehearsal.features}
    assert features["scheduler"].real == "hf-jobs" and features["scheduler"].status == COULD_NOT
    plan = build_plan(replace(composed, config=rehearsal.config))
    assert plan.scheduler.kind == "local" and [p.role for p in plan.processes].count("vllm") == 2
