"""A stand-in for SkyPilot's `sky` command line (skypilot 0.14.1), for the tests of scheduler=skypilot's launcher: no
cloud is reachable here, and SkyPilot runs nothing without one (its local backend is Kubernetes, `sky local up`,
which needs Docker and kind). It lives in tests/ and stands in for nothing else.

It keeps its clusters in a directory (GRPO_SKY_STANDIN: state.json, and each cluster's node 0 as
clusters/NAME/home, its ~/sky_workdir the copy of the run directory `sky launch` makes), appends every command line
it is given, with its working directory, to calls.jsonl, and answers the commands grpo-launch runs with what
SkyPilot 0.14.1 prints and the exit codes it gives (sky/client/cli/command.py, sky/exceptions.py JobExitCode, the
messages of sky/backends/backend_utils.py and cloud_vm_ray_backend.py):

    sky launch [--yes] --cluster NAME [--down] [--idle-minutes-to-autostop N] [--detach-run] task.yaml
    sky logs [--status] CLUSTER JOB_ID
    sky cancel [--yes] [--all] CLUSTER [JOB_ID ...]
    sky queue [--skip-finished] [--output json] CLUSTER
    sky down [--yes] CLUSTER

What the job does is the test's choice, in scenario.json's "job":
    succeeds             writes node 0's metrics.jsonl and a log, and ends SUCCEEDED
    fails                ends FAILED
    stream-drops         runs on while `sky launch`'s stream breaks off (the API server's connection lost); the
                         next `sky logs` follows it to SUCCEEDED
    runs                 runs until it is cancelled; `sky launch` follows it meanwhile
    setup-fails          the setup fails before any job is submitted: the cluster stays up (SkyPilot keeps it for
                         debugging, autodown unset)
    answer-lost          the job is submitted and runs, but `sky launch` dies before it prints the job's ID; the
                         next `sky logs` follows it to SUCCEEDED
and scenario.json's "flaky" ({"cancel": 2, ...}) makes each of those commands fail that many times first, as when
SkyPilot's API server cannot be reached (exit 1, its ApiServerConnectionError).
Called as `sky_standin.py --as-ssh HOST COMMAND` (rsync's RSYNC_RSH), it runs what rsync asks of node 0 in the
cluster's home, as SkyPilot's ssh config makes `ssh CLUSTER` reach the head node.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

RESET = "\x1b[0m"
ROOT = Path(os.environ.get("GRPO_SKY_STANDIN", "."))
FOLLOW_BOUND_S = 120.0   # a followed job that never ends: the stand-in gives up rather than hang a test
TERMINAL = ("SUCCEEDED", "FAILED", "FAILED_SETUP", "CANCELLED")
EXIT = {"SUCCEEDED": 0, "FAILED": 100, "FAILED_SETUP": 100, "CANCELLED": 103}  # sky.exceptions.JobExitCode
NOT_FINISHED, NOT_FOUND = 101, 102


@contextmanager
def state():
    """The clusters, locked against the other `sky` commands running at the same time (grpo stop's, grpo run's)."""
    ROOT.mkdir(parents=True, exist_ok=True)
    with (ROOT / "state.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = ROOT / "state.json"
        clusters = json.loads(path.read_text()) if path.exists() else {}
        yield clusters
        path.write_text(json.dumps(clusters, indent=1))


def scenario() -> dict:
    path = ROOT / "scenario.json"
    return json.loads(path.read_text()) if path.exists() else {"job": "succeeds"}


def home(cluster: str) -> Path:
    return ROOT / "clusters" / cluster / "home"


def does_not_exist(cluster: str, usage: bool = False) -> int:
    # Raised as ClusterDoesNotExist (a ValueError): `sky cancel` turns it into click's usage error (exit 2).
    if usage:
        print(f"Usage: sky cancel [OPTIONS] CLUSTER [JOBS]...\nTry 'sky cancel -h' for help.\n\n"
              f"Error: Cluster {cluster!r} does not exist.", file=sys.stderr)
        return 2
    print(f"sky.exceptions.ClusterDoesNotExist: Cluster {cluster!r} does not exist.", file=sys.stderr)
    return 1


def job_status(cluster: str, job: int) -> str | None:
    with state() as clusters:
        for record in clusters.get(cluster, {}).get("jobs", []):
            if record["job_id"] == job:
                return record["status"]
    return None


def set_status(cluster: str, job: int, status: str) -> None:
    with state() as clusters:
        for record in clusters[cluster]["jobs"]:
            if record["job_id"] == job:
                record["status"] = status
                record["end_at"] = time.time() if status in TERMINAL else None


def follow(cluster: str, job: int) -> int:
    """Stream the job until it ends (SkyPilot's tail_logs): its exit code."""
    deadline = time.monotonic() + FOLLOW_BOUND_S
    while (status := job_status(cluster, job)) not in TERMINAL:
        if status is None:
            return NOT_FOUND
        if time.monotonic() > deadline:
            print("stand-in: the job never ended", file=sys.stderr)
            return NOT_FINISHED
        time.sleep(0.05)
    print(f"✓ Job finished (status: {status}).", flush=True)
    return EXIT[status]


def run_job(cluster: str, job: int) -> None:
    """What node 0 of the job writes into its copy of the run directory."""
    workdir = home(cluster) / "sky_workdir"
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (workdir / "logs" / "trainer-node0.log").write_text("[grpo-launch] rank 0 of 1\n")
    print("(head, rank=0, pid=4242) [grpo-launch] rank 0 of 1", flush=True)


def launch(args: argparse.Namespace) -> int:
    cluster, what = args.cluster, scenario()["job"]
    print("Considered resources (1 node):\n  AWS  g5.xlarge  4  16  A10G:1  us-east-1", flush=True)
    with state() as clusters:
        existed = cluster in clusters
        record = clusters.setdefault(cluster, {"status": "UP", "jobs": []})
        record["autostop"] = {"down": args.down, "idle_minutes": args.idle_minutes_to_autostop}
    if not existed:
        print(f"{RESET}⚙︎ Launching on AWS us-east-1 (us-east-1a).", flush=True)
        print(f"✓ Cluster launched: {cluster}.  View logs: sky logs --provision {cluster}", flush=True)
    # SkyPilot's workdir sync: rsync -a of the working directory, nothing on the node deleted
    shutil.copytree(Path.cwd(), home(cluster) / "sky_workdir", dirs_exist_ok=True)
    print(f"{RESET}⚙︎ Syncing files.\n  Syncing workdir (to 1 node): . -> ~/sky_workdir\n✓ Synced workdir.", flush=True)
    if what == "setup-fails":
        print("✗ Failed to run setup command.\nsky.exceptions.CommandError: Command pip install failed with return "
              "code 1.", file=sys.stderr, flush=True)
        return 1
    with state() as clusters:
        jobs = clusters[cluster]["jobs"]
        job = len(jobs) + 1
        jobs.append({"job_id": job, "job_name": "grpo", "username": "me", "user_hash": "abcd1234",
                     "submitted_at": time.time(), "start_at": time.time(), "end_at": None,
                     "resources": "1x[A10G:1]", "status": "RUNNING", "log_path": f"~/sky_logs/{job}"})
    if what == "answer-lost":
        print("Traceback (most recent call last):\nKeyboardInterrupt", file=sys.stderr, flush=True)
        return 1
    print(f"{RESET}⚙︎ Job submitted, ID: {job}", flush=True)
    print("├── Waiting for task resources on 1 node.\n└── Job started. Streaming logs... (Ctrl-C to exit log "
          "streaming; job will not be killed)", flush=True)
    if args.detach_run:
        return 0
    if what == "stream-drops":
        print("sky.exceptions.ApiServerConnectionError: Could not connect to SkyPilot API server at "
              "http://127.0.0.1:46580. Please ensure that the server is running.", file=sys.stderr, flush=True)
        return 1
    if what in ("succeeds", "fails"):
        run_job(cluster, job)
        set_status(cluster, job, "SUCCEEDED" if what == "succeeds" else "FAILED")
    code = follow(cluster, job)
    print(f"\n📋 Useful Commands\nJob ID: {job}\n├── To cancel the job:\t\tsky cancel {cluster} {job}\n"
          f"├── To stream job logs:\t\tsky logs {cluster} {job}\n└── To view job queue:\t\tsky queue {cluster}\n"
          f"Cluster name: {cluster}\n└── To teardown the cluster:\tsky down {cluster}", flush=True)
    return code


def logs(args: argparse.Namespace) -> int:
    with state() as clusters:
        exists = args.cluster in clusters
    if not exists:
        return does_not_exist(args.cluster)
    job = int(args.job_ids[0])
    status = job_status(args.cluster, job)
    if args.status:
        if status is None:
            print(f"Job {job} not found", flush=True)
            return NOT_FOUND
        print(f"Job {job}: {status}", flush=True)
        return EXIT.get(status, NOT_FINISHED)
    print(f"Tailing logs of job {job} on cluster {args.cluster!r}...", flush=True)
    if status == "RUNNING" and scenario()["job"] in ("stream-drops", "answer-lost"):
        run_job(args.cluster, job)
        set_status(args.cluster, job, "SUCCEEDED")
    return follow(args.cluster, job)


def cancel(args: argparse.Namespace) -> int:
    with state() as clusters:
        if args.cluster not in clusters:
            return does_not_exist(args.cluster, usage=True)
        jobs = clusters[args.cluster]["jobs"]
        chosen = [r for r in jobs if args.all or r["job_id"] in args.jobs]
        print(f"Cancelling jobs ({', '.join(str(r['job_id']) for r in chosen)}) on cluster {args.cluster!r}...")
        for r in chosen:
            if r["status"] not in TERMINAL:
                r["status"], r["end_at"] = "CANCELLED", time.time()
    return 0


def queue(args: argparse.Namespace) -> int:
    with state() as clusters:
        record = clusters.get(args.cluster)
    if args.output != "json":
        print("stand-in: only --output json", file=sys.stderr)
        return 2
    print(f"Fetching job queue for: {args.cluster}")
    if record is None:
        print(f"Failed to get the job queue for cluster {args.cluster!r}.\n  ClusterDoesNotExist: Cluster "
              f"{args.cluster!r} does not exist.")
        print(json.dumps({}, indent=2))
        return 0
    jobs = [r for r in record["jobs"] if not (args.skip_finished and r["status"] in TERMINAL)]
    print(json.dumps({args.cluster: jobs}, indent=2))
    return 0


def down(args: argparse.Namespace) -> int:
    with state() as clusters:
        gone = clusters.pop(args.cluster, None) is None
    if gone:
        print("Cluster(s) not found (tip: see `sky status`).")
        return 0
    shutil.rmtree(ROOT / "clusters" / args.cluster, ignore_errors=True)
    print(f"\nTerminating cluster {args.cluster}...done.")
    return 0


def ssh(argv: list[str]) -> int:
    """`ssh [options] HOST COMMAND...` as rsync runs it (RSYNC_RSH): COMMAND in node 0's home, as its shell would."""
    while argv and argv[0].startswith("-"):
        argv = argv[2:] if argv[0] in ("-l", "-p", "-o", "-i") else argv[1:]
    host, command = argv[0], " ".join(argv[1:])
    if not home(host).is_dir():
        print(f"ssh: Could not resolve hostname {host}: Name or service not known", file=sys.stderr)
        return 255
    return subprocess.run(["sh", "-c", command], cwd=home(host), env={**os.environ, "HOME": str(home(host))}).returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["--as-ssh"]:
        return ssh(argv[1:])
    with (ROOT / "calls.jsonl").open("a") as calls:
        calls.write(json.dumps({"argv": ["sky", *argv], "cwd": os.getcwd()}) + "\n")
    parser = argparse.ArgumentParser(prog="sky")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("launch")
    p.add_argument("--yes", "-y", action="store_true")
    p.add_argument("--cluster", "-c", required=True)
    p.add_argument("--down", action="store_true")
    p.add_argument("--idle-minutes-to-autostop", "-i", type=int)
    p.add_argument("--detach-run", "-d", action="store_true")
    p.add_argument("entrypoint")
    p.set_defaults(run=launch)
    p = commands.add_parser("logs")
    p.add_argument("--status", action="store_true")
    p.add_argument("cluster")
    p.add_argument("job_ids", nargs=1)
    p.set_defaults(run=logs)
    p = commands.add_parser("cancel")
    p.add_argument("--yes", "-y", action="store_true")
    p.add_argument("--all", "-a", action="store_true")
    p.add_argument("cluster")
    p.add_argument("jobs", nargs="*", type=int)
    p.set_defaults(run=cancel)
    p = commands.add_parser("queue")
    p.add_argument("--skip-finished", "-s", action="store_true")
    p.add_argument("--output", "-o", default="table")
    p.add_argument("cluster")
    p.set_defaults(run=queue)
    p = commands.add_parser("down")
    p.add_argument("--yes", "-y", action="store_true")
    p.add_argument("cluster")
    p.set_defaults(run=down)
    args = parser.parse_args(argv)
    if flaky(args.command):
        print("sky.exceptions.ApiServerConnectionError: Could not connect to SkyPilot API server at "
              "http://127.0.0.1:46580. Please ensure that the server is running.", file=sys.stderr)
        return 1
    return args.run(args)


def flaky(command: str) -> bool:
    """Whether this call of `command` is one of the failures scenario.json asks for."""
    with state():  # the lock, for the count
        path = ROOT / "flaky.json"
        failed = json.loads(path.read_text()) if path.exists() else {}
        if failed.get(command, 0) >= scenario().get("flaky", {}).get(command, 0):
            return False
        path.write_text(json.dumps({**failed, command: failed.get(command, 0) + 1}))
        return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
