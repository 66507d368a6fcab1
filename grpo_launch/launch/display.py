"""The console view of a run: an observer of the supervisor's events, never part of its control.

Three ways to show a run, all of them keeping every line whole in the process's log and every TRL record in
metrics.jsonl:

- in a terminal: a live region at the bottom, redrawn in place, holds what is awaited and the training view (step,
  mean reward and its trend, loss, KL where there is one, completion length, step time, the measured phase split
  and throughput, ETA), read from metrics.jsonl. Above it, what the processes say with a coloured prefix: errors,
  warnings, readiness. TRL's raw log records (a Python dict of ~30 metrics a step) and progress bars are not
  echoed: the view shows them;
- without a terminal (a pipe, CI, a batch job): the same prefixed lines, and the training view as a plain line at
  a steady cadence (the first step, then every `PLAIN_EVERY_S` while steps advance, and the last), without
  control characters;
- `--verbose`: every line as the processes print it, the raw stream as it always was.

Watching must not slow the training it watches (benchmarks/run_overhead.py): the live region is redrawn only when
something changed, and a line costs a few string tests before it is printed or passed over.
"""

from __future__ import annotations

import re
import time
from collections import deque
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from grpo_launch.contracts import measures
from grpo_launch.contracts.phases import Phase
from grpo_launch.contracts.rundir import MetricsTail
from grpo_launch.contracts.shell import shell_line
from grpo_launch.launch.result import RunResult

COLORS = ("green", "magenta", "cyan", "yellow", "blue", "bright_red", "bright_green", "bright_magenta")
PLAIN_EVERY_S = 10.0
TREND_STEPS = 5                   # the reward's trend: the mean of the last records against the ones before
SPARK = "▁▂▃▄▅▆▇█"
SHOWN_SHARE = 0.01                # the view's phase split leaves out phases under 1% of the step: noise at a glance
CURSOR_MOVE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # tqdm moves the cursor up and down between nested bars
# A tqdm progress bar at the start of a line's last segment: "Map: 100%|██████████| 512/512 [00:00<00:00, ...]".
PROGRESS_BAR = re.compile(r"^\s*(?:[^|\[]*: )?\s*\d+%\|[^|]*\|[^\[]*\[[^\]]*\]")


def echoed_part(text: str) -> str | None:
    """What the compact views show of a process's line: nothing of a TRL log record or a progress bar (the
    training view shows them), nor of a line that only redraws them (the cursor moves of nested progress bars,
    as evaluation draws one inside training's), else what is left once any progress bar drawn into the line is
    taken out (a warning printed right after one)."""
    last = CURSOR_MOVE.sub("", text.rpartition("\r")[2])
    if last.startswith("{'") and last.endswith("}"):
        return None
    if "%|" in last:
        last = PROGRESS_BAR.sub("", last, count=1)
        if not last.strip():
            return None
    if not last.strip() and text.strip():
        return None
    return last


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class TrainingView:
    """The training as metrics.jsonl tells it: the latest record, the rewards so far, the pace of the steps, and
    what the trainer measured (contracts.measures): the latest step's phase split, the throughput since the first
    step per training GPU (`per`: the trainer ranks and the unit, a CPU process on a CPU run)."""

    def __init__(self, run_dir: Path, total_steps: int, per: tuple[int, str] | None = None) -> None:
        self.tail = MetricsTail(run_dir)
        self.total = total_steps if total_steps > 0 else None
        self.per = per
        self.step = 0
        self.latest: dict = {}
        self.measured: dict = {}                        # the latest measure record
        self.completions = 0                            # so far, and the measured steps' wall time
        self.measured_s = 0.0
        self.rewards: deque[float] = deque(maxlen=4 * TREND_STEPS)
        self.times: deque[tuple[int, float]] = deque(maxlen=2 * TREND_STEPS)  # (step, wall time) of the records

    def update(self) -> bool:
        """Read the records written since the last update; whether there was any."""
        records = self.tail.new_records()
        for record in records:
            self.step = record["step"]
            if measures.is_measure(record):
                if self.measured:  # after the first step, which carries one-time costs (as the report counts)
                    self.completions += record.get(measures.COMPLETIONS) or 0
                    self.measured_s += record[measures.STEP_S]
                self.measured = record
            if measures.REWARD in record:  # a training step's record, not the run's closing summary
                self.latest = record
                self.rewards.append(record[measures.REWARD])
                self.times.append((record["step"], record["time"]))
        return bool(records)

    @property
    def done(self) -> bool:
        return self.total is not None and self.step >= self.total

    def trend(self) -> float | None:
        """The mean reward of the last `TREND_STEPS` records less that of the ones before them."""
        recent = list(self.rewards)[-2 * TREND_STEPS:]
        half = len(recent) // 2
        if half == 0:
            return None
        return sum(recent[half:]) / (len(recent) - half) - sum(recent[:half]) / half

    def step_seconds(self) -> float | None:
        if self.measured:
            return self.measured[measures.STEP_S]
        if "step_time" in self.latest:
            return self.latest["step_time"]
        if len(self.times) < 2:
            return None
        (first_step, first), (last_step, last) = self.times[0], self.times[-1]
        return (last - first) / (last_step - first_step) if last_step > first_step else None

    def eta(self) -> float | None:
        """Seconds left by the pace of the recent records (wall time, so logging and generation count)."""
        if self.total is None or len(self.times) < 2:
            return None
        (first_step, first), (last_step, last) = self.times[0], self.times[-1]
        return (self.total - self.step) * (last - first) / (last_step - first_step) if last_step > first_step \
            else None

    def fields(self) -> list[tuple[str, str]]:
        """(name, value) of what the view shows, in order."""
        r = self.latest
        total = f"/{self.total}" if self.total else ""
        out = [("step", f"{self.step}{total}")]
        if measures.REWARD in r:
            trend = self.trend()
            out.append(("reward", f"{r[measures.REWARD]:.3f}" + ("" if trend is None else f" (trend {trend:+.3f})")))
        for key, name, fmt in ((measures.LOSS, "loss", ".4g"), ("kl", "kl", ".4g"),
                               ("completions/mean_length", "length", ".1f")):
            if key in r:
                out.append((name, format(r[key], fmt)))
        seconds = self.step_seconds()
        if seconds is not None:
            out.append(("step time", f"{seconds:.2f} s"))
        if self.measured:
            split = self.phase_split()
            if split:
                out.append(("phases", split))
            if self.per and self.completions and self.measured_s:
                count, unit = self.per
                out.append(("throughput", f"{self.completions / self.measured_s / count:.3g} completions/s per "
                                          f"training {unit}"))
        eta = self.eta()
        if eta is not None and not self.done:
            out.append(("ETA", _duration(eta)))
        if self.tail.bad_lines:  # a line cut by a full disk or a crash: skipped, said
            out.append(("unreadable metrics lines", str(self.tail.bad_lines)))
        return out

    def phase_split(self) -> str:
        """The latest step's phases that took at least `SHOWN_SHARE` of it, as shares: 'generate 34% train 40%'."""
        r = self.measured
        seconds = {p: r.get(p.key) or 0.0 for p in Phase}
        total = sum(seconds.values())
        return " ".join(f"{p} {100 * s / total:.0f}%" for p, s in seconds.items() if total and s / total >= SHOWN_SHARE)

    def plain(self) -> str:
        return " · ".join(f"{name} {value}" for name, value in self.fields())

    def sparkline(self) -> str:
        values = list(self.rewards)
        if len(values) < 2:
            return ""
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        return "".join(SPARK[min(len(SPARK) - 1, int((v - low) / span * len(SPARK)))] for v in values)

    def __rich__(self) -> Table:
        (_, step), *rest = self.fields()
        line = Text()
        for name, value in rest:
            line.append(f"{name} ", style="dim").append(f"{value}  ")
        grid = Table.grid(padding=(0, 1))
        grid.add_row(Text("training", style="bold"), ProgressBar(total=self.total, completed=self.step, width=24),
                     Text(step), Text(self.sparkline(), style="green"), line)
        return grid


class _Closable:
    """The console's stream, which may close or fail under a running job (`grpo run ... | head`, a terminal or ssh
    session gone, a full disk under a redirected output): from the first write that fails, output is dropped. The
    run goes on; its logs are in the run directory. (A write that would only block loses that write alone.)"""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.closed = False

    def _attempt(self, call) -> None:
        if self.closed:
            return
        try:
            call()
        except BlockingIOError:
            pass
        except (OSError, ValueError):  # ValueError: written after the stream object was closed
            self.closed = True

    def write(self, text: str) -> int:
        self._attempt(lambda: self.stream.write(text))
        return len(text)

    def flush(self) -> None:
        self._attempt(self.stream.flush)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


class ConsoleDisplay:
    def __init__(self, console: Console, names: list[str], *, verbose: bool = False) -> None:
        console.file = _Closable(console.file)
        self.console = console
        self.verbose = verbose
        self.terminal = console.is_terminal
        self.width = max((len(n) for n in names), default=0)
        self.colors = {name: COLORS[i % len(COLORS)] for i, name in enumerate(names)}
        self.prefixes = {name: Text(f"{name:>{self.width}} │ ", style=self.colors[name]) for name in names}
        self.waits: dict[str, tuple[str, float]] = {}    # what is awaited: name -> (url, since)
        self.view: TrainingView | None = None
        self.plain_at = float("-inf")                   # when the last plain line was printed
        self.plain_step = 0
        self.live = Live(self, console=console, transient=True, auto_refresh=False) if self.terminal else None

    def __rich__(self) -> Group:
        parts = []
        for name, (url, since) in self.waits.items():
            parts.append(Spinner("dots", Text(f"waiting for {name} at {url} ({time.monotonic() - since:.0f} s)")))
        if self.view is not None and self.view.step:
            parts.append(self.view)
        return Group(*parts)

    def __enter__(self) -> ConsoleDisplay:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def say(self, message: str, style: str = "bold") -> None:
        self.console.print(Text(f"[grpo] {message}", style=style))

    # -- events -------------------------------------------------------------------------------------------------
    def preparing(self, name: str, argv: list[str]) -> None:
        self.say(f"preparing {name}: {shell_line(argv)}")

    def started(self, name: str, pid: int, gpus: tuple[int, ...]) -> None:
        self.say(f"started {name} (pid {pid}, GPUs {','.join(map(str, gpus)) or '-'})", style=self.colors[name])

    def line(self, name: str, text: str) -> None:
        shown = text.rpartition("\r")[2] if self.verbose else echoed_part(text)
        if shown is not None:
            self.console.print(self.prefixes[name] + Text(shown), soft_wrap=True)

    def waiting(self, name: str, url: str) -> None:
        self.waits[name] = (url, time.monotonic())
        if self.live is None:
            self.say(f"waiting for {name} at {url}")

    def ready(self, name: str, seconds: float) -> None:
        self.waits.pop(name, None)
        self.say(f"{name} is ready ({seconds:.1f} s)")

    def not_waiting(self, name: str) -> None:
        self.waits.pop(name, None)

    def restarting(self, name: str, why: str, attempt: int, limit: int) -> None:
        self.say(f"{name} {why}: restarting it ({attempt} of {limit})", style="bold yellow")

    def training(self, run_dir: Path, total_steps: int, per: tuple[int, str] | None = None) -> None:
        self.view = TrainingView(run_dir, total_steps, per)

    def tick(self) -> None:
        changed = self.view is not None and self.view.update()
        if self.live is not None:
            if changed or self.waits:  # the spinner and the seconds waited move on their own
                self.live.refresh()
        elif changed and not self.verbose:
            self._plain_line()

    def _plain_line(self, *, last: bool = False) -> None:
        """The training view as one line: at a steady cadence when no terminal shows a live one, and once at the
        end (the live region goes when the run ends)."""
        view = self.view
        now = time.monotonic()
        if view.step > self.plain_step and (last or view.done or now - self.plain_at >= PLAIN_EVERY_S):
            self.plain_at, self.plain_step = now, view.step
            self.console.print(Text(f"[grpo] {view.plain()}"), soft_wrap=True)

    def stopping(self, presses: int, signal_name: str = "SIGINT") -> None:
        if presses > 1:
            self.say("killing every process now", style="bold red")
        elif signal_name == "SIGINT":
            self.say("stopping (Ctrl-C again to kill at once)", style="bold yellow")
        else:
            self.say(f"stopping on {signal_name} (a second signal kills at once)", style="bold yellow")

    def finished(self, result: RunResult) -> None:
        self.waits.clear()
        if self.view is not None:
            self.view.update()
            self._plain_line(last=True)
        if result.interrupted:
            self.say("interrupted: stopping every process", style="bold yellow")
        if result.left_running:
            self.say(f"left as it is, maybe running: {result.left_running}", style="bold yellow")
        for failure in result.failures:
            self.say(f"failed: {failure}", style="bold red")
            if failure.rank_error is not None:  # the rank's own traceback, whole and not interleaved with others
                self.say(f"{failure.rank_error.where}: its traceback ({failure.rank_error.path}):", style="red")
                for line in failure.rank_error.record.traceback.splitlines():
                    self.console.print(Text(f"    {line}"), soft_wrap=True)
            elif failure.tail:
                self.say(f"last lines of {failure.log}:", style="red")
                for line in failure.tail:
                    self.console.print(Text(f"    {line}"), soft_wrap=True)
