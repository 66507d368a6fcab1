"""The rich view of a sweep (`grpo plan -m`): one row per combination, and the JSON list in the same order."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from grpo_launch.plan.advisor import PROXY_ORDER
from grpo_launch.plan.sweep import Row

NOTE_WIDTH = 32


def _note(row: Row) -> Text:
    return Text(row.note, style="red" if row.plan is None or row.fits is False else "yellow")


def _cells(row: Row) -> list[Text]:
    if row.plan is None:
        return [Text("-")] * 4 + [Text("refused", style="bold red"), Text("-")]
    tight = row.tightest
    fits = {True: Text("yes", style="green"), False: Text("NO", style="bold red"), None: Text("?")}[row.fits]
    gpus = row.vllm_gpus
    shared = row.plan.engines and all(e.ranks for e in row.plan.engines)  # colocated: on the trainer ranks' GPUs
    rank = "" if row.rank is None else f"{row.rank}" + (" ★" if row.rank == 1 else "")
    return [Text(str(row.plan.world_size)), Text(f"{gpus} shared" if shared else str(gpus or "-")),
            Text(f"{tight.role} · {tight.binding.name}" if tight else "-"),
            Text(f"{tight.headroom_gib:.1f} of {tight.capacity_gib:g}" if tight else "-"), fits,
            Text(rank, style="bold green" if row.rank == 1 else "")]


def _table(keys: tuple[str, ...], rows: list[Row], *, numbered: bool, notes: bool) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    columns = [("#", "right")] if numbered else []
    columns += [(key, "left") for key in keys] + [("ranks", "right"), ("vLLM GPUs", "right"), ("binds", "left"),
                                                  ("headroom GiB", "right"), ("fits", "left"), ("throughput", "left")]
    for name, justify in columns:  # numbered: a narrow terminal, where cells wrap rather than lose their ends
        table.add_column(Text(name), justify=justify, no_wrap=not numbered or name == "#", overflow="fold")
    if notes:
        table.add_column("note", min_width=NOTE_WIDTH)
    for n, row in enumerate(rows, 1):
        cells = [Text(str(n))] * numbered + [Text(v) for v in row.combination.values] + _cells(row)
        table.add_row(*cells, *([_note(row)] if notes else []), style="bold" if row.rank == 1 else "")
    return table


def print_sweep(keys: tuple[str, ...], rows: list[Row], console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    planned = [r for r in rows if r.plan is not None]
    fitting = [r for r in planned if r.fits]
    swept = escape(", ".join(keys) or "(nothing swept)")
    console.print(f"[bold]{len(rows)} combination{'s' * (len(rows) != 1)}[/] of {swept} · {len(planned)} planned, "
                  f"{len(fitting)} fit, {len(rows) - len(planned)} refused")
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
    console.print(f"[dim]throughput: rank among the layouts that fit by the advisor's proxy ({PROXY_ORDER}); "
                  f"★ the best. binds: the device and phase with the least headroom.[/]")


def sweep_json(keys: tuple[str, ...], rows: list[Row]) -> list[dict[str, Any]]:
    """Each combination's plan (plan.json's contract) or error, in the table's order."""
    out = []
    for row in rows:
        entry: dict[str, Any] = {"values": dict(zip(keys, row.combination.values, strict=True)),
                                 "overrides": list(row.combination.overrides)}
        if row.error is not None:
            entry["error"] = {"message": row.error.message, "key": row.error.key, "hint": row.error.hint}
        else:
            entry |= {"fits": row.fits, "throughput_rank": row.rank, "best": row.rank == 1,
                      "throughput_proxy": row.throughput._asdict() if row.throughput else None,
                      "plan": row.plan.to_json()}
        out.append(entry)
    return out
