"""The rich view of the memory estimate (per GPU and per node, by phase) and of the advisor's suggestions."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from grpo_launch.cli.console import counted
from grpo_launch.contracts.memory import Budget, MemoryEstimate, parameter_count
from grpo_launch.contracts.shell import shell_line
from grpo_launch.plan.advisor import RANKING, Advice


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0-3,5'."""
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(out)


def where(budget: Budget) -> str:
    """Where a budget's members are: 'node 0-3 · GPU 0-7', 'node 0 · GPU 6,7', 'node 0-3'."""
    by_node: dict[int, list[int]] = {}
    for member in budget.members:
        by_node.setdefault(member[0], []).extend(member[1:])
    nodes = sorted(by_node)
    gpu_sets = {tuple(g) for g in by_node.values()}
    if gpu_sets == {()}:
        return f"node {_ranges(nodes)}"
    if len(gpu_sets) == 1:
        return f"node {_ranges(nodes)} · GPU {_ranges(list(gpu_sets.pop()))}"
    return "; ".join(f"node {n} · GPU {_ranges(by_node[n])}" for n in nodes)


def _table(title: str, budgets: tuple[Budget, ...], unit: str) -> Table:
    phase_names = list(dict.fromkeys(p.name for b in budgets for p in b.phases))
    table = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False,
                  header_style="bold", show_edge=False)
    table.add_column("GiB", no_wrap=True)
    for name in phase_names:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("how", style="dim", overflow="fold")
    for budget in budgets:
        count = counted(len(budget.members), unit)
        table.add_row(Text(f"{budget.role} · {count} · {where(budget)}", style="bold"), *[""] * len(phase_names), "")
        phases = {p.name: {c.name: c for c in p.components} for p in budget.phases}
        names = list(dict.fromkeys(c.name for p in budget.phases for c in p.components))
        for name in names:
            cells = [f"{phases[ph][name].gib:.1f}" if name in phases.get(ph, {}) else "-" for ph in phase_names]
            detail = next(phases[ph][name].detail for ph in phase_names if name in phases.get(ph, {}))
            table.add_row(f"  {name}", *cells, Text(detail))
        binding = budget.binding.name
        style = "bold green" if budget.fits else "bold red"
        totals = [Text(f"{p.total_gib:.1f}", style=style if p.name == binding else "bold")
                  for p in (next(p for p in budget.phases if p.name == ph) for ph in phase_names)]
        verdict = "fits" if budget.fits else "DOES NOT FIT"
        table.add_row(Text("  total", style="bold"), *totals,
                      Text(f"{verdict}: {binding} binds, headroom {budget.headroom_gib:.1f} of "
                           f"{budget.capacity_gib:g} GiB", style=style))
        if budget.kv_cache:
            kv = budget.kv_cache
            table.add_row("", *[""] * len(phase_names),
                          f"KV cache: {kv.tokens:,} tokens = {kv.sequences} sequences of {kv.max_model_len} "
                          f"({kv.bytes_per_token // 1024} KiB per token per GPU); vLLM runs up to {kv.max_num_seqs} "
                          f"at once")
        for problem in budget.problems:
            table.add_row("", *[""] * len(phase_names), Text(problem, style="red"))
        table.add_section()
    return table


def _verdict(kind: str, budgets: tuple[Budget, ...]) -> Text:
    """One line for a kind of memory (the GPUs', the nodes' host memory): the devices that do not fit, else the
    tightest."""
    misfits = [b for b in budgets if not b.fits]
    shown = misfits or [min(budgets, key=lambda b: b.headroom_gib)]
    line = Text(f"  {kind:<9}")
    line.append(*("DOES NOT FIT", "bold red") if misfits else ("fits", "green"))
    for b in shown:
        line.append(f" · {b.role} · {where(b)}: {b.binding.name} {b.peak_gib:.1f} of {b.capacity_gib:g} GiB")
        line.append(f", headroom {b.headroom_gib:.1f}" if b.fits else "")
        for problem in b.problems:
            line.append(f"; {problem}", style="red")
    return line


def print_memory(memory: MemoryEstimate | None, console: Console, *, tables: bool = False) -> None:
    """The estimate: a verdict line per kind of device, or with `tables` every device's phases and components."""
    if memory is None:
        return
    for note in memory.notes:
        console.print(f"[bold]memory[/]    {escape(note)}")
    if not memory.estimated:
        return
    trainable = "" if memory.trainable_parameters == memory.parameters else \
        f", {parameter_count(memory.trainable_parameters)} trainable (LoRA)"
    more = "" if tables else " [dim](--memory: every device and phase)[/]"
    console.print(f"[bold]memory[/]    {escape(memory.model)} ({escape(memory.source)}): "
                  f"{parameter_count(memory.parameters)} "
                  f"parameters{trainable}; " + ("[green]fits[/]" if memory.fits else "[bold red]does not fit[/]")
                  + more)
    if not tables:
        for kind, budgets in (("GPU", memory.gpus), ("host", memory.hosts)):
            if budgets:
                console.print(_verdict(kind, budgets))
        return
    if memory.gpus:
        console.print(_table("memory per GPU (peak of each phase)", memory.gpus, "GPU"))
    console.print(_table("host memory per node", memory.hosts, "node"))


def print_advice(advice: Advice, console: Console) -> None:
    if not advice.suggestions:
        why = advice.skipped or "no layout of this cluster fits by the estimate"
        console.print(f"[bold]suggestions[/] none: {escape(why)}")
        return
    freed = f" (changing {escape(' '.join(advice.freed))}: nothing fits with it)" if advice.freed else ""
    console.print(f"[bold]suggestions[/] layouts that fit{freed}, best first by {escape(RANKING)}")
    if advice.unranked:
        console.print(f"  [yellow]{escape(advice.unranked)}[/]")
    for i, s in enumerate(advice.suggestions, 1):
        overrides = shell_line(s.overrides) or "(this plan as it is)"
        console.print(Text.assemble(f"  {i}. ", (overrides, "bold")))
        console.print(Text(f"     {s.summary}", style="dim"))
