"""scheduler=skypilot: launch the run directory's task.yaml with `sky launch` on a cluster of the run's own, follow
the job to its end, bring node 0's metrics and logs here, and take the cluster down (`scheduler.skypilot.down`).

The cluster is named after the run directory (`contracts.schedulers.skypilot_cluster`, put in the plan's submit
command in place of its pattern) unless the recipe names one. `sky launch` provisions the nodes, copies the run
directory to each (the task's workdir), prints the job's ID ("Job submitted, ID: N"), which goes into
submitted.json at once, and streams the job's output; its exit code is the job's (SkyPilot's `JobExitCode`). When
the stream breaks off while the job runs (SkyPilot's API server or the network), the job is followed again (`sky
logs CLUSTER ID`): it is never taken for ended, nor cancelled, for that. Ctrl-C stops following only; `grpo stop
RUN_DIR` cancels the job by its ID (`sky cancel CLUSTER ID`, never `--all`), then takes the run's own cluster down
when the run's setting says so (whatever else runs there, a launch whose answer was lost, ends with it), or else
cancels any other job on it. A cluster the recipe names may hold other runs' jobs: only the run's own is cancelled.

Every other `sky` command (status, cancel, queue, down) is bounded and asked again through its transient failures
(`launch.control_plane`) for `scheduler.control_plane_timeout_s`; a control plane silent that long leaves the job
and the cluster as they are, said so, with the command that ends them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import Submitted, read_submitted, write_submitted
from grpo_launch.contracts.schedulers import SKY_WORKDIR, SkyPilotSettings, skypilot_cluster
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.errors import UserError
from grpo_launch.launch.control_plane import Patience, Transient, Unreachable
from grpo_launch.launch.result import EXIT_INTERRUPTED, EXIT_LEFT_RUNNING, RunResult
from grpo_launch.launch.schedulers.base import Launcher, Options, RunLogs
from grpo_launch.launch.spawn import child_environment

CONTROL_PLANE = "SkyPilot"
COMMAND_TIMEOUT_S = 120.0  # one `sky` status, cancel or queue (the first `sky` command starts SkyPilot's API server)
DOWN_TIMEOUT_S = 900.0     # `sky down`: the cloud terminates every node
FETCH_TIMEOUT_S = 600.0    # node 0's metrics and logs brought here
EXIT_WAIT_S = 60.0         # a `sky` that was interrupted (Ctrl-C) finishes saying how to follow the job again
# What `sky launch` prints once the job is queued (SkyPilot 0.14: backends/cloud_vm_ray_backend.py).
JOB_SUBMITTED = re.compile(r"Job submitted, ID: (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The exit codes of `sky launch`, `sky logs` and `sky logs --status` (sky.exceptions.JobExitCode).
SUCCEEDED, FAILED, NOT_FINISHED, NOT_FOUND, CANCELLED = 0, 100, 101, 102, 103
ENDED = (SUCCEEDED, FAILED, CANCELLED)
# What SkyPilot says of a cluster on which no job runs any more: torn down (autodown, by hand, preempted) or stopped
# (sky/backends/backend_utils.py check_cluster_available).
NO_CLUSTER = ("does not exist", "not found on the cloud provider", "(status: STOPPED)")
DOWN_DONE = ("...done", "Cluster(s) not found")  # `sky down` exits 0 even when it failed; these say it did not


def tell(console: Console, markup: str) -> None:
    """One message, unwrapped: the commands in it are pasted as they are."""
    console.print(markup, soft_wrap=True)


def sky(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
    """A `sky` command's exit code and what it said (colours removed); `Transient` when it outlasts its bound."""
    try:
        done = subprocess.run(["sky", *argv], env=child_environment({}), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise Transient(f"`sky {argv[0]}` did not answer within {timeout_s:g} s") from None
    except FileNotFoundError:
        raise UserError("SkyPilot is not installed here: `sky` is not on PATH", key="RUN_DIR",
                        hint="install it as the run was launched (pip install 'skypilot[aws]', ...), or run "
                             "`grpo stop` where it was") from None
    return done.returncode, ANSI.sub("", done.stdout + done.stderr).strip()


def no_cluster(said: str) -> bool:
    return any(words in said for words in NO_CLUSTER)


def transient(argv: list[str], code: int, said: str) -> Transient:
    last = said.splitlines()[-1] if said else f"exit code {code}"
    return Transient(f"`{shell_line(['sky', *argv])}` failed: {last}")


def job_state(cluster: str, job: str) -> int | None:
    """The job's state as `sky logs --status` gives it (SUCCEEDED ... CANCELLED); None when its cluster is gone or
    stopped (no job runs there)."""
    argv = ["logs", "--status", cluster, job]
    code, said = sky(argv)
    if code in (*ENDED, NOT_FINISHED, NOT_FOUND):
        return code
    if no_cluster(said):
        return None
    raise transient(argv, code, said)


def cancel(cluster: str, jobs: list[str]) -> bool:
    """Cancel `jobs` on `cluster` by their IDs; False when the cluster is gone or stopped (nothing runs there)."""
    argv = ["cancel", "--yes", cluster, *jobs]
    code, said = sky(argv)
    if code == 0:
        return True
    if no_cluster(said):
        return False
    raise transient(argv, code, said)


def unfinished_jobs(cluster: str) -> list[str]:
    """The IDs of the jobs on `cluster` that have not ended (none where the cluster is gone or stopped)."""
    argv = ["queue", "--skip-finished", "--output", "json", cluster]
    code, said = sky(argv)
    start = said.find("{")
    try:
        records = json.loads(said[start:]) if code == 0 and start >= 0 else None
    except ValueError:
        records = None
    if records is not None and cluster in records:
        return [str(r["job_id"]) for r in records[cluster]]
    if no_cluster(said):
        return []
    raise transient(argv, code, said)


def down(cluster: str) -> None:
    argv = ["down", "--yes", cluster]
    code, said = sky(argv, DOWN_TIMEOUT_S)
    if code or not any(words in said for words in DOWN_DONE):
        raise transient(argv, code, said)


class SkyPilot(Launcher[SkyPilotSettings]):
    name = "skypilot"
    reach = "SkyPilot copies it to every node as the task's workdir"
    not_installed = ("SkyPilot is not installed here: nothing launched. Install it with your cloud's extra (pip "
                     "install 'skypilot[aws]', [gcp], [kubernetes], ...), check it with `sky check`, then:")

    def keeps_metrics(self, plan: Plan, options: Options) -> bool:
        return False  # they are written on node 0, and brought here when the job ends

    def own_cluster(self, plan: Plan, run_dir: Path) -> str:
        """The cluster a run of `run_dir` launches on: the recipe's, or the run's own."""
        return self.settings(plan).cluster_name or skypilot_cluster(plan.recipe, run_dir)

    def submit_command(self, plan: Plan, run_dir: Path) -> tuple[str, ...]:
        """The plan's `sky launch` with the run's cluster in place of the plan's name for it."""
        submit = plan.scheduler.submit
        at = submit.index("--cluster") + 1
        return (*submit[:at], self.own_cluster(plan, run_dir), *submit[at + 1:])

    def _patience(self, plan: Plan, console: Console) -> Patience:
        return Patience(CONTROL_PLANE, plan.scheduler.control_plane_timeout_s,
                        lambda text: tell(console, f"[yellow]{escape(text)}[/]"))

    def _launched(self, run_dir: Path) -> tuple[str, list[str]] | None:
        """What `grpo run` recorded: the cluster and the job IDs it knows (none yet while the launch provisions, or
        where an earlier release wrote the record); None when nothing was launched."""
        try:
            record = read_submitted(run_dir)
        except UserError:
            return None
        return (record.ids[0], list(record.ids[1:])) if record.scheduler == self.name and record.ids else None

    # -- grpo run ------------------------------------------------------------------------------------------------

    def run(self, plan: Plan, run_dir: Path, console: Console, options: Options) -> RunResult:
        cluster, started = self.own_cluster(plan, run_dir), time.time()
        argv = self.submit_command(plan, run_dir)
        jobs: list[str] = []

        def recorded(job: str) -> None:
            jobs.append(job)
            write_submitted(run_dir, Submitted(self.name, (cluster, *jobs), started))

        write_submitted(run_dir, Submitted(self.name, (cluster,), started))  # `grpo stop` finds it while it provisions
        tell(console, "[bold]launching[/] " + escape(
            f"{shell_line(argv)} in {shell_word(str(run_dir))}. Ctrl-C stops following only: "
            f"`{shell_line(['grpo', 'stop', str(run_dir)])}` stops the job"))
        patience = self._patience(plan, console)
        try:
            code, _ = self._stream(list(argv), run_dir, console, recorded)
            if not jobs and cluster == skypilot_cluster(plan.recipe, run_dir):
                for job in patience.call(lambda: unfinished_jobs(cluster)):  # a launch whose answer was lost
                    tell(console, f"[bold]found[/] SkyPilot job {job} on {escape(cluster)}, the run's own cluster")
                    recorded(job)
            if jobs:
                code = self._follow(plan, run_dir, cluster, jobs[0], code, patience, console)
        except KeyboardInterrupt:
            tell(console, "[bold]stopped following[/]: " + escape(
                f"the job runs on, `{shell_line(['grpo', 'stop', str(run_dir)])}` stops it"))
            return RunResult(code=EXIT_INTERRUPTED, interrupted=True)
        except Unreachable as lost:
            tell(console, "[bold yellow]left as it is, maybe running:[/] " + escape(
                f"{lost}; `grpo stop {run_dir}` ends the job and the cluster once it answers"))
            return RunResult(code=EXIT_LEFT_RUNNING, left_running=str(lost))
        if jobs:
            self._bring_home(plan, run_dir, console)
        try:
            self._release(plan, run_dir, cluster, bool(jobs), patience, console)
        except Unreachable as lost:
            tell(console, "[bold yellow]the cluster is left as it is, billing:[/] " + escape(
                f"{lost}; `{shell_line(['sky', 'down', cluster])}` takes it down"))
            return RunResult(code=EXIT_LEFT_RUNNING, left_running=f"the cluster {cluster}: {lost}")
        return RunResult(code=code)

    def _stream(self, argv: list[str], run_dir: Path, console: Console,
                recorded: Callable[[str], None] | None = None) -> tuple[int, int]:
        """Run a `sky` command that follows the job, its output shown as it comes: its exit code and how many lines
        it printed. `recorded` is told
        the job's ID as soon as `sky launch` prints it. Ctrl-C reaches `sky` too, which stops following and says how
        to follow again: it is waited for, then the interrupt goes on."""
        process = subprocess.Popen(argv, cwd=run_dir, env=child_environment({}), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert process.stdout is not None
        lines = 0
        try:
            for line in process.stdout:
                lines += 1
                console.print(Text.from_ansi(line.rstrip("\n")), soft_wrap=True)
                if recorded is not None and (submitted := JOB_SUBMITTED.search(ANSI.sub("", line))):
                    recorded(submitted.group(1))
                    recorded = None
            return process.wait(), lines
        except KeyboardInterrupt:
            try:
                process.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise

    def _follow(self, plan: Plan, run_dir: Path, cluster: str, job: str, code: int, patience: Patience,
                console: Console) -> int:
        """The job's exit code once it has ended: while it runs after its stream broke off, it is followed again
        (`sky logs`); a stream that keeps breaking, showing nothing, for the control plane's bound is
        `Unreachable`."""
        following = Patience(f"SkyPilot job {job}'s log", plan.scheduler.control_plane_timeout_s,
                             lambda text: tell(console, f"[yellow]{escape(text)}[/]"))
        while code not in ENDED:
            state = patience.call(lambda: job_state(cluster, job))
            if state != NOT_FINISHED:
                return code if state in (None, NOT_FOUND) else state
            time.sleep(following.failed(Transient(f"broke off (exit code {code}) while the job runs")))
            code, lines = self._stream(["sky", "logs", cluster, job], run_dir, console)
            if lines:
                following.answered()
        return code

    def _bring_home(self, plan: Plan, run_dir: Path, console: Console) -> None:
        """Node 0's metrics.jsonl and logs into the run directory here, before the cluster goes (its disks with
        it)."""
        fetch = self.logs(plan, run_dir).fetch
        if shutil.which(fetch[0]) is None:
            tell(console, f"[yellow]{escape(fetch[0])} is not installed here: the metrics and logs stay on node 0[/]")
            return
        try:
            done = subprocess.run(fetch, env=child_environment({}), stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            tell(console, f"[yellow]bringing the metrics and logs here took over {FETCH_TIMEOUT_S:g} s: stopped[/]")
            return
        if done.returncode:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            tell(console, "[yellow]" + escape(f"`{shell_line(fetch)}` failed: {said[-1] if said else done.returncode}"
                                              ) + "[/]")
            return
        tell(console, f"[bold]brought here[/] node 0's metrics.jsonl and logs/ ({escape(shell_line(fetch))})")

    def _release(self, plan: Plan, run_dir: Path, cluster: str, job_ran: bool, patience: Patience,
                 console: Console) -> None:
        """The cluster once the run has ended, as `scheduler.skypilot` says. SkyPilot's autodown is set once the
        job is submitted; a launch that failed before (its setup) leaves the cluster up, so the run's own cluster
        is taken down here."""
        s = self.settings(plan)
        if not s.down:
            after = (f"SkyPilot stops it after {s.idle_minutes_to_autostop} idle minutes"
                     if s.idle_minutes_to_autostop is not None else "it bills")
            tell(console, "[bold]kept[/] " + escape(f"the cluster {cluster} (down: false; {after}): "
                                                    f"`{shell_line(['sky', 'down', cluster])}` takes it down"))
        elif cluster != skypilot_cluster(plan.recipe, run_dir):
            tell(console, "[bold]kept[/] " + escape(
                f"the cluster {cluster}, named by scheduler.skypilot.cluster_name: SkyPilot takes it down once no "
                f"job runs on it (--down)"))
        elif job_ran and s.idle_minutes_to_autostop is not None:
            tell(console, "[bold]kept[/] " + escape(
                f"the cluster {cluster}: SkyPilot takes it down after {s.idle_minutes_to_autostop} idle minutes"))
        else:
            patience.call(lambda: down(cluster))
            tell(console, f"[bold]took down[/] the cluster {escape(cluster)}: nothing of the run bills")

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        launched = self._launched(run_dir)
        if launched is None or not launched[1]:
            return None
        cluster, jobs = launched
        try:
            state = self._patience(plan, Console(stderr=True)).call(lambda: job_state(cluster, jobs[-1]))
        except Unreachable:
            return None
        return f"SkyPilot job {jobs[-1]} on {cluster}" if state == NOT_FINISHED else None

    # -- grpo stop -----------------------------------------------------------------------------------------------

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        launched = self._launched(run_dir)
        if launched is None:
            read_submitted(run_dir)  # says that nothing was started here
            raise UserError(f"{run_dir}'s record of a started run is not SkyPilot's", key="RUN_DIR")
        cluster, jobs = launched
        own = cluster == skypilot_cluster(plan.recipe, run_dir)
        patience = self._patience(plan, console)
        try:
            if not own and not jobs:  # the cluster may run other runs' jobs: which one is this run's is not known
                return self._ask_which(cluster, patience, console)
            if jobs:
                cancelled = patience.call(lambda: cancel(cluster, jobs))
                tell(console, f"[bold]cancelled[/] SkyPilot job {', '.join(jobs)} on {escape(cluster)}" if cancelled
                              else f"[bold]nothing to cancel[/]: the cluster {escape(cluster)} is down or stopped")
            if own and self.settings(plan).down:  # every job on it ends with it, a launch still provisioning too
                self._bring_home(plan, run_dir, console)
                patience.call(lambda: down(cluster))
                tell(console, f"[bold]took down[/] the cluster {escape(cluster)}, the run's own")
                return 0
            if own:
                strays = [j for j in patience.call(lambda: unfinished_jobs(cluster)) if j not in jobs]
                if strays:
                    patience.call(lambda: cancel(cluster, strays))
                    tell(console, f"[bold]cancelled[/] SkyPilot job {', '.join(strays)}: on the run's own cluster, "
                                  "its launch's answer lost")
            ends = ("SkyPilot takes it down once no job runs on it (--down)" if self.settings(plan).down
                    else f"`{shell_line(['sky', 'down', cluster])}` takes it down")
            tell(console, "[bold]kept[/] " + escape(f"the cluster {cluster}: {ends}"))
            return 0
        except Unreachable as lost:
            tell(console, "[bold yellow]left as it is:[/] " + escape(f"{lost}; `grpo stop {run_dir}` again"))
            return EXIT_LEFT_RUNNING

    def _ask_which(self, cluster: str, patience: Patience, console: Console) -> int:
        """A record with no job ID (an earlier grpo-launch kept none; or the launch has not answered yet) on a cluster
        other runs may share: nothing is cancelled blindly."""
        unfinished = patience.call(lambda: unfinished_jobs(cluster))
        if not unfinished:
            tell(console, f"[bold]nothing to stop[/]: no job runs on the cluster {escape(cluster)}")
            return 0
        tell(console, "[bold yellow]not cancelled:[/] " + escape(
            f"the run's record names no job ID (an earlier grpo-launch kept none, or its launch has not answered) "
            f"and the cluster {cluster} may run other runs' jobs: SkyPilot job(s) {', '.join(unfinished)} run "
            f"there. Cancel this run's with `sky cancel {cluster} ID` (`sky queue {cluster}` lists them)"))
        return 1

    def logs(self, plan: Plan, run_dir: Path) -> RunLogs:
        launched = self._launched(run_dir)
        cluster = launched[0] if launched else self.own_cluster(plan, run_dir)
        # metrics.jsonl and the logs from node 0's copy of the run directory, over the SSH host SkyPilot names after
        # the cluster (`sky launch` writes its ssh config); checkpoints stay there. Trainer rank 0, which writes the
        # metrics, runs on node 0; the other nodes' logs stay on them.
        return RunLogs(f"{cluster}:{SKY_WORKDIR}/logs/ (node 0)",
                       ("rsync", "-a", "--include=metrics.jsonl", "--include=logs/***", "--exclude=*",
                        f"{cluster}:{SKY_WORKDIR}/", f"{run_dir}/"))
