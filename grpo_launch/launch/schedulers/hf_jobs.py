"""scheduler=hf-jobs: the plan's Jobs on Hugging Face, through huggingface_hub's own client (`run_job`,
`inspect_job`, `fetch_job_logs`, `cancel_job`): the library builds every request.

`grpo run` builds what the Jobs cannot (a built-in model; a wheel of this grpo-launch for a supervisor Job to
install), uploads the run directory to its folder of the bucket, starts the vLLM Jobs and waits for each one's
`/health` through its exposed URL (with the token) within its bound, stopping everything when one ends before it
serves (naming it, with its log tail); then starts the supervisor Jobs (the trainer), follows every Job's log
through the console display, restarts a vLLM Job that dies while the trainer runs
(`placement.async_lora.max_restarts`: the same alias, so the proxy takes it back), and when the trainer Job ends,
fails, or Ctrl-C (SIGTERM, SIGHUP) comes, cancels every Job: nothing is left billing. The Job IDs are written to the
run directory as they are submitted, so `grpo stop RUN_DIR` cancels them from another terminal (and after a SIGKILL
of `grpo run`). At the end the bucket's copy of the run directory (logs, metrics, checkpoints) comes back into the
local one.

Transfers to and from the bucket go through one function, `bucket_transfer` (huggingface_hub's `sync_bucket`, which
speaks Xet): the tests replace it by a copy into their stand-in's bucket directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from grpo_launch.contracts.plan import JobSpec, Plan, Role
from grpo_launch.contracts.rundir import LOGS_DIR, WHEELS_DIR, Submitted, read_submitted, write_submitted
from grpo_launch.contracts.schedulers import DEFAULT_BUCKET_NAME, HfJobsSettings, run_group
from grpo_launch.errors import UserError
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.follow import node_failures
from grpo_launch.launch.result import EXIT_INTERRUPTED, TAIL_LINES, Failure, RunResult
from grpo_launch.launch.schedulers import hf_jobs_preflight
from grpo_launch.launch.schedulers.base import Launcher, Options, RunLogs
from grpo_launch.launch.supervisor import STOP_SIGNALS, Supervisor
from grpo_launch.launch.wheel import build_wheel

MIN_VERSION = (1, 32)               # huggingface_hub: Jobs with network groups (1.32), buckets and exposed ports
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
TICK_S = 0.2
HEALTH_POLL_S = 1.0
CANCEL_WAIT_S = 120.0               # after cancelling, how long `grpo run` waits for every Job to say it ended
PREFLIGHT_IMAGE = "python:3.12"
PREFLIGHT_FLAVOR = "cpu-basic"
PREFLIGHT_BEACONS = 5
PREFLIGHT_TIMEOUT = "30m"
PREFLIGHT_FILE = "preflight.py"


def bucket_transfer(api: Any, source: str, dest: str) -> None:
    """A local directory to a bucket folder (`hf://buckets/NS/NAME/PATH`), or back: huggingface_hub's sync."""
    api.sync_bucket(source, dest, quiet=True)


def _hub() -> Any:
    from huggingface_hub import HfApi

    return HfApi()


def _token() -> str | None:
    """The token the client sends: HF_TOKEN, else the one `hf auth login` saved."""
    from huggingface_hub import get_token

    return get_token()


def library_version() -> tuple[int, ...] | None:
    try:
        import huggingface_hub
    except ImportError:
        return None
    return tuple(int(part) for part in huggingface_hub.__version__.split(".")[:2])


@dataclass
class Running:
    """One Job as submitted, and what is known of it."""

    spec: JobSpec
    id: str
    log: Path
    since: float = field(default_factory=time.monotonic)
    stage: str = "SCHEDULING"
    message: str | None = None
    expose_urls: list[str] = field(default_factory=list)
    ready: bool = False
    restarts: int = 0

    @property
    def ended(self) -> bool:
        return self.stage in TERMINAL


class JobsRun:
    """One `grpo run` of a plan's Jobs, from the upload to the last cancel."""

    def __init__(self, plan: Plan, run_dir: Path, settings: HfJobsSettings, console: Console, options: Options):
        self.plan, self.run_dir, self.settings, self.options = plan, run_dir, settings, options
        self.api = _hub()
        self.namespace = settings.namespace or ""   # your account's, asked of the Hub when the run starts
        self.bucket = settings.bucket or ""
        self.group = run_group(plan.recipe, run_dir)
        names = [j.name for j in plan.scheduler.jobs]
        if options.preflight:
            names += ["preflight-writer", "preflight-reader"]
        self.display = ConsoleDisplay(console, names, verbose=options.verbose)
        self.events: queue.Queue = queue.Queue()
        self.jobs: dict[str, Running] = {}
        self.ids: list[str] = []
        self.failures: list[Failure] = []
        self.presses = 0
        roles = {p.name: p.role for p in plan.processes}
        self.trainers = {j.name for j in plan.scheduler.jobs if any(roles[p] == Role.TRAINER for p in j.processes)}
        self.trainer_failed = False

    # -- the Hub ------------------------------------------------------------------------------------------------
    def _secrets(self) -> dict[str, str]:
        values = {}
        for name in self.settings.secrets:
            values[name] = os.environ.get(name) or (_token() if name == "HF_TOKEN" else None)
        return values

    def _submit(self, spec: JobSpec, *, image: str | None = None, command: tuple[str, ...] | None = None,
                flavor: str | None = None, timeout: str | None = None) -> Running:
        from huggingface_hub import Volume

        job = self.api.run_job(
            image=image or spec.image, command=list(command or spec.command), env=dict(spec.env),
            secrets={k: v for k, v in self._secrets().items() if k in spec.secrets} or None,
            flavor=flavor or spec.flavor, timeout=timeout or self.settings.timeout,
            name=f"{self.group}-{spec.name}", labels={"grpo-run": self.group},
            volumes=[Volume(type="bucket", source=self.bucket, path=self.group, mount_path=self.settings.mount_path,
                            read_only=spec.read_only)],
            expose=list(spec.expose) or None, network_group=self.group, network_aliases=[spec.name],
            namespace=self.namespace)
        self.ids.append(job.id)
        write_submitted(self.run_dir, Submitted("hf-jobs", tuple(self.ids), time.time(), namespace=self.namespace,
                                                bucket=self.bucket, folder=self.group))
        running = Running(spec, job.id, self.run_dir / LOGS_DIR / f"{spec.name}.job.log")
        self.jobs[spec.name] = running
        self.display.say(f"{spec.name}: Job {job.id} ({spec.flavor}) {job.url}")
        threading.Thread(target=self._stream, args=(running,), daemon=True, name=f"logs-{spec.name}").start()
        return running

    def _stream(self, job: Running) -> None:
        """Every line the Job prints, as the Hub streams it, to the console and the Job's log here."""
        try:
            with job.log.open("a") as log:
                for line in self.api.fetch_job_logs(job_id=job.id, namespace=self.namespace, follow=True):
                    log.write(line + "\n")
                    log.flush()
                    self.events.put(("line", job.spec.name, line))
        except Exception as e:  # noqa: BLE001  (a stream that breaks costs lines, not the run: stages are polled)
            self.events.put(("say", f"{job.spec.name}: its log stream broke ({e})"))

    def _inspect(self, job: Running) -> None:
        info = self.api.inspect_job(job_id=job.id, namespace=self.namespace)
        stage, message = str(info.status.stage), info.status.message
        if stage != job.stage:
            self.display.say(f"{job.spec.name}: {stage}" + (f" ({message})" if message else ""))
        job.stage, job.message, job.expose_urls = stage, message, list(info.status.expose_urls or [])

    def _tail(self, job: Running) -> tuple[str, ...]:
        try:
            lines = list(self.api.fetch_job_logs(job_id=job.id, namespace=self.namespace, tail=TAIL_LINES))
        except Exception:  # noqa: BLE001
            lines = job.log.read_text(errors="replace").splitlines() if job.log.is_file() else []
        return tuple(lines[-TAIL_LINES:])

    def _watch_health(self, job: Running) -> None:
        """Poll the vLLM Job's exposed /health (with the token: the Jobs proxy requires it) until it answers."""
        headers = {"Authorization": f"Bearer {_token()}"}
        while not job.ready and not job.ended and self.presses == 0:
            for url in job.expose_urls:
                try:
                    request = urllib.request.Request(url.rstrip("/") + job.spec.health, headers=headers)
                    with urllib.request.urlopen(request, timeout=5) as response:
                        if response.status == 200:
                            self.events.put(("ready", job))
                            return
                except OSError:
                    pass
            time.sleep(HEALTH_POLL_S)

    def cancel_all(self) -> None:
        """Cancel every Job not ended, and wait (bounded) until each says it ended: nothing is left billing."""
        for job in self.jobs.values():
            if not job.ended:
                try:
                    self.api.cancel_job(job_id=job.id, namespace=self.namespace)
                except Exception as e:  # noqa: BLE001
                    self.display.say(f"{job.spec.name}: cancelling Job {job.id} failed: {e}", style="bold red")
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline and self.presses < 2 and any(not j.ended for j in self.jobs.values()):
            for job in self.jobs.values():
                if not job.ended:
                    try:
                        self._inspect(job)
                    except Exception as e:  # noqa: BLE001  (asked again until the bound; then named below)
                        self.display.say(f"{job.spec.name}: its stage could not be read: {e}", style="yellow")
            time.sleep(TICK_S)
        left = [f"{j.spec.name} (Job {j.id}, {j.stage})" for j in self.jobs.values() if not j.ended]
        if left:
            self.display.say(f"still not ended after {CANCEL_WAIT_S:g} s: {', '.join(left)}; `hf jobs cancel ID`",
                             style="bold red")

    # -- the run ------------------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        """What the Jobs cannot make themselves, into the run directory before it is uploaded."""
        if self.plan.prepare:  # a built-in model: the vLLM Jobs read it before any supervisor Job runs
            supervisor = Supervisor(self.plan, self.run_dir, nodes=(), console=self.display.console)
            asyncio.run(supervisor.prepare_only())
            if supervisor.failures:
                self.failures += supervisor.failures
                return
        if self.options.preflight:  # its two Jobs run it from the run directory, in a plain Python image
            (self.run_dir / PREFLIGHT_FILE).write_text(Path(hf_jobs_preflight.__file__).read_text())
        if self.settings.install_wheel and any(j.supervisor for j in self.plan.scheduler.jobs):
            wheel = build_wheel(self.run_dir / WHEELS_DIR)
            self.display.say(f"wheel of this grpo-launch for the supervisor Jobs: {wheel.relative_to(self.run_dir)}")

    @property
    def folder(self) -> str:
        return f"hf://buckets/{self.bucket}/{self.group}"

    def _upload(self) -> None:
        if not self.namespace:
            self.namespace = self.api.whoami()["name"]
        self.bucket = self.bucket or f"{self.namespace}/{DEFAULT_BUCKET_NAME}"
        self.api.create_bucket(self.bucket, private=True, exist_ok=True)
        self.display.say(f"uploading the run directory to {self.folder} (mounted at {self.settings.mount_path})")
        bucket_transfer(self.api, str(self.run_dir), self.folder)

    def _fail(self, job: Running, reason: str, code: int = 1) -> None:
        self.failures.append(Failure(job.spec.name, code, f"(Job {job.id}) {reason}", job.log, self._tail(job)))

    def _serving_ended(self, job: Running, training: bool) -> None:
        """A vLLM Job ended: before it served, the run stops; while training, it comes back if it may."""
        what = f"ended {job.stage}" + (f": {job.message}" if job.message else "")
        if not job.ready:
            self._fail(job, f"{what} before it served")
        elif training and job.restarts < job.spec.max_restarts:
            restarts = job.restarts + 1
            self.display.restarting(job.spec.name, f"(Job {job.id}) {what}", restarts, job.spec.max_restarts)
            again = self._submit(job.spec)
            again.restarts = restarts
            threading.Thread(target=self._watch_health, args=(again,), daemon=True).start()
        else:
            self._fail(job, f"{what} while the trainer runs")

    def _poll(self, training: bool) -> None:
        for job in list(self.jobs.values()):
            if job.ended:
                continue
            self._inspect(job)
            if not job.ended:
                if job.spec.health and not job.ready and time.monotonic() - job.since > job.spec.ready_timeout_s:
                    self._fail(job, f"did not answer {job.spec.health} within {job.spec.ready_timeout_s:g} s")
                continue
            if not job.spec.supervisor:
                self._serving_ended(job, training)
            elif job.stage != "COMPLETED":
                self.trainer_failed |= job.spec.name in self.trainers
                self._fail(job, f"ended {job.stage}" + (f": {job.message}" if job.message else ""))

    def _trained(self) -> bool:
        return all(self.jobs[name].ended for name in self.trainers)

    def _loop(self, until, *, training: bool) -> bool:
        """Show the Jobs' lines and states until `until()` holds (True), or something failed or a stop came."""
        next_poll = 0.0
        while not (self.failures or self.presses or until()):
            try:
                event = self.events.get(timeout=TICK_S)
            except queue.Empty:
                event = None
            if event is not None:
                kind = event[0]
                if kind == "line":
                    self.display.line(event[1], event[2])
                elif kind == "say":
                    self.display.say(event[1], style="yellow")
                elif kind == "ready" and not event[1].ready:
                    event[1].ready = True
                    self.display.ready(event[1].spec.name, time.monotonic() - event[1].since)
            if time.monotonic() >= next_poll:
                self._poll(training)
                next_poll = time.monotonic() + self.settings.poll_s
            self.display.tick()
        return not (self.failures or self.presses)

    def _preflight(self) -> bool:
        """Two CPU Jobs on the run's folder: one read-write, one read-only at the same path; a file one writes is
        seen by the other within a bound, and they reach each other over the network group."""
        if self.presses:
            return False
        mount = self.settings.mount_path
        script = f"{mount}/{PREFLIGHT_FILE}"
        self.display.say(f"preflight: 2 {PREFLIGHT_FLAVOR} Jobs check the bucket at {mount} and the network group")
        roles = []
        for role, read_only, argv in (
                ("writer", False, ("python3", script, "writer", mount, str(PREFLIGHT_BEACONS))),
                ("reader", True, ("bash", "-c", f'exec python3 {script} reader {mount} {PREFLIGHT_BEACONS} '
                                                f'"${{HF_NETWORK_GROUP_PREFIX}}preflight-writer"'))):
            spec = JobSpec(name=f"preflight-{role}", node=-1, processes=(), supervisor=True, image=PREFLIGHT_IMAGE,
                           command=argv, env={"PYTHONUNBUFFERED": "1"}, secrets=(), flavor=PREFLIGHT_FLAVOR, gpus=0,
                           price_per_hour=0.0, read_only=read_only, expose=(), address="")
            roles.append(self._submit(spec, timeout=PREFLIGHT_TIMEOUT))
        found: dict[str, dict] = {}

        ok = self._loop(lambda: all(j.ended for j in roles), training=False)
        for job in roles:
            for line in job.log.read_text(errors="replace").splitlines() if job.log.is_file() else ():
                if line.startswith("PREFLIGHT "):
                    found[job.spec.name] = json.loads(line.removeprefix("PREFLIGHT "))
        writer, reader = found.get("preflight-writer", {}), found.get("preflight-reader", {})
        latency = reader.get("latency_s") or []
        passed = ok and writer.get("writable") and reader.get("read_only") and reader.get("reached_writer") and \
            len(latency) == PREFLIGHT_BEACONS
        if latency:
            self.display.say(f"preflight: a file written by one Job is seen by the other after {min(latency):.2f}-"
                             f"{max(latency):.2f} s (median {sorted(latency)[len(latency) // 2]:.2f} s, "
                             f"{len(latency)} files)")
        self.display.say(f"preflight: mount read-write on the writer: {writer.get('writable', False)}, read-only on "
                         f"the reader: {reader.get('read_only', False)}, the Jobs reach each other: "
                         f"{reader.get('reached_writer', False)}: {'passed' if passed else 'FAILED'}",
                         style="bold green" if passed else "bold red")
        if not passed and not self.failures and not self.presses:
            job = roles[1]
            self._fail(job, "preflight failed: " + json.dumps(reader or writer or {"output": "none"}))
        return bool(passed)

    def _servers_and_trainer(self) -> None:
        if self.presses:  # stopped while the run directory was uploaded
            return
        servers = [j for j in self.plan.scheduler.jobs if not j.supervisor]
        supervisors = [j for j in self.plan.scheduler.jobs if j.supervisor]
        for spec in servers:
            threading.Thread(target=self._watch_health, args=(self._submit(spec),), daemon=True).start()
        for spec in servers:
            self.display.waiting(spec.name, f"its exposed {spec.health}")
        if not self._loop(lambda: all(self.jobs[s.name].ready for s in servers), training=False):
            return
        for spec in supervisors:
            self._submit(spec)
        self.display.training(self.run_dir, self.plan.trainer_inputs.max_steps)
        self._loop(self._trained, training=True)

    def _on_signal(self, signum, frame) -> None:
        self.presses += 1
        self.display.stopping(self.presses)

    def run(self) -> RunResult:
        import httpx
        from huggingface_hub.errors import HfHubHTTPError

        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            with self.display:
                try:
                    self._prepare()
                    if not self.failures:
                        self._upload()
                        if not self.options.preflight or self._preflight():
                            self._servers_and_trainer()
                except HfHubHTTPError as e:  # a Job refused (no credits, a flavor not granted, ...)
                    self.failures.append(Failure("hf-jobs", 1, f"the Hub refused a request: {e}",
                                                 self.run_dir / LOGS_DIR))
                except httpx.HTTPError as e:
                    self.failures.append(Failure("hf-jobs", 1, f"the Hub could not be reached: {e}",
                                                 self.run_dir / LOGS_DIR))
                self.cancel_all()
                if self.jobs and self.presses < 2:
                    self.display.say(f"bringing the run directory back from {self.folder}")
                    bucket_transfer(self.api, self.folder, str(self.run_dir))
        finally:
            if any(not j.ended for j in self.jobs.values()):  # a bug of ours raised: nothing is left billing
                self.cancel_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        interrupted = self.presses > 0 and not self.failures
        failures = tuple(self.failures)
        if self.trainer_failed:  # the node supervisor's own record names the process that failed and its code
            failures = (*node_failures(self.run_dir), *failures)
        code = EXIT_INTERRUPTED if interrupted else failures[0].code if failures else 0
        result = RunResult(code=code, failures=failures, interrupted=interrupted,
                           restarts={j.spec.name: j.restarts for j in self.jobs.values() if j.restarts})
        self.display.finished(result)
        return result


class HfJobs(Launcher[HfJobsSettings]):
    name = "hf-jobs"
    reach = "uploaded to its folder of the Storage Bucket, mounted in every Job at the same path"
    preflight = True

    def missing(self, plan: Plan) -> str | None:
        found = library_version()
        if found is not None and found >= MIN_VERSION:
            return None
        have = "not installed" if found is None else f"{'.'.join(map(str, found))}, too old"
        return (f"huggingface_hub >= {'.'.join(map(str, MIN_VERSION))} is needed here ({have}): nothing submitted. "
                f"pip install 'grpo-launch[hf-jobs]', `hf auth login`, then:")

    def prepare(self, plan: Plan, options: Options, console: Console) -> Plan:
        """Logged in, and every secret the Jobs take set here: before anything is written or submitted."""
        settings = self.settings(plan)
        token = _token()
        if not token:
            raise UserError("not logged in to the Hugging Face Hub: the Jobs are submitted with your token",
                            key="HF_TOKEN", hint="`hf auth login`, or export HF_TOKEN")
        for i, name in enumerate(settings.secrets):
            if not (os.environ.get(name) or (name == "HF_TOKEN" and token)):
                raise UserError(f"secret {name} is not set here: its value is sent to the Jobs as a secret",
                                key=f"scheduler.hf_jobs.secrets[{i}]",
                                hint=f"export {name}=... (never written anywhere), or drop it from the list")
        return plan

    def keeps_metrics(self, plan: Plan, options: Options) -> bool:
        return True  # the bucket's copy of the run directory comes back at the end

    def run(self, plan: Plan, run_dir: Path, console: Console, options: Options) -> RunResult:
        return JobsRun(plan, run_dir, self.settings(plan), console, options).run()

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        try:
            record = read_submitted(run_dir)
        except UserError:
            return None
        api = _hub()
        try:
            stages = {job_id: str(api.inspect_job(job_id=job_id, namespace=record.namespace).status.stage)
                      for job_id in record.ids}
        except Exception as e:  # noqa: BLE001  (not knowing whether Jobs bill is no reason to start more)
            raise UserError(f"{run_dir}: whether the Jobs an earlier `grpo run` submitted still run cannot be asked "
                            f"now ({e})", key="--resume", hint="try again; `grpo stop RUN_DIR` cancels them") from None
        alive = [f"Job {job_id} ({stage})" for job_id, stage in stages.items() if stage not in TERMINAL]
        return ", ".join(alive) or None

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        record = read_submitted(run_dir)
        api, namespace = _hub(), record.namespace
        for job_id in record.ids:
            stage = str(api.inspect_job(job_id=job_id, namespace=namespace).status.stage)
            if stage in TERMINAL:
                console.print(f"Job {job_id}: {stage}")
                continue
            api.cancel_job(job_id=job_id, namespace=namespace)
            console.print(f"[bold]cancelled[/] Job {job_id} (was {stage})")
        return 0

    def logs(self, plan: Plan, run_dir: Path) -> RunLogs:
        record = read_submitted(run_dir)
        folder = f"hf://buckets/{record.bucket}/{record.folder}"
        return RunLogs(f"{folder}/{LOGS_DIR}/ (each Job's own output: {run_dir / LOGS_DIR}/<job>.job.log)",
                       ("hf", "buckets", "sync", folder, str(run_dir)))

