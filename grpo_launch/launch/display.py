"""The console view of a run: an observer of the supervisor's events, never part of its control.

Every process's lines with a coloured prefix, what is being waited for, the training progress read from
metrics.jsonl, and each failure with its log tail. One rich `Live` region holds the waits and the progress bar, so
they can show at the same time (a replica restarting while the trainer trains).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.spinner import Spinner
from rich.text import Text

from grpo_launch.launch.result import RunResult

COLORS = ("green", "magenta", "cyan", "yellow", "blue", "bright_red", "bright_green", "bright_magenta")


class LogTail:
    """The new complete lines of a growing file (a line still being written waits for the next read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                complete = f.read().rpartition(b"\n")[0]
        except OSError:
            return []
        if not complete:
            return []
        self.offset += len(complete) + 1
        return complete.decode(errors="replace").splitlines()


class TrainingProgress:
    """A progress bar fed by the trainer's metrics.jsonl: steps done of max_steps, and the latest reward."""

    def __init__(self, metrics: Path, total_steps: int) -> None:
        self.metrics = LogTail(metrics)
        self.bar = Progress(SpinnerColumn(), TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("steps"), TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
        self.task: TaskID = self.bar.add_task("training", total=total_steps if total_steps > 0 else None, info="")

    def update(self) -> None:
        for line in self.metrics.lines():
            record = json.loads(line)
            info = f"reward {record['reward']:.3f}" if "reward" in record else ""
            self.bar.update(self.task, completed=record["step"], **({"info": info} if info else {}))


class ConsoleDisplay:
    def __init__(self, console: Console, names: list[str]) -> None:
        self.console = console
        self.width = max((len(n) for n in names), default=0)
        self.colors = {name: COLORS[i % len(COLORS)] for i, name in enumerate(names)}
        self.waits: dict[str, tuple[str, float]] = {}    # what is awaited: name -> (url, since)
        self.progress: TrainingProgress | None = None
        self.live = Live(self, console=console, transient=True, refresh_per_second=4, auto_refresh=True)

    def __rich__(self) -> Group:
        parts = []
        for name, (url, since) in self.waits.items():
            parts.append(Spinner("dots", Text(f"waiting for {name} at {url} ({time.monotonic() - since:.0f} s)")))
        if self.progress is not None:
            parts.append(self.progress.bar)
        return Group(*parts)

    def __enter__(self) -> ConsoleDisplay:
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.live.stop()

    def say(self, message: str, style: str = "bold") -> None:
        self.console.print(Text(f"[grpo] {message}", style=style))

    # -- events -------------------------------------------------------------------------------------------------
    def preparing(self, name: str, argv: list[str]) -> None:
        self.say(f"preparing {name}: {' '.join(argv)}")

    def started(self, name: str, pid: int, gpus: tuple[int, ...]) -> None:
        self.say(f"started {name} (pid {pid}, GPUs {','.join(map(str, gpus)) or '-'})", style=self.colors[name])

    def line(self, name: str, text: str) -> None:
        prefix = Text(f"{name:>{self.width}} │ ", style=self.colors.get(name, ""))
        self.console.print(prefix + Text(text.split("\r")[-1]), soft_wrap=True)

    def waiting(self, name: str, url: str) -> None:
        self.waits[name] = (url, time.monotonic())

    def ready(self, name: str, seconds: float) -> None:
        self.waits.pop(name, None)
        self.say(f"{name} is ready ({seconds:.1f} s)")

    def not_waiting(self, name: str) -> None:
        self.waits.pop(name, None)

    def restarting(self, name: str, code: int, attempt: int, limit: int) -> None:
        self.say(f"{name} exited with code {code}: restarting it ({attempt} of {limit})", style="bold yellow")

    def training(self, metrics: Path, total_steps: int) -> None:
        self.progress = TrainingProgress(metrics, total_steps)

    def tick(self) -> None:
        if self.progress is not None:
            self.progress.update()

    def stopping(self, presses: int) -> None:
        if presses == 1:
            self.say("stopping (Ctrl-C again to kill at once)", style="bold yellow")
        else:
            self.say("killing every process now", style="bold red")

    def finished(self, result: RunResult) -> None:
        self.waits.clear()
        if result.interrupted:
            self.say("interrupted: stopping every process", style="bold yellow")
        for failure in result.failures:
            self.say(f"failed: {failure}", style="bold red")
            if failure.tail:
                self.say(f"last lines of {failure.log}:", style="red")
                for line in failure.tail:
                    self.console.print(Text(f"    {line}"), soft_wrap=True)
