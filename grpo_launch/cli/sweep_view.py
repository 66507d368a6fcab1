"""The rich view of a sweep (`grpo plan -m`): one row per combination, and the JSON list in the same order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from grpo_launch.cli.console import console as plain_console
from grpo_launch.cli.console import counted
from grpo_launch.cli.prediction_view import hours
from grpo_launch.compose.grammar import parse_override
from grpo_launch.compose.recipes import GROUPS
from grpo_launch.plan.advisor import RANKING
from grpo_launch.plan.sweep import Row

if TYPE_CHECKING:
    from grpo_launch.compose.sweep import Combination

NOTE_WIDTH = 32


def _note(row: Row) -> Text:
    return Text(row.note, style="red" if row.plan is None or row.fits is False else "yellow")


def _predicted(row: Row) -> list[Text]:
    p = row.prediction
    if p is None:
        return [Text("-")] * 3
    per_gpu = p.samples_per_hour_per_gpu
    return [Text(f"{p.step_s:.1f}"), Text(f"{per_gpu:,.0f}"), Text(hours(p.gpu_hours))]


def _cells(row: Row) -> list[Text]:
    if row.plan is None:
        return [Text("-")] * 4 + [Text("refused", style="bold red")] + [Text("-")] * 4
    tight = row.tightest
    fits = {True: Text("yes", style="green"), False: Text("NO", style="bold red"), None: Text("?")}[row.fits]
    gpus = row.vllm_gpus
    shared = row.plan.engines and all(e.ranks for e in row.plan.engines)  # colocated: on the trainer ranks' GPUs
    rank = "" if row.rank is None else f"{row.rank}" + (" ★" if row.rank == 1 else "")
    return [Text(str(row.plan.world_size)), Text(f"{gpus} shared" if shared else str(gpus or "-")),
            Text(f"{tight.role} · {tight.binding.name}" if tight else "-"),
            Text(f"{tight.headroom_gib:.1f} of {tight.capacity_gib:g}" if tight else "-"), fits, *_predicted(row),
            Text(rank, style="bold green" if row.rank == 1 else "")]


def _table(keys: tuple[str, ...], rows: list[Row], *, numbered: bool, notes: bool) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    columns = [("#", "right")] if numbered else []
    columns += [(key, "left") for key in keys] + [("ranks", "right"), ("vLLM GPUs", "right"), ("binds", "left"),
                                                  ("headroom GiB", "right"), ("fits", "left"), ("step s", "right"),
                                                  ("samples/h/GPU", "right"), ("GPU-h", "right"),
                                                  ("throughput", "left")]
    for name, justify in columns:  # numbered: a narrow terminal, where cells wrap rather than lose their ends
        table.add_column(Text(name), justify=justify, no_wrap=not numbered or name == "#", overflow="fold")
    if notes:
        table.add_column("note", min_width=NOTE_WIDTH)
    for n, row in enumerate(rows, 1):
        cells = [Text(str(n))] * numbered + [Text(v) for v in row.combination.values] + _cells(row)
        table.add_row(*cells, *([_note(row)] if notes else []), style="bold" if row.rank == 1 else "")
    return table


def summary(rows: list[Row]) -> str:
    """'12 fit, 3 refused (1 for memory)': every row counted once, as fitting, refused (a rule it breaks, or memory
    it does not have) or not sized (a model whose size the estimate does not know)."""
    fit = sum(r.fits is True for r in rows)
    memory = sum(r.fits is False for r in rows)
    unsized = sum(r.plan is not None and r.fits is None for r in rows)
    refused = len(rows) - fit - unsized
    text = f"{fit} fit, {refused} refused" + (f" ({memory} for memory)" if memory else "")
    return text + (f", {unsized} not sized (memory not estimated)" if unsized else "")


def print_sweep(keys: tuple[str, ...], rows: list[Row], console: Console | None = None) -> None:
    console = console or plain_console()
    planned = [r for r in rows if r.plan is not None]
    swept = escape(", ".join(keys) or "(nothing swept)")
    console.print(f"[bold]{counted(len(rows), 'combination')}[/] of {swept} · {summary(rows)}")
    # The notes (why a layout is refused, its first warning) in a column when the terminal is wide enough, else
    # below the table by row number: a reason folded into a few characters' width cannot be read.
    bare = _table(keys, rows, numbered=False, notes=False)
    if Measurement.get(console, console.options, bare).maximum + NOTE_WIDTH <= console.width:
        console.print(_table(keys, rows, numbered=False, notes=True))
    else:
        console.print(_table(keys, rows, numbered=True, notes=False))
        for n, row in enumerate(rows, 1):
            if row.note:
                console.print(Text.assemble(f"{n:>3}  ", _note(row)))
    console.print(f"[dim]step s: predicted optimizer step; samples/h/GPU: completions trained per hour per GPU held; "
                  f"GPU-h: for trainer.max_steps. throughput: rank among the layouts that fit by {RANKING}; ★ the "
                  f"best. binds: the device and phase with the least headroom.[/]")
    unpredicted = {r.plan.prediction.note for r in planned if r.prediction is None and r.plan.prediction}
    for note in sorted(unpredicted):
        console.print(f"[dim]{note}[/]")


def typed_values(keys: tuple[str, ...], combination: Combination) -> dict[str, Any]:
    """The swept values as the overrides give them to the plan: `vllm.tensor_parallel_size=4` an integer,
    `trainer.learning_rate=1e-6` a number; a group's option (`zero=3`) is the name of its file."""
    given = {o.key_or_group: o for o in map(parse_override, combination.overrides)}
    return {key: str(given[key].value()) if key in GROUPS else given[key].value() for key in keys}


def sweep_json(keys: tuple[str, ...], rows: list[Row]) -> list[dict[str, Any]]:
    """Each combination's plan (plan.json's contract) or error, in the table's order."""
    out = []
    for row in rows:
        entry: dict[str, Any] = {"values": typed_values(keys, row.combination),
                                 "overrides": list(row.combination.overrides)}
        if row.error is not None:
            entry["error"] = {"message": row.error.message, "key": row.error.key, "hint": row.error.hint}
        else:
            plan = row.plan.to_json()
            predicted = plan["prediction"] or {}
            entry |= {"fits": row.fits, "throughput_rank": row.rank, "best": row.rank == 1,
                      **{k: predicted.get(k) for k in ("step_s", "samples_per_hour_per_gpu", "gpu_hours", "cost")},
                      "plan": plan}
        out.append(entry)
    return out
