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

Over hours the Hub answers some calls with a 5xx or a 429, times out, or drops a connection; a log stream that lasts
hours is cut. Every error of a call to it is read by one classifier, `transient`: such an error is `Transient`,
asked again with backoff (after a 429's Retry-After), said on the console, within
`scheduler.control_plane_timeout_s` (`launch.control_plane`); only an answer refuses (any other 4xx). A Hub silent for
the whole bound leaves the run as it is: its Jobs are never cancelled for it, `grpo run` says so and exits
EXIT_LEFT_RUNNING, and `grpo stop` cancels them once it answers. A log stream that ends while its Job runs is attached
again (the Hub replays the log from its start; the lines already written are skipped). Every Job carries the run's
label (`grpo-run=<group>`): a Job whose submission's answer was lost (`run_job` timed out after the Hub made it) is
found by it and cancelled, before the submission is asked again, when the run ends and at `grpo stop`.

Transfers to and from the bucket go through one function, `bucket_transfer` (huggingface_hub's `sync_bucket`, which
speaks Xet): the tests replace it by a copy into their stand-in's bucket directory. `--resume` brings the bucket's
copy down first (the Jobs wrote it since; the copy here may be older), then uploads only what materialize and this
run wrote again: never a checkpoint, metrics or a log.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import queue
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import JobSpec, Plan, Role
from grpo_launch.contracts.rundir import (
    CONFIG_FILE,
    LOGS_DIR,
    OVERRIDES_FILE,
    PLAN_FILE,
    REWARDS_DIR,
    RUN_LOCK,
    SUBMITTED_FILE,
    WHEELS_DIR,
    Submitted,
    clear_node_failures,
    read_submitted,
    write_submitted,
)
from grpo_launch.contracts.schedulers import DEFAULT_BUCKET_NAME, HfJobsSettings, run_group
from grpo_launch.errors import UserError
from grpo_launch.launch.control_plane import FIRST_RETRY_S, MAX_RETRY_S, Patience, Transient, Unreachable
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.follow import node_failures
from grpo_launch.launch.result import EXIT_INTERRUPTED, EXIT_LEFT_RUNNING, TAIL_LINES, Failure, RunResult
from grpo_launch.launch.schedulers import hf_jobs_preflight
from grpo_launch.launch.schedulers.base import Launcher, Options, RunLogs
from grpo_launch.launch.supervisor import STOP_SIGNALS, Supervisor
from grpo_launch.launch.wheel import build_wheel

MIN_VERSION = (1, 32)               # huggingface_hub: Jobs with network groups (1.32), buckets and exposed ports
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
HUB = "the Hub"                     # the control plane, in the console's words
LABEL = "grpo-run"                  # every Job's label key; its value is the run's group (`run_group`)
TICK_S = 0.2
HEALTH_POLL_S = 1.0
CANCEL_WAIT_S = 120.0               # after cancelling, how long `grpo run` waits for every Job to say it ended
REQUEST_TIMEOUT_S = 30.0            # one Hub request's longest wait for an answer (a third of the bound if shorter)
STREAM_DRAIN_S = 30.0               # at the end, how long the Jobs' log streams may take to write their last lines
# Written here for this machine alone, never sent to the bucket nor brought back from it.
LOCAL_ONLY = (SUBMITTED_FILE, RUN_LOCK.format(node="*"))
PREFLIGHT_IMAGE = "python:3.12"
PREFLIGHT_FLAVOR = "cpu-basic"
PREFLIGHT_BEACONS = 5
PREFLIGHT_TIMEOUT = "30m"
PREFLIGHT_FILE = "preflight.py"


T = TypeVar("T")


def bucket_transfer(api: Any, source: str, dest: str, *, include: list[str] | None = None,
                    exclude: list[str] | None = None) -> None:
    """A local directory to a bucket folder (`hf://buckets/NS/NAME/PATH`), or back: huggingface_hub's sync (a file
    is sent when the receiver lacks it, its size differs or the source is newer), with its fnmatch patterns on the
    paths under the folder (an exclude wins; with includes, only what they match)."""
    api.sync_bucket(source, dest, include=include, exclude=exclude, quiet=True)


def _hub(bound_s: float) -> Any:
    """huggingface_hub's client, each request's wait for an answer bounded: the library's own session waits forever,
    and a Hub that holds a request would hold the run past its bound."""
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.utils import get_session

    get_session().timeout = httpx.Timeout(min(REQUEST_TIMEOUT_S, bound_s / 3))
    return HfApi()


def transient(error: BaseException, what: str) -> Transient | None:
    """`error` of a Hub call (`what`, in words) as the `Transient` it is when it may pass: a 5xx, a 429 (with its
    Retry-After, in seconds), a timeout or a dropped connection; None for an answer (any other status refuses the
    request) and for anything else."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        response = error.response
        status = response.status_code if response is not None else None
        if status is None or not (status >= 500 or status == 429):
            return None
        after = response.headers.get("Retry-After", "")
        return Transient(f"{what}: {status} {response.reason_phrase}".rstrip(),
                         float(after) if after.strip().isdigit() else None)
    if isinstance(error, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)):
        return Transient(f"{what}: {type(error).__name__}" + (f" ({error})" if str(error) else ""))
    return None


def hub_call(what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)`, a Hub call (`what`, in words), asked once: `Transient` when its error may pass."""
    try:
        return call(*args, **kwargs)
    except Exception as e:
        if (passing := transient(e, what)) is not None:
            raise passing from e
        raise


def labelled(api: Any, namespace: str, group: str, ask: Callable[..., Any]) -> dict[str, str]:
    """Every Job carrying the run's label, by ID: its stage (`ask`: how a Hub call is asked). The label is checked
    here too: another run's Job is never taken for this one's."""
    listed = ask(f"listing the Jobs labelled {LABEL}={group}",
                 lambda: list(api.list_jobs(labels={LABEL: group}, namespace=namespace)))
    return {info.id: str(info.status.stage) for info in listed if (info.labels or {}).get(LABEL) == group}


def rewritten(plan: Plan) -> list[str]:
    """What materialize writes again when a run is resumed (`materialize.run_files`, the reward files), under the run
    directory."""
    return [CONFIG_FILE, OVERRIDES_FILE, PLAN_FILE, *plan.files, REWARDS_DIR]


def patterns(paths: list[str]) -> list[str]:
    """`bucket_transfer`'s patterns for these files or folders, and everything under them."""
    return [p for path in paths for p in (glob.escape(path), f"{glob.escape(path)}/*")]


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
        self.api = _hub(plan.scheduler.control_plane_timeout_s)
        self.namespace = settings.namespace or ""   # your account's, asked of the Hub when the run starts
        self.bucket = settings.bucket or ""
        self.group = run_group(plan.recipe, run_dir)
        try:  # an earlier `grpo run` of this directory submitted Jobs: they wrote the bucket's copy since
            self.earlier: Submitted | None = read_submitted(run_dir)
        except UserError:
            self.earlier = None
        names = [j.name for j in plan.scheduler.jobs]
        if options.preflight:
            names += ["preflight-writer", "preflight-reader"]
        self.display = ConsoleDisplay(console, names, verbose=options.verbose)
        self.patience = Patience(HUB, plan.scheduler.control_plane_timeout_s,
                                 lambda text: self.display.say(text, style="yellow"))
        self.events: queue.Queue = queue.Queue()
        self.jobs: dict[str, Running] = {}
        self.ids: list[str] = []
        self.unanswered = False   # a run_job whose answer was lost: the Job it may have made is not yet cancelled
        self.streams: list[threading.Thread] = []
        self.over = threading.Event()  # the run has ended: the log streams attach no more
        self.failures: list[Failure] = []
        self.presses = 0
        roles = {p.name: p.role for p in plan.processes}
        self.trainers = {j.name for j in plan.scheduler.jobs if any(roles[p] == Role.TRAINER for p in j.processes)}
        self.trainer_failed = False

    # -- the Hub ------------------------------------------------------------------------------------------------
    def _patiently(self, attempt: Callable[[], T]) -> T:
        """`attempt()` through the Hub's transient errors; a second Ctrl-C ends the waiting (`Unreachable`, the Jobs
        left as they are)."""
        return self.patience.call(attempt, stop=lambda: "at the second Ctrl-C" if self.presses > 1 else None)

    def _ask(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A Hub call, asked through its transient errors within the bound."""
        return self._patiently(lambda: hub_call(what, call, *args, **kwargs))

    def _secrets(self) -> dict[str, str]:
        values = {}
        for name in self.settings.secrets:
            values[name] = os.environ.get(name) or (_token() if name == "HF_TOKEN" else None)
        return values

    def _record(self) -> None:
        """submitted.json: the Jobs so far, and where they run (`grpo stop` finds any other by the run's label)."""
        write_submitted(self.run_dir, Submitted("hf-jobs", tuple(self.ids), time.time(), namespace=self.namespace,
                                                bucket=self.bucket, folder=self.group))

    def _cancel_strays(self, ask: Callable[..., Any]) -> None:
        """Cancel every Job carrying the run's label that the run does not know: one a submission made whose answer
        was lost (`ask`: how each Hub call is asked)."""
        for job_id, stage in labelled(self.api, self.namespace, self.group, ask).items():
            if job_id not in self.ids and stage not in TERMINAL:
                ask(f"cancelling Job {job_id}", self.api.cancel_job, job_id=job_id, namespace=self.namespace)
                self.display.say(f"cancelled Job {job_id} (was {stage}): it carries this run's label, and its "
                                 f"submission's answer was lost", style="yellow")
        self.unanswered = False

    def _run_job(self, spec: JobSpec, request: dict[str, Any]) -> Any:
        """One `run_job`, after the Job an earlier one whose answer was lost may have made is cancelled (one more
        Job of the same name and alias would bill, and take the other's place in the network group)."""
        if self.unanswered:
            self._cancel_strays(hub_call)
        try:
            return hub_call(f"submitting {spec.name}'s Job", self.api.run_job, **request)
        except Transient:
            self.unanswered = True
            raise

    def _submit(self, spec: JobSpec, *, image: str | None = None, command: tuple[str, ...] | None = None,
                flavor: str | None = None, timeout: str | None = None) -> Running:
        from huggingface_hub import Volume

        request = dict(
            image=image or spec.image, command=list(command or spec.command), env=dict(spec.env),
            secrets={k: v for k, v in self._secrets().items() if k in spec.secrets} or None,
            flavor=flavor or spec.flavor, timeout=timeout or self.settings.timeout,
            name=f"{self.group}-{spec.name}", labels={LABEL: self.group},
            volumes=[Volume(type="bucket", source=self.bucket, path=self.group, mount_path=self.settings.mount_path,
                            read_only=spec.read_only)],
            expose=list(spec.expose) or None, network_group=self.group, network_aliases=[spec.name],
            namespace=self.namespace)
        self._record()  # before the first Job: `grpo stop` finds one whose answer is lost by the run's label
        job = self._patiently(lambda: self._run_job(spec, request))
        self.ids.append(job.id)
        self._record()
        running = Running(spec, job.id, self.run_dir / LOGS_DIR / f"{spec.name}.job.log")
        self.jobs[spec.name] = running
        self.display.say(f"{spec.name}: Job {job.id} ({spec.flavor}) {job.url}")
        stream = threading.Thread(target=self._stream, args=(running,), daemon=True, name=f"logs-{spec.name}")
        stream.start()
        self.streams.append(stream)
        return running

    def _stream(self, job: Running) -> None:
        """Every line the Job prints, as the Hub streams it, to the console and the Job's log here. A stream that
        ends while the Job runs (a proxy cutting an hours-long response, a 5xx, a timeout) is attached again: the
        Hub replays the log from its start, and the lines already written are skipped."""
        name, written, wait, last = job.spec.name, 0, FIRST_RETRY_S, False
        with job.log.open("a") as log:
            while not self.over.is_set():
                try:
                    for i, line in enumerate(self.api.fetch_job_logs(job_id=job.id, namespace=self.namespace,
                                                                      follow=True)):
                        if i >= written:
                            log.write(line + "\n")
                            log.flush()
                            self.events.put(("line", name, line))
                            written, wait = written + 1, FIRST_RETRY_S
                    why, clean = "its log stream was cut while the Job runs", True
                except Exception as e:  # noqa: BLE001  (a stream that breaks for good costs lines, not the run)
                    if (passing := transient(e, "its log stream")) is None:
                        self.events.put(("say", f"{name}: its log stream broke ({e})"))
                        return
                    why, clean = str(passing), False
                if last and clean:
                    return
                if not last:  # (a last attach the Hub did not answer is asked again, until the run's end)
                    try:
                        stage = str(hub_call("reading its stage", self.api.inspect_job, job_id=job.id,
                                             namespace=self.namespace).status.stage)
                    except Exception as e:  # noqa: BLE001  (the stages' poll says what the Hub answers)
                        stage, why = None, f"{why}; {transient(e, 'reading its stage') or e}"
                    if stage in TERMINAL:
                        if clean:    # the stream ended with the Job
                            return
                        last = True  # its last lines, at once: the Hub replays an ended Job's whole log, then ends it
                        continue
                    if stage == "RUNNING" or not clean:  # (a Job not yet running may have no log to hold open)
                        self.events.put(("say", f"{name}: {why}; attaching again in {wait:.0f} s"))
                deadline = time.monotonic() + wait  # cut short by the Job's end: its last lines come at once
                while time.monotonic() < deadline and not self.over.is_set() and (last or not job.ended):
                    self.over.wait(TICK_S)
                wait = min(MAX_RETRY_S, wait * 2)

    def _inspect(self, job: Running) -> None:
        """The Job's stage, asked once: `Transient` when the Hub gave no answer."""
        info = hub_call(f"reading {job.spec.name}'s stage (Job {job.id})", self.api.inspect_job, job_id=job.id,
                        namespace=self.namespace)
        stage, message = str(info.status.stage), info.status.message
        if stage != job.stage:
            self.display.say(f"{job.spec.name}: {stage}" + (f" ({message})" if message else ""))
        job.stage, job.message, job.expose_urls = stage, message, list(info.status.expose_urls or [])

    def _tail(self, job: Running) -> tuple[str, ...]:
        """The Job's last lines for its failure: the Hub's, else (any error: the run is ending, and the Hub is not
        waited for) the copy its stream wrote here."""
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
        """Cancel every Job not ended, and any carrying the run's label that the run does not know; wait (bounded)
        until each says it ended: nothing is left billing. `Unreachable` when the Hub stays silent: the Jobs are
        then left as they are."""
        from huggingface_hub.errors import HfHubHTTPError

        for job in self.jobs.values():
            if not job.ended:
                try:
                    self._ask(f"cancelling {job.spec.name}'s Job {job.id}", self.api.cancel_job, job_id=job.id,
                              namespace=self.namespace)
                except HfHubHTTPError as e:  # refused: named below if it does not end
                    self.display.say(f"{job.spec.name}: cancelling Job {job.id} failed: {e}", style="bold red")
        if self.ids or self.unanswered:  # a Job made by a submission whose answer was lost, even late
            self._cancel_strays(self._ask)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline and self.presses < 2 and any(not j.ended for j in self.jobs.values()):
            for job in self.jobs.values():
                if not job.ended:
                    try:
                        self._patiently(lambda job=job: self._inspect(job))
                    except HfHubHTTPError as e:  # refused: asked again until the bound; then named below
                        self.display.say(f"{job.spec.name}: its stage could not be read: {e}", style="yellow")
            time.sleep(TICK_S)
        left = [f"{j.spec.name} (Job {j.id}, {j.stage})" for j in self.jobs.values() if not j.ended]
        if left:
            self.display.say(f"still not ended after {CANCEL_WAIT_S:g} s: {', '.join(left)}; `hf jobs cancel ID`",
                             style="bold red")

    def _drain_streams(self) -> None:
        """Once every Job has ended, let their log streams write their last lines (bounded); then they attach no
        more."""
        if all(j.ended for j in self.jobs.values()):
            deadline = time.monotonic() + STREAM_DRAIN_S
            for stream in self.streams:
                stream.join(timeout=max(0.0, deadline - time.monotonic()))
        self.over.set()

    # -- the run ------------------------------------------------------------------------------------------------
    def _prepare(self) -> list[str]:
        """What the Jobs cannot make themselves, into the run directory before it is uploaded: what was written,
        under it."""
        made = []
        if self.plan.prepare:  # a built-in model: the vLLM Jobs read it before any supervisor Job runs
            missing = [step.creates for step in self.plan.prepare if not (self.run_dir / step.creates).exists()]
            supervisor = Supervisor(self.plan, self.run_dir, nodes=(), console=self.display.console)
            asyncio.run(supervisor.prepare_only())
            if supervisor.failures:
                self.failures += supervisor.failures
                return made
            made += missing
        if self.options.preflight:  # its two Jobs run it from the run directory, in a plain Python image
            (self.run_dir / PREFLIGHT_FILE).write_text(Path(hf_jobs_preflight.__file__).read_text())
            made.append(PREFLIGHT_FILE)
        if self.settings.install_wheel and any(j.supervisor for j in self.plan.scheduler.jobs):
            wheel = build_wheel(self.run_dir / WHEELS_DIR)
            self.display.say(f"wheel of this grpo-launch for the supervisor Jobs: {wheel.relative_to(self.run_dir)}")
            made.append(WHEELS_DIR)
        return made

    @property
    def folder(self) -> str:
        return f"hf://buckets/{self.bucket}/{self.group}"

    def _transfer(self, source: str, dest: str, *, include: list[str] | None = None,
                  exclude: tuple[str, ...] = ()) -> None:
        self._ask(f"syncing {source} to {dest}", bucket_transfer, self.api, source, dest, include=include,
                  exclude=[*patterns(list(exclude)), *LOCAL_ONLY])

    def _bucket(self) -> None:
        """The namespace (your account's, unless set) and the bucket, created when missing."""
        if not self.namespace:
            self.namespace = self._ask("asking who you are", self.api.whoami)["name"]
        self.bucket = self.bucket or f"{self.namespace}/{DEFAULT_BUCKET_NAME}"
        self._ask(f"creating the bucket {self.bucket}", self.api.create_bucket, self.bucket, private=True,
                  exist_ok=True)

    def _bring_down(self) -> None:
        """A resumed run: the bucket's copy first, but for what materialize wrote again; the copy here may be older
        (the last `grpo run` killed, or `grpo stop` ended it without bringing the directory back)."""
        self.display.say(f"resuming: bringing {self.folder} down first (its Jobs wrote it since)")
        self._transfer(self.folder, str(self.run_dir), exclude=tuple(rewritten(self.plan)))
        clear_node_failures(self.run_dir, range(self.plan.nodes))  # the earlier run's, come down with the rest

    def _upload(self, made: list[str]) -> None:
        if self.earlier is None:
            self.display.say(f"uploading the run directory to {self.folder} (mounted at {self.settings.mount_path})")
            self._transfer(str(self.run_dir), self.folder)
            return
        files = [*rewritten(self.plan), *made]  # never a checkpoint, metrics or a log: the bucket's are the run's
        self.display.say(f"uploading what this run wrote again to {self.folder}: {', '.join(files)}")
        self._transfer(str(self.run_dir), self.folder, include=patterns(files))

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
        """Every Job's stage, and what follows from it; `Transient` when the Hub gave no answer."""
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
        """Show the Jobs' lines and states until `until()` holds (True), or something failed or a stop came.
        A poll the Hub did not answer is asked again after the patience's wait; `Unreachable` after the bound."""
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
                try:
                    self._poll(training)
                except Transient as e:
                    next_poll = time.monotonic() + self.patience.failed(e)
                else:
                    self.patience.answered()
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

    def _start(self) -> None:
        """The bucket (a resumed run's copy brought down first), what the Jobs cannot make, the upload, the
        preflight, then the Jobs."""
        self._bucket()
        if self.earlier is not None:
            self._bring_down()
        made = self._prepare()
        if self.failures or self.presses:
            return
        self._upload(made)
        if not self.options.preflight or self._preflight():
            self._servers_and_trainer()

    def _left(self, lost: Unreachable) -> RunResult:
        """The Hub stayed silent: the run is left as it is, and said so (never cancelled for it)."""
        running = [f"{j.spec.name} (Job {j.id})" for j in self.jobs.values() if not j.ended]
        if not running and not self.unanswered:
            return RunResult(code=EXIT_LEFT_RUNNING, failures=(
                Failure("hf-jobs", EXIT_LEFT_RUNNING, f"{lost}; no Job of this run runs", self.run_dir / LOGS_DIR),))
        what = ", ".join(running) or "no Job it knows of"
        if self.unanswered:
            what += f", and maybe one whose submission was not answered (labelled {LABEL}={self.group})"
        return RunResult(code=EXIT_LEFT_RUNNING, left_running=(
            f"{what}: {lost}; `grpo stop {self.run_dir}` cancels them once it answers"))

    def run(self) -> RunResult:
        import httpx
        from huggingface_hub.errors import HfHubHTTPError

        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        lost: Unreachable | None = None
        try:
            with self.display:
                try:
                    try:
                        self._start()
                    except HfHubHTTPError as e:  # refused (no credits, a flavor not granted, ...): not a silence
                        self.failures.append(Failure("hf-jobs", 1, f"the Hub refused a request: {e}",
                                                     self.run_dir / LOGS_DIR))
                    except httpx.HTTPError as e:  # no Hub there to ask (a wrong endpoint, ...)
                        self.failures.append(Failure("hf-jobs", 1, f"the Hub could not be reached: {e}",
                                                     self.run_dir / LOGS_DIR))
                    self.cancel_all()
                except Unreachable as e:  # never cancelled for it: the Jobs may run on, and it is said how to end them
                    lost = e
                self._drain_streams()
                if lost is None and self.jobs and self.presses < 2:
                    self.display.say(f"bringing the run directory back from {self.folder}")
                    try:
                        self._transfer(self.folder, str(self.run_dir))
                    except Unreachable as e:  # every Job has ended: what is lost is the copy here
                        self.display.say(f"the run directory could not be brought back: {e}; `grpo report "
                                         f"{self.run_dir} --fetch` brings it", style="bold yellow")
        finally:
            self.over.set()
            if lost is None and any(not j.ended for j in self.jobs.values()):  # a bug of ours raised
                try:
                    self.cancel_all()
                except Unreachable as e:
                    lost = e
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if lost is not None:
            result = self._left(lost)
            self.display.finished(result)
            return result
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

    def _asking(self, plan: Plan, console: Console) -> Callable[..., Any]:
        """How `grpo stop` and `--resume` ask the Hub: through its transient errors, said on `console`."""
        patience = Patience(HUB, plan.scheduler.control_plane_timeout_s,
                            lambda text: console.print(f"[yellow]{escape(text)}[/]"))
        return lambda what, call, *args, **kwargs: patience.call(lambda: hub_call(what, call, *args, **kwargs))

    def _stages(self, api: Any, record: Submitted, ask: Callable[..., Any]) -> dict[str, str]:
        """The stage of every Job the run submitted, and of any other carrying its label (a submission whose answer
        was lost), by ID."""
        found = labelled(api, record.namespace, record.folder, ask) if record.folder else {}
        return {**{job_id: found.get(job_id) or str(ask(f"reading Job {job_id}'s stage", api.inspect_job,
                                                            job_id=job_id, namespace=record.namespace).status.stage)
                   for job_id in record.ids}, **found}

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        try:
            record = read_submitted(run_dir)
        except UserError:
            return None
        api = _hub(plan.scheduler.control_plane_timeout_s)
        try:
            stages = self._stages(api, record, self._asking(plan, Console(stderr=True)))
        except Exception as e:  # noqa: BLE001  (not knowing whether Jobs bill is no reason to start more)
            raise UserError(f"{run_dir}: whether the Jobs an earlier `grpo run` submitted still run cannot be asked "
                            f"now ({e})", key="--resume", hint="try again; `grpo stop RUN_DIR` cancels them") from None
        alive = [f"Job {job_id} ({stage})" for job_id, stage in stages.items() if stage not in TERMINAL]
        return ", ".join(alive) or None

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        """Cancel every Job of the run not ended: those it submitted, and any carrying its label (a submission whose
        answer was lost). A Hub silent for the bound: nothing more is cancelled, said so (EXIT_LEFT_RUNNING)."""
        record = read_submitted(run_dir)
        api, namespace, ask = _hub(plan.scheduler.control_plane_timeout_s), record.namespace, \
            self._asking(plan, console)
        try:
            for job_id, stage in self._stages(api, record, ask).items():
                if stage in TERMINAL:
                    console.print(f"Job {job_id}: {stage}")
                    continue
                ask(f"cancelling Job {job_id}", api.cancel_job, job_id=job_id, namespace=namespace)
                stray = "" if job_id in record.ids else ": it carries this run's label, and its submission's " \
                                                       "answer was lost"
                console.print(f"[bold]cancelled[/] Job {job_id} (was {stage}){stray}")
        except Unreachable as e:
            console.print(f"[bold yellow]{escape(str(e))}[/]: what is not cancelled yet is left as it is; "
                          f"`grpo stop {escape(str(run_dir))}` again once it answers")
            return EXIT_LEFT_RUNNING
        return 0

    def logs(self, plan: Plan, run_dir: Path) -> RunLogs:
        record = read_submitted(run_dir)
        folder = f"hf://buckets/{record.bucket}/{record.folder}"
        return RunLogs(f"{folder}/{LOGS_DIR}/ (each Job's own output: {run_dir / LOGS_DIR}/<job>.job.log)",
                       ("hf", "buckets", "sync", folder, str(run_dir)))

