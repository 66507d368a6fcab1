"""Several nodes in the plan: addresses, ports of nodes sharing a machine, the rendezvous, and the scheduler's job
files (fast; the runs are in test_multinode_e2e.py and test_slurm.py)."""

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from conftest import grpo, plan_json
from fault_matrix import FINISHED, REFUSED, FaultRow, record_fault
from rich.console import Console

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.contracts import hosts
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.schedulers import declared
from grpo_launch.contracts.shell import shell_word
from grpo_launch.errors import UserError
from grpo_launch.plan import build_plan
from grpo_launch.plan.ports import PortBook

TWO_CPU_NODES = ("cluster.nodes=2", "cluster.gpus_per_node=1")


def _trainers(plan):
    return [p for p in plan["processes"] if p["role"] == "trainer"]


def test_cpu_nodes_without_hosts_are_this_machine():
    plan = plan_json(*TWO_CPU_NODES)
    assert plan["hosts"] == ["127.0.0.1", "127.0.0.1"]
    first, second = _trainers(plan)
    assert (first["node"], second["node"]) == (0, 1)
    for rank, trainer in enumerate((first, second)):
        argv = trainer["argv"]
        assert argv[argv.index("--machine_rank") + 1] == str(rank)
        assert argv[argv.index("--main_process_ip") + 1] == "127.0.0.1"
    assert plan["scheduler"]["kind"] == "local"
    (group,) = plan["scheduler"]["groups"]  # one `grpo run` starts both nodes
    assert group["nodes"] == [0, 1] and group["processes"] == ["trainer-node0", "trainer-node1"]


def test_gpu_nodes_without_hosts_read_their_addresses_where_the_job_runs():
    plan = plan_json("recipe=qwen72b-colocate")
    assert plan["hosts"] == [hosts.reference(n) for n in range(4)] == ["${GRPO_HOST_0}", "${GRPO_HOST_1}",
                                                                       "${GRPO_HOST_2}", "${GRPO_HOST_3}"]
    assert len(plan["scheduler"]["groups"]) == 4  # `grpo run --node-rank K` on each machine
    given = plan_json("recipe=qwen72b-colocate", "cluster.hosts=[10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4]")
    assert hosts.variables_in(given) == set()


def test_addresses_are_filled_in_from_the_environment():
    plan = Plan.from_json(plan_json("recipe=qwen72b-server"))
    env = {f"GRPO_HOST_{n}": f"10.1.0.{n + 1}" for n in range(5)}
    resolved = plan.with_addresses(env)
    assert resolved.trainer_args["vllm_server_base_url"] == "http://10.1.0.5:8000"
    assert resolved.process("trainer-node3").argv[resolved.process("trainer-node3").argv.index(
        "--main_process_ip") + 1] == "10.1.0.1"
    assert resolved.files["accelerate.yaml"]["main_process_ip"] == "10.1.0.1"
    assert resolved.process("trainer-node0").ready_url is None and resolved.memory == plan.memory
    assert hosts.variables_in(resolved.to_json()) == set()
    with pytest.raises(UserError, match="GRPO_HOST_4 is not set"):
        plan.with_addresses({k: v for k, v in env.items() if k != "GRPO_HOST_4"})


def test_filling_in_addresses_changes_nothing_else():
    plan = build_plan(compose(["recipe=qwen72b-server", "scheduler=slurm"]))
    same = {f"GRPO_HOST_{n}": hosts.reference(n) for n in range(5)}
    assert plan.with_addresses(same) == plan


def test_address_references_stay_expandable_in_shell_commands():
    assert shell_word("${GRPO_HOST_1}") == '"${GRPO_HOST_1}"'
    assert shell_word("http://${GRPO_HOST_1}:8000/health") == '"http://${GRPO_HOST_1}:8000/health"'
    assert shell_word("$HOME/${GRPO_HOST_0}") == "'$HOME/'\"${GRPO_HOST_0}\""
    assert shell_word("a b") == "'a b'"
    out = subprocess.run(["bash", "-c", f"echo {shell_word('x ${GRPO_HOST_0}:1 $PATH')}"],
                         env={"GRPO_HOST_0": "10.0.0.9", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert out.stdout == "x 10.0.0.9:1 $PATH\n"


def test_nodes_on_one_machine_share_its_ports():
    book = PortBook(("127.0.0.1", "127.0.0.1", "10.0.0.3"))
    assert book.next_free(0, 8000, "a", "vllm.port") == 8000
    assert book.next_free(1, 8000, "b", "vllm.port") == 8001  # node 1 is node 0's machine
    assert book.next_free(2, 8000, "c", "vllm.port") == 8000  # another machine
    with pytest.raises(UserError, match=r"port 8001 on nodes 1 and 0 \(both 127.0.0.1\) is wanted by both b and d"):
        book.claim(0, 8001, "d", "proxy.port")
    assert [(c.node, c.port) for c in book.claims()] == [(0, 8000), (1, 8001), (2, 8000)]


def test_every_port_of_loopback_nodes_is_distinct():
    plan = plan_json("recipe=tiny-cpu-async-lora", "cluster.nodes=2", "cluster.gpus_per_node=1",
                     "placement.async_lora.replicas=1")
    assert {p["node"] for p in plan["processes"]} == {0, 1}
    ports = [c["port"] for c in plan["ports"]]
    assert len(ports) == len(set(ports)), plan["ports"]


def test_several_trainer_nodes_rendezvous_within_the_stated_timeout():
    for launcher in ("accelerate", "torchrun"):
        plan = plan_json(*TWO_CPU_NODES, f"launcher={launcher}", "run.rendezvous_timeout_s=45.5")
        for trainer in _trainers(plan):
            argv = trainer["argv"]
            assert argv[argv.index("--rdzv_conf") + 1] == "timeout=46"
            first, second = (d["reason"] for d in trainer["diagnoses"])
            assert first.startswith("the trainer rendezvous at 127.0.0.1:29500 did not complete within 45.5 s "
                                    "(run.rendezvous_timeout_s)")
            assert second.startswith("trainer node 0's rendezvous at 127.0.0.1:29500 did not answer within 45.5 s")
    (single,) = _trainers(plan_json())
    assert "--rdzv_conf" not in single["argv"] and single["diagnoses"] == []


def test_72b_accelerate_files_start_per_node_torch_launchers_not_pdsh(tmp_path, monkeypatch):
    """accelerate's own launch code on the 72B recipes' files: each `accelerate launch --machine_rank K` must
    start torch.distributed.run for its node. Without deepspeed_multinode_launcher it ran DeepSpeed's pdsh runner
    (`deepspeed --hostfile None --launcher pdsh ...`) and ignored --machine_rank."""
    import torch.distributed.run
    from accelerate.commands import launch

    started = []

    def no_ssh_runner(cmd, *args, **kwargs):
        raise AssertionError(f"accelerate started DeepSpeed's multi-node runner: {cmd}")

    monkeypatch.setattr(launch.subprocess, "Popen", no_ssh_runner)
    monkeypatch.setattr(torch.distributed.run, "run", lambda args: started.append(args))
    monkeypatch.chdir(tmp_path)
    for recipe in ("qwen72b-colocate", "qwen72b-server"):
        plan = plan_json(f"recipe={recipe}", "cluster.hosts=[10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4"
                         + (",10.0.0.5]" if recipe.endswith("server") else "]"))
        (tmp_path / "accelerate.yaml").write_text(yaml.safe_dump(plan["files"]["accelerate.yaml"]))
        (tmp_path / "deepspeed.json").write_text(json.dumps(plan["files"]["deepspeed.json"]))
        trainer = _trainers(plan)[2]
        argv = trainer["argv"][2:trainer["argv"].index("-m")] + ["train.py"]
        args = launch.launch_command_parser().parse_args(argv)
        launch.launch_command(args)
        torch_args = started.pop()
        assert (torch_args.nnodes, torch_args.node_rank, torch_args.nproc_per_node) == ("4", 2, "8")
        assert (torch_args.rdzv_endpoint, torch_args.rdzv_conf) == ("10.0.0.1:29500", "timeout=600")


def test_slurm_job_file_avoids_the_traps():
    plan = plan_json("recipe=qwen72b-server", "scheduler=slurm", "scheduler.slurm.partition=gpu",
                     "scheduler.slurm.account=proj", "scheduler.slurm.qos=high",
                     "scheduler.slurm.time_limit=2-00:00:00",
                     "scheduler.slurm.sbatch=['--constraint=h100','#SBATCH --mem=0']",
                     "scheduler.setup=['module load cuda/12.4','source /shared/venv/bin/activate']")
    job = plan["files"]["job.sbatch"]
    for line in ("#SBATCH --nodes=5", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --qos=high", "#SBATCH --time=2-00:00:00",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --constraint=h100", "#SBATCH --mem=0",
                 "module load cuda/12.4\nsource /shared/venv/bin/activate\n"):
        assert line in job
    assert job.index("module load") < job.index("srun")
    # addresses from each node's NodeAddr, never from the names
    assert "scontrol show node" in job and "NodeAddr" in job
    assert not re.search(r"^[^#]*scontrol show hostnames.*\| head", job, re.M)
    # the node index expands on each node: single-quoted in the batch shell
    assert "node_supervisor='i=0; for n in $GRPO_NODE_NAMES; do if [ \"$n\" = \"$SLURMD_NODENAME\" ]" in job
    steps = [line for line in job.splitlines() if line.startswith("srun ")]
    assert len(steps) == 2 and all("--kill-on-bad-exit=1" in s and "--gpus-per-node=8" in s for s in steps)
    assert '--nodes=4 --ntasks=4 --ntasks-per-node=1 --nodelist="${nodes[0]},${nodes[1]},${nodes[2]},${nodes[3]}"' \
        in steps[0]
    assert '--nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist="${nodes[4]}"' in steps[1]
    assert job.rstrip().endswith('exit "$rc"')
    assert subprocess.run(["bash", "-n"], input=job, text=True).returncode == 0
    groups = {g["name"]: g for g in plan["scheduler"]["groups"]}
    assert groups["trainer"]["nodes"] == [0, 1, 2, 3] and groups["services"]["processes"] == ["vllm"]
    assert plan["scheduler"]["submit"] == ["sbatch", "--parsable", "job.sbatch"]


def test_skypilot_task_reads_its_nodes_from_skypilot():
    plan = plan_json("recipe=qwen72b-colocate", "scheduler=skypilot", "scheduler.skypilot.cloud=aws",
                     "scheduler.setup=['pip install grpo-launch']", "trainer.output_dir=/shared/checkpoints")
    task = plan["files"]["task.yaml"]
    assert (task["num_nodes"], task["workdir"], task["resources"]) == (4, ".", {"cloud": "aws",
                                                                                 "accelerators": "H100:8"})
    assert task["setup"] == "pip install grpo-launch\n"
    assert "SKYPILOT_NODE_IPS" in task["run"] and '--node "$SKYPILOT_NODE_RANK"' in task["run"]
    assert subprocess.run(["bash", "-n"], input=task["run"], text=True).returncode == 0
    assert plan["scheduler"]["submit"] == ["sky", "launch", "--yes", "--cluster",  # the launcher names the run's own
                                           "grpo-qwen72b-colocate-<run>-<hash>", "--down", "task.yaml"]


def test_json_contract_has_a_scheduler_section():
    for kind, job_file in (("local", None), ("slurm", "job.sbatch"), ("skypilot", "task.yaml"),
                           ("hf-jobs", "hf-jobs.sh")):
        plan = plan_json(*TWO_CPU_NODES, f"scheduler={kind}")
        section = plan["scheduler"]
        assert set(section) == {"kind", "job_file", "submit", "node_rank", "addresses", "groups", "verbatim", "jobs",
                                "storage", "price_per_hour", "cluster", "settings", "control_plane_timeout_s"}
        settings = declared(kind).settings  # the scheduler's own recipe section, for its launcher
        assert (section["settings"] is None) == (settings is None)
        assert bool(section["jobs"]) == (kind == "hf-jobs")
        assert (section["kind"], section["job_file"]) == (kind, job_file)
        assert (section["cluster"] is not None) == (kind == "skypilot")  # sky cancel / sky down take it
        # where `grpo report` says the metrics are: SkyPilot's node 0 and the Jobs' bucket keep them away from here
        assert bool(declared(kind).logs_elsewhere) == (kind in ("skypilot", "hf-jobs"))
        assert job_file is None or job_file in plan["files"]
        for group in section["groups"]:
            assert set(group) == {"name", "nodes", "processes", "command", "ends"}


def test_plan_view_shows_who_runs_what_and_the_job_file(capsys):
    assert main(["plan", "recipe=qwen72b-server", "scheduler=slurm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "scheduler slurm · job file job.sbatch" in out
    assert "services" in out and "$SLURMD_NODENAME" in out and "NodeAddr" in out
    assert "files     deepspeed.json  accelerate.yaml  launch.sh  job.sbatch" in out
    assert "#SBATCH --nodes=5" in out  # --dry-run prints the batch script


def test_run_refuses_what_it_cannot_start(tmp_path):
    # several machines: each needs its own `grpo run --node-rank K`
    result = grpo("run", "recipe=qwen72b-colocate", f"run.root={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2 and "are other machines" in result.stderr and "--node-rank K" in result.stderr
    result = grpo("run", "--node-rank", "1", "scheduler=slurm", f"run.root={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2 and "--node-rank is for scheduler=local" in result.stderr
    # a node's addresses must be known before anything starts
    result = grpo("run", "--node-rank", "1", "recipe=qwen72b-colocate", "--force", f"run.root={tmp_path}",
                  cwd=tmp_path)
    assert result.returncode == 2 and "GRPO_HOST_0 is not set" in result.stderr
    # no role from a torch rank: started as a torch worker, it refuses
    result = grpo("run", f"run.root={tmp_path}", env={"RANK": "1"}, cwd=tmp_path)
    assert result.returncode == 2 and "RANK set: grpo-launch is running as a torch worker" in result.stderr
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


def test_node_supervisor_refuses_what_it_cannot_start(tmp_path):
    from grpo_launch.materialize import materialize

    def node(run_dir, k, **env):
        return subprocess.run([sys.executable, "-m", "grpo_launch.launch", "--run-dir", str(run_dir), "--node", str(k)],
                              capture_output=True, text=True, env={**os.environ, **env}, timeout=60)

    done = node(tmp_path, 0)
    assert done.returncode == 2 and "is not a grpo-launch run directory (no plan.json)" in done.stdout
    composed = compose(["recipe=qwen72b-colocate"])
    run_dir = materialize(composed, build_plan(composed), [], run_dir=tmp_path / "run")
    done = node(run_dir, 4)
    assert done.returncode == 2 and "--node 4 is not a node of this plan (0..3)" in done.stdout
    done = node(run_dir, 1)  # a scheduler's job sets GRPO_HOST_K; without them nothing starts
    assert done.returncode == 2 and "GRPO_HOST_0 is not set" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr and sorted(os.listdir(run_dir / "logs")) == []


def test_run_dry_run_prints_the_job_file_and_its_submission(tmp_path):
    result = grpo("run", "--dry-run", "scheduler=slurm", "cluster.nodes=2", f"run.root={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "─ job.sbatch ─" in result.stdout and "#SBATCH --nodes=2" in result.stdout
    assert "would then run sbatch --parsable job.sbatch (in the run directory)" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.fault
def test_checkpoints_each_skypilot_node_would_keep_alone_are_refused_with_the_fix():
    """Issue 27, 8: qwen72b-colocate on 4 SkyPilot nodes checkpointed into each node's own copy of the run directory
    (no warning); a resume then loaded step N on node 0 and started afresh on the others."""
    with pytest.raises(UserError, match="4 trainer nodes save checkpoints to checkpoints in the run directory") as e:
        build_plan(compose(["recipe=qwen72b-colocate", "scheduler=skypilot"]))
    assert e.value.key == "trainer.output_dir" and "run.node_local_checkpoints=true" in e.value.hint
    record_fault(FaultRow("8 node-local checkpoints on 4 nodes", 1, REFUSED, REFUSED))
    for fix in ("trainer.output_dir=/shared/checkpoints", "run.node_local_checkpoints=true",
                "trainer.save_strategy=no", "cluster.nodes=1", "scheduler=slurm"):
        build_plan(compose(["recipe=qwen72b-colocate", "scheduler=skypilot", fix]))


def test_the_first_node_failure_names_the_jobs_exit_code(tmp_path, capsys):
    """Each failed node's record is typed (contracts.rundir.NodeFailure); the job passes on the code of the node
    that failed first, as `python -m grpo_launch.launch --first-failure` prints it for the Slurm job."""
    from grpo_launch.contracts.rundir import NodeFailure, read_node_failures, write_node_failure
    from grpo_launch.launch.__main__ import main as node_main
    from grpo_launch.launch.follow import node_failures as followed

    (tmp_path / "logs").mkdir()
    assert node_main(["--run-dir", str(tmp_path), "--first-failure"]) == 0
    assert capsys.readouterr().out == "\n"  # none failed: nothing to pass on
    write_node_failure(tmp_path, NodeFailure(1, 143, 2_000, "trainer-node1",
                                             "stopped while the trainer runs with code 143"))
    write_node_failure(tmp_path, NodeFailure(0, 7, 1_000, "trainer-node0",
                                             "exited with code 7 (rank 3, at step 2: ValueError: x y)"))
    (tmp_path / "logs" / "node-2.failure.json").write_text("{")  # a node killed while writing its record
    assert [f.node for f in read_node_failures(tmp_path)] == [0, 1]
    assert node_main(["--run-dir", str(tmp_path), "--first-failure"]) == 0
    assert capsys.readouterr().out == "7\n"
    first = followed(tmp_path)[0]
    assert (first.process, first.code, str(first)) == ("trainer-node0", 7, "trainer-node0 exited with code 7 (rank 3, "
                                                                          "at step 2: ValueError: x y)")


def test_the_node_that_claimed_the_first_failure_comes_first_whatever_the_clocks(tmp_path):
    """Issue 27, 14: the first failure across nodes was chosen by the time each node wrote its record, after its
    grace period and on its own clock. The first node to fail claims it in the run directory as it happens."""
    from grpo_launch.contracts.rundir import NodeFailure, claim_first_failure, read_node_failures, write_node_failure

    (tmp_path / "logs").mkdir()
    assert claim_first_failure(tmp_path, 1) and not claim_first_failure(tmp_path, 0)
    write_node_failure(tmp_path, NodeFailure(0, 143, 1_000, "trainer-node0", "stopped"))  # its clock runs behind
    write_node_failure(tmp_path, NodeFailure(1, 7, 2_000, "trainer-node1", "exited with code 7"))
    assert [f.node for f in read_node_failures(tmp_path)] == [1, 0]


@pytest.mark.fault
def test_a_node_starts_without_an_earlier_runs_failure_records_and_times_its_own_when_it_failed(tmp_path):
    """Issue 27, 14: a stale node-K.failure.json marked a resumed, finished run as failed (and named an old cause to
    its job). A node's supervisor clears its own at the start; the record it writes carries when the failure
    happened, not when the stop it caused ended (here a server that ignores SIGTERM holds the stop for the grace)."""
    from supervised import server_plan

    from grpo_launch.contracts.rundir import (
        FIRST_FAILURE,
        NodeFailure,
        failure_records,
        read_node_failures,
        write_node_failure,
    )
    from grpo_launch.launch.node import run_nodes

    plan = server_plan(tmp_path, [], ["--run-for", "0.1"])
    write_node_failure(tmp_path, NodeFailure(0, 9, 1, "trainer", "an earlier run's"))
    (tmp_path / "logs" / FIRST_FAILURE).write_text("0\n")
    console = Console(file=io.StringIO(), width=200)
    code = run_nodes(Plan.from_json(plan), tmp_path, [0], grace_s=3, console=console).code
    assert failure_records(tmp_path) == () and not (tmp_path / "logs" / FIRST_FAILURE).exists()
    record_fault(FaultRow("14 an earlier run's node failure record", 1, FINISHED,
                          FINISHED if code == 0 else f"exit {code}"))

    failing = server_plan(tmp_path, ["--ignore-sigterm"], ["--run-for", "0.1", "--code", "3"])
    result = run_nodes(Plan.from_json(failing), tmp_path, [0], grace_s=3, console=console)
    ended = time.time_ns()
    (record,) = read_node_failures(tmp_path)
    assert (result.code, record.code, record.process) == (3, 3, "trainer")
    assert ended - record.time_ns > 2.5e9  # the stop took the grace period; the failure came before it
    assert (tmp_path / "logs" / FIRST_FAILURE).read_text() == "0\n"
