"""A stand-in for the Hugging Face Jobs API and its Storage Buckets, for the tests of scheduler=hf-jobs: no test
here can reach the Hub. It lives in tests/ and stands in for nothing else.

It serves, on loopback (`HF_ENDPOINT`), only the routes huggingface_hub 1.33's own client calls for grpo-launch:

    GET  /api/whoami-v2                    whoami (the namespace, when scheduler.hf_jobs.namespace is null)
    POST /api/buckets/{ns}/{name}          create_bucket (409 when it exists, which exist_ok accepts)
    POST /api/jobs/{ns}                    run_job: the request the library built, kept in `record`
    GET  /api/jobs/{ns}                    list_jobs: a JSON list of Job infos, `label=KEY=VALUE` and `stage=STAGE`
                                           filters (each may repeat), one page (no `Link` header)
    GET  /api/jobs/{ns}/{id}               inspect_job (and the end-of-stream check of fetch_job_logs)
    GET  /api/jobs/{ns}/{id}/logs          fetch_job_logs: server-sent events, `tail`, held open while the Job runs
    POST /api/jobs/{ns}/{id}/cancel        cancel_job

Every request must carry a Bearer token, as on the Hub. Bucket transfers speak Xet, which no stand-in should speak:
`copy_transfer` replaces grpo-launch's one transfer function (`bucket_transfer`) by a copy between a local directory
and the bucket's directory here (root/buckets/NS/NAME/...), by huggingface_hub's sync rule (a file is sent when the
receiver lacks it, its size differs or the source is newer; an upload keeps the file's time, a download's file is
new), with its include/exclude patterns; each transfer is logged (`transfers(root)`), so a test counts what was sent.

Faults, for the tests and the fault-matrix benchmark (benchmarks/faults.py): `standin.faults = Faults(...)` makes it
answer some requests as the Hub does when it struggles: a 5xx, a 429 with `Retry-After`, a connection closed without
an answer, an answer held past the client's timeout, or a request done whose answer is lost (a Job made, its ID never
told); and it can cut every log stream after a while, cleanly, as a proxy ends an hours-long response. The choice is
deterministic (every Nth request, or a seeded draw); `standin.injected` counts what was injected, by kind, and
`standin.requests` every request, by route.

Each Job it accepts runs as a real local process, its real command, its image being this machine's environment
(`image_env`: the tests' PATH and Python). Like a container, it gets namespaces of its own (root needed, as for the
Slurm tests):
- a network namespace with its own address on a bridge (so each Job's port 8000 is its own, as every Job exposes
  the same port), reachable from the tests at its exposed URL http://ADDRESS:PORT (the Hub's is
  https://ID--PORT.hf.jobs, behind its proxy);
- a mount namespace with its bucket folder bind-mounted at the Job's mount path, read-only when the volume says so
  (the kernel refuses writes), and /etc/hosts listing its network group's members at `HF_NETWORK_GROUP_PREFIX` +
  alias, the variables set as HF Jobs set them.
A Job whose command exits 0 is COMPLETED, otherwise ERROR; cancelling it sends SIGTERM to its processes and SIGKILL
to whatever is left in its network namespace after a grace period; when its command ends, nothing of it stays.
`record` lists what happened to each Job (submitted with what, running, ended how), which the tests read.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

GRACE_S = 10.0
NETWORK_SETUP_S = 10.0
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
TRANSFERS_LOG = "transfers.jsonl"  # under the stand-in's root: one line per bucket transfer, the files it sent
SYNC_WINDOW_S = 1.0                # huggingface_hub's sync: a source newer by less than this is not newer

# The routes by the name of the library's call, and the faults a request of one may meet.
ROUTES = ("whoami", "create_bucket", "run_job", "list_jobs", "inspect_job", "logs", "cancel_job")
STATUS_FAULTS = ("500", "502", "503", "429")  # answered with that status, nothing done (429 with Retry-After)
FAULTS = (*STATUS_FAULTS,
          "close",   # the connection closed without an answer, nothing done
          "hold",    # the answer held for `hold_s` (past the client's timeout), the connection closed, nothing done
          "lost")    # the request done (a Job made, a cancel done), then the connection closed without the answer
LOG_DROP = "log-drop"  # `injected`'s count of log streams cut while their Job ran


@dataclass
class Faults:
    """Which requests the stand-in answers wrongly, the same way on every run: every `every`-th request to one of
    `routes` (or, with `rate`, each with that probability, drawn from `seed`), at most `limit` of them, each fault's
    kind the next of `kinds` in turn. `drop_logs_after_s`: every log stream is ended, cleanly, once it has been open
    that long while its Job runs (huggingface_hub then returns as if the log had ended)."""

    every: int = 0
    rate: float = 0.0
    seed: int = 0
    kinds: tuple[str, ...] = ("500", "503", "429", "close")
    routes: tuple[str, ...] = ROUTES
    limit: int | None = None
    retry_after_s: int = 1             # a 429's Retry-After, in seconds
    hold_s: float = 5.0                # how long "hold" holds a request
    drop_logs_after_s: float | None = None

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in FAULTS] + [r for r in self.routes if r not in ROUTES]
        if unknown or not self.kinds:
            raise ValueError(f"Faults: {unknown or 'no kinds'}; kinds are {FAULTS}, routes {ROUTES}")
        self._draw = random.Random(self.seed)
        self._seen = 0                 # requests to `routes` so far
        self._made = 0                 # faults injected so far

    def next(self, route: str) -> str | None:
        """The fault this request to `route` meets, or None (called under the stand-in's lock: one order)."""
        if route not in self.routes or (self.limit is not None and self._made >= self.limit):
            return None
        self._seen += 1
        hit = (self.every > 0 and self._seen % self.every == 0) or (self.rate > 0 and self._draw.random() < self.rate)
        if not hit:
            return None
        kind = self.kinds[self._made % len(self.kinds)]
        self._made += 1
        return kind

# What runs inside a Job's namespaces before its command: wait for the network the stand-in gives it, mount its
# bucket folder at the mount path and its group's hosts file at /etc/hosts, then the command itself.
INSIDE = """set -e
for _ in $(seq 1 200); do ip -4 -o addr show dev eth0 2>/dev/null | grep -q inet && break; sleep 0.05; done
ip -4 -o addr show dev eth0 | grep -q inet || {{ echo "stand-in: no network" >&2; exit 97; }}
{mounts}
cd {workdir}
exec "$@"
"""


def missing() -> str | None:
    """Why the stand-in cannot run Jobs here, or None."""
    if os.geteuid() != 0:
        return "the hf-jobs stand-in runs each Job in namespaces of its own: it needs root"
    for tool in ("unshare", "nsenter", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"the hf-jobs stand-in needs {tool}"
    probe = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode:
        return f"network and mount namespaces are not available here: {probe.stderr.decode().strip()}"
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # the Hub's format


def _netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _in_netns(inode: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _netns(int(entry)) == inode:
            found.append(int(entry))
    return found


@dataclass
class Job:
    id: str
    namespace: str
    spec: dict
    created: str
    dir: Path
    address: str = ""
    stage: str = "SCHEDULING"
    message: str | None = None
    process: subprocess.Popen | None = None
    netns: int | None = None
    netns_fd: int | None = None   # its network namespace held open: its inode is not another's while the test runs
    veth: str = ""
    cancelled: bool = False
    ended_at: float | None = None
    events: list = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.dir / "log"

    @property
    def ended(self) -> bool:
        return self.stage in TERMINAL

    def info(self) -> dict:
        expose = (self.spec.get("expose") or {}).get("ports") or []
        return {
            "id": self.id, "createdAt": self.created, "dockerImage": self.spec.get("dockerImage"),
            "spaceId": self.spec.get("spaceId"), "command": self.spec.get("command"), "arguments": [],
            "environment": self.spec.get("environment") or {},
            "secrets": {k: None for k in (self.spec.get("secrets") or {})},  # values never come back
            "flavor": self.spec.get("flavor"), "labels": self.spec.get("labels"), "volumes": self.spec.get("volumes"),
            "status": {"stage": self.stage, "message": self.message,
                       "exposeUrls": [f"http://{self.address}:{p}" for p in expose] if expose and self.address
                       else None},
            "owner": {"id": "standin", "name": self.namespace, "type": "user"},
            "network": self.spec.get("network"),
        }


class StandIn:
    """The Jobs API and buckets on loopback; `start()` returns its endpoint, `stop()` ends every Job and the
    network."""

    def __init__(self, root: Path, *, user: str = "standin-user", image_env: dict[str, str] | None = None) -> None:
        self.root = root
        self.user = user
        self.image_env = image_env or {}
        self.jobs: dict[str, Job] = {}
        self.record: list[tuple[float, str, str, str]] = []   # (time, job id, what, detail)
        self.lock = threading.RLock()
        self.buckets = root / "buckets"
        self.buckets.mkdir(parents=True, exist_ok=True)
        tag = os.getpid() % 10000
        self.tag = tag
        self.bridge = f"grpohf{tag}"
        self.subnet = f"10.{200 + tag % 50}.{tag % 250}"
        self.next_host = 2
        self.server: ThreadingHTTPServer | None = None
        self.faults = Faults()                    # none: set one to inject them (see Faults)
        self.injected: Counter[str] = Counter()   # faults injected so far, by kind (and LOG_DROP)
        self.requests: Counter[str] = Counter()   # requests so far, by route

    def fault(self, route: str) -> str | None:
        """Count a request to `route`; the fault it meets, if one (counted in `injected`)."""
        with self.lock:
            self.requests[route] += 1
            kind = self.faults.next(route)
            if kind is not None:
                self.injected[kind] += 1
            return kind

    def drop_log(self, opened: float, job: Job) -> bool:
        """Whether a log stream of `job` opened at `opened` (monotonic) is to be cut now (counted in `injected`)."""
        after = self.faults.drop_logs_after_s
        if after is None or job.ended or time.monotonic() - opened < after:
            return False
        with self.lock:
            self.injected[LOG_DROP] += 1
        return True

    def listed(self, namespace: str, labels: list[str], stages: list[str]) -> list[dict]:
        """The Jobs of `namespace` carrying every `KEY=VALUE` of `labels`, in one of `stages` (any when empty)."""
        wanted = [label.partition("=")[::2] for label in labels]
        return [j.info() for j in list(self.jobs.values()) if j.namespace == namespace
                and all((j.spec.get("labels") or {}).get(k) == v for k, v in wanted)
                and (not stages or j.stage in stages)]

    # -- lifecycle --------------------------------------------------------------------------------------------------
    def start(self) -> str:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)  # left by a killed session
        for argv in (["ip", "link", "add", self.bridge, "type", "bridge"],
                     ["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge],
                     ["ip", "link", "set", self.bridge, "up"]):
            subprocess.run(argv, check=True, capture_output=True)
        handler = type("Handler", (_Handler,), {"standin": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="hf-jobs-standin").start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        for job in list(self.jobs.values()):
            if not job.ended:
                self.cancel(job.id)
        deadline = time.monotonic() + GRACE_S + 5
        while time.monotonic() < deadline and any(not j.ended for j in self.jobs.values()):
            time.sleep(0.1)
        if self.server is not None:
            self.server.shutdown()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for job in self.jobs.values():
            if job.netns_fd is not None:
                os.close(job.netns_fd)

    def note(self, job_id: str, what: str, detail: str = "") -> None:
        with self.lock:
            self.record.append((time.time(), job_id, what, detail))

    def bucket_dir(self, bucket: str) -> Path:
        return self.buckets / bucket

    def processes_left(self) -> list[str]:
        """The command lines of every process still in a Job's network namespace."""
        left = []
        for job in self.jobs.values():
            if job.netns_fd is not None:
                for pid in _in_netns(job.netns):
                    try:
                        left.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
                    except OSError:
                        pass
        return left

    # -- Jobs -------------------------------------------------------------------------------------------------------
    def submit(self, namespace: str, spec: dict) -> Job:
        job = Job(id=uuid.uuid4().hex[:24], namespace=namespace, spec=spec, created=_now(),
                  dir=self.root / "jobs" / uuid.uuid4().hex[:8])
        job.dir.mkdir(parents=True)
        with self.lock:
            self.jobs[job.id] = job
            job.address = f"{self.subnet}.{self.next_host}"
            self.next_host += 1
        self.note(job.id, "submitted", json.dumps(spec))
        threading.Thread(target=self._run, args=(job,), daemon=True, name=f"job-{job.id}").start()
        return job

    def _hosts_file(self, group: str) -> Path:
        return self.root / "groups" / f"{group}.hosts"

    def _prefix(self, group: str) -> str:
        return f"{group}."  # HF_NETWORK_GROUP_PREFIX ends with its separator: prefix + alias is a member's host

    def _write_hosts(self, group: str) -> None:
        """The group's members by alias, rewritten in place (every member mounts this very file)."""
        lines = ["127.0.0.1 localhost"]
        members = [j for j in self.jobs.values() if (j.spec.get("network") or {}).get("group") == group
                   and not j.ended]
        for j in members:
            lines += [f"{j.address} {self._prefix(group)}{alias}" for alias in j.spec["network"].get("aliases", [])]
        path = self._hosts_file(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as f:  # same inode: the bind mounts see the change
            f.seek(0)
            f.truncate()
            f.write("\n".join(lines) + "\n")

    def _mounts(self, job: Job) -> str:
        lines = []
        for volume in job.spec.get("volumes") or []:
            source = self.bucket_dir(volume["source"]) / (volume.get("path") or "")
            target = shlex.quote(volume["mountPath"])
            if not source.is_dir():
                lines.append(f"echo 'stand-in: the volume {volume['source']}/{volume.get('path') or ''} does not "
                             f"exist' >&2; exit 98")
                continue
            lines.append(f"mkdir -p {target} && mount --bind {shlex.quote(str(source))} {target}")
            if volume.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {target}")
        group = (job.spec.get("network") or {}).get("group")
        if group:
            lines.append(f"mount --bind {shlex.quote(str(self._hosts_file(group)))} /etc/hosts")
        return "\n".join(lines)

    def _environment(self, job: Job) -> dict[str, str]:
        env = dict(self.image_env)
        env.update(job.spec.get("environment") or {})
        env.update(job.spec.get("secrets") or {})
        group = (job.spec.get("network") or {}).get("group")
        if group:
            env["HF_NETWORK_GROUP_PREFIX"] = self._prefix(group)
            env["HF_NETWORK_GROUP_HOSTNAME"] = f"{self._prefix(group)}members"
        return env

    def _network(self, job: Job, pid: int) -> None:
        """A veth pair: one end on the bridge, the other the Job's eth0 with its own address."""
        own = _netns(os.getpid())
        deadline = time.monotonic() + NETWORK_SETUP_S
        while _netns(pid) in (own, None) and time.monotonic() < deadline:  # unshare(2) may not have happened yet
            time.sleep(0.01)
        job.netns = _netns(pid)
        if job.netns not in (own, None):  # held until the stand-in stops: a freed namespace's inode is reused, and
            with contextlib.suppress(OSError):  # a sweep by it would kill another Job's processes
                job.netns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        number = job.address.rsplit(".", 1)[1]
        job.veth, job_end = f"gh{self.tag}x{number}", f"gj{self.tag}x{number}"
        for argv in (["ip", "link", "add", job.veth, "type", "veth", "peer", "name", job_end],
                     ["ip", "link", "set", job_end, "netns", str(pid)],
                     ["ip", "link", "set", job.veth, "master", self.bridge, "up"],
                     ["nsenter", "-t", str(pid), "-n", "ip", "link", "set", "lo", "up"],
                     ["nsenter", "-t", str(pid), "-n", "ip", "link", "set", job_end, "name", "eth0"],
                     ["nsenter", "-t", str(pid), "-n", "ip", "addr", "add", f"{job.address}/24", "dev", "eth0"],
                     ["nsenter", "-t", str(pid), "-n", "ip", "link", "set", "eth0", "up"]):
            subprocess.run(argv, check=True, capture_output=True)

    def _run(self, job: Job) -> None:
        group = (job.spec.get("network") or {}).get("group")
        with self.lock:
            if group:
                self._write_hosts(group)
        workdir = job.dir / "workdir"
        workdir.mkdir()
        inside = INSIDE.format(mounts=self._mounts(job), workdir=shlex.quote(str(workdir)))
        argv = ["unshare", "--net", "--mount", "--propagation", "private", "--", "bash", "-c", inside, "job",
                *job.spec["command"]]
        timeout = job.spec.get("timeoutSeconds")
        with job.log.open("w") as log:
            job.process = subprocess.Popen(argv, env=self._environment(job), stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir)
        try:
            self._network(job, job.process.pid)
        except subprocess.CalledProcessError as e:
            job.message = f"stand-in: network setup failed: {e.stderr.decode().strip()}"
            self.cancel(job.id)
        if not job.cancelled:
            job.stage = "RUNNING"
            self.note(job.id, "running", job.address)
        started = time.monotonic()
        while job.process.poll() is None:
            if timeout and time.monotonic() - started > timeout and not job.cancelled:
                job.message = "the Job reached its timeout"
                self._kill(job)
            time.sleep(0.1)
        code = job.process.returncode
        self._sweep(job)
        with self.lock:
            if job.cancelled:
                job.stage = "CANCELED"
            elif code == 0:
                job.stage = "COMPLETED"
            else:
                job.stage, job.message = "ERROR", job.message or f"the command exited with code {code}"
            job.ended_at = time.time()
            self.note(job.id, "ended", job.stage)
            if group:
                self._write_hosts(group)

    def _kill(self, job: Job) -> None:
        """SIGTERM to the Job's processes, SIGKILL to anything left in its network after the grace period."""
        try:
            os.killpg(job.process.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        threading.Thread(target=self._kill_later, args=(job,), daemon=True).start()

    def _kill_later(self, job: Job) -> None:
        deadline = time.monotonic() + GRACE_S
        while job.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self._sweep(job)

    def _sweep(self, job: Job) -> None:
        """Nothing of a Job outlives it: every process left in its network namespace is killed."""
        if job.netns_fd is None:  # (no namespace of its own yet: nothing of it is in one)
            return
        for _ in range(50):
            pids = _in_netns(job.netns)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)

    def crash(self, job_id: str) -> None:
        """The Job's machine dies: every process of it killed at once (its stage becomes ERROR, as on the Hub)."""
        job = self.jobs[job_id]
        job.message = "stand-in: the machine died"
        self.note(job_id, "crashed")
        self._sweep(job)

    def by_name(self, name: str) -> list[Job]:
        """The Jobs whose `name` label ends with `name`, in submit order."""
        return [j for j in self.jobs.values() if (j.spec.get("labels") or {}).get("name", "").endswith(f"-{name}")]

    def cancel(self, job_id: str) -> None:
        job = self.jobs[job_id]
        if job.ended or job.cancelled:
            return
        job.cancelled = True
        self.note(job_id, "cancel requested")
        if job.process is not None:
            self._kill(job)


def _selected(path: str, include: list[str] | None, exclude: list[str] | None) -> bool:
    """huggingface_hub's sync filter (fnmatch patterns on the path under the folder): an exclude first, then an
    include; with includes, a path none matches is left out."""
    if any(fnmatch.fnmatch(path, p) for p in exclude or ()):
        return False
    return not include or any(fnmatch.fnmatch(path, p) for p in include)


def _sent(source: Path, target: Path) -> bool:
    """huggingface_hub's sync rule: the receiver lacks the file, its size differs, or the source is newer."""
    if not target.exists():
        return True
    mine, theirs = source.lstat(), target.lstat()
    return mine.st_size != theirs.st_size or mine.st_mtime - theirs.st_mtime > SYNC_WINDOW_S


def copy_transfer(root: Path):
    """`bucket_transfer` as a copy between a local path and the stand-in's bucket directory (`hf://buckets/NS/NAME/
    PATH` is root/buckets/NS/NAME/PATH): what Xet does to the bytes, without Xet; each transfer logged in
    root/TRANSFERS_LOG."""
    prefix = "hf://buckets/"

    def transfer(api, source: str, dest: str, *, include: list[str] | None = None,
                 exclude: list[str] | None = None) -> None:
        local = lambda uri: root / "buckets" / uri.removeprefix(prefix) if uri.startswith(prefix) else Path(uri)  # noqa: E731
        src, dst = local(source), local(dest)
        upload = dest.startswith(prefix)
        files = [src] if src.is_file() else [Path(d) / name for d, dirs, names in os.walk(src)
                                             for name in [*names, *(n for n in dirs if (Path(d) / n).is_symlink())]]
        sent = []
        for path in sorted(files):
            relative = path.name if path == src else path.relative_to(src).as_posix()
            target = dst if path == src and not dst.is_dir() else dst / relative
            if not _selected(relative, include, exclude) or not _sent(path, target):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():
                target.unlink(missing_ok=True)
                target.symlink_to(os.readlink(path))
            else:  # an upload keeps the file's time (the library sends it); a downloaded file is written now
                (shutil.copy2 if upload else shutil.copyfile)(path, target)
            sent.append(relative)
        with (root / TRANSFERS_LOG).open("a") as log:
            log.write(json.dumps({"source": source, "dest": dest, "upload": upload, "files": sent}) + "\n")

    return transfer


def transfers(root: Path) -> list[dict]:
    """Every transfer `copy_transfer` made under `root`, in order: source, dest, upload (to the bucket) and the files
    it sent (paths under the folder)."""
    log = root / TRANSFERS_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class _Handler(BaseHTTPRequestHandler):
    standin: StandIn
    protocol_version = "HTTP/1.1"
    lost = False  # this request's answer is to be lost (the "lost" fault): done, never told

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body, headers: dict[str, str] | None = None) -> None:
        if self.lost:
            self.close_connection = True
            return
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization", "").startswith("Bearer ") and len(self.headers["Authorization"]) > 7:
            return True
        self._json(401, {"error": "Invalid credentials in Authorization header"})
        return False

    def _parts(self) -> list[str]:
        return [p for p in urlparse(self.path).path.split("/") if p]

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}") if length else {}

    def _route(self, method: str, parts: list[str]) -> str | None:
        """The library's call this request is (ROUTES), or None: no route of the stand-in."""
        if parts == ["api", "whoami-v2"]:
            return "whoami" if method == "GET" else None
        if len(parts) == 4 and parts[:2] == ["api", "buckets"]:
            return "create_bucket" if method == "POST" else None
        if len(parts) < 3 or parts[:2] != ["api", "jobs"]:
            return None
        if len(parts) == 3:
            return "run_job" if method == "POST" else "list_jobs"
        if len(parts) == 4:
            return "inspect_job" if method == "GET" else None
        return {("GET", "logs"): "logs", ("POST", "cancel"): "cancel_job"}.get((method, parts[4]))

    def _faulted(self, route: str | None) -> bool:
        """Answer this request as the fault it meets, if one: whether it was answered so (nothing more to do)."""
        kind = self.standin.fault(route) if route else None
        if kind is None:
            return False
        if kind in STATUS_FAULTS:
            retry = {"Retry-After": str(self.standin.faults.retry_after_s)} if kind == "429" else {}
            self._json(int(kind), {"error": f"stand-in: an injected {kind}"}, retry)
            return True
        if kind == "lost":
            self.lost = True
            return False
        if kind == "hold":
            time.sleep(self.standin.faults.hold_s)
        self.close_connection = True  # "close", and "hold" once held: no answer
        return True

    def do_GET(self) -> None:  # noqa: N802
        parts, s = self._parts(), self.standin
        if self._faulted(self._route("GET", parts)) or not self._authorized():
            return
        if parts == ["api", "whoami-v2"]:
            return self._json(200, {"type": "user", "name": s.user, "auth": {"type": "access_token"}})
        if len(parts) == 3 and parts[:2] == ["api", "jobs"]:
            query = parse_qs(urlparse(self.path).query)
            return self._json(200, s.listed(parts[2], query.get("label", []), query.get("stage", [])))
        if len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] in s.jobs:
            return self._json(200, s.jobs[parts[3]].info())
        if len(parts) == 5 and parts[:2] == ["api", "jobs"] and parts[4] == "logs" and parts[3] in s.jobs:
            if self.lost:  # a stream whose answer is lost: the connection closed before it starts
                self.close_connection = True
                return
            tail = parse_qs(urlparse(self.path).query).get("tail")
            return self._logs(s.jobs[parts[3]], int(tail[0]) if tail else None)
        self._json(404, {"error": f"no route {self.path} in the stand-in"})

    def do_POST(self) -> None:  # noqa: N802
        parts, s = self._parts(), self.standin
        body = self._body()  # read first: an answer given before the body is read would leave it on the connection
        if self._faulted(self._route("POST", parts)) or not self._authorized():
            return
        if len(parts) == 4 and parts[:2] == ["api", "buckets"]:
            bucket = s.bucket_dir(f"{parts[2]}/{parts[3]}")
            url = f"{s.endpoint}/buckets/{parts[2]}/{parts[3]}"
            if bucket.is_dir():  # the client reads the url of a 409 too (create_bucket, exist_ok)
                return self._json(409, {"error": "You already created this bucket", "url": url})
            bucket.mkdir(parents=True)
            return self._json(200, {"url": url})
        if len(parts) == 3 and parts[:2] == ["api", "jobs"]:
            job = s.submit(parts[2], body)
            return self._json(200, job.info())
        if len(parts) == 5 and parts[:2] == ["api", "jobs"] and parts[4] == "cancel" and parts[3] in s.jobs:
            s.cancel(parts[3])
            return self._json(200, {})
        self._json(404, {"error": f"no route {self.path} in the stand-in"})

    def _logs(self, job: Job, tail: int | None) -> None:
        """The Job's output as server-sent events, held open (with keep-alives) while it runs; cut cleanly where
        the faults say (`Faults.drop_logs_after_s`)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent, keepalive, opened = 0, time.monotonic(), time.monotonic()
        lines = job.log.read_text(errors="replace").splitlines() if job.log.exists() else []
        if tail is not None:
            sent = max(0, len(lines) - tail)
        try:
            while True:
                ended = job.ended
                text = job.log.read_text(errors="replace") if job.log.exists() else ""
                complete = text.splitlines()[: text.count("\n")] if not ended else text.splitlines()
                for line in complete[sent:]:
                    event = json.dumps({"data": line, "timestamp": _now()})
                    self.wfile.write(f"data: {event}\n\n".encode())
                sent = max(sent, len(complete))
                self.wfile.flush()
                if ended or self.standin.drop_log(opened, job):
                    return
                if time.monotonic() - keepalive > 10:
                    self.wfile.write(b": keep-alive\n\n")
                    keepalive = time.monotonic()
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            return
