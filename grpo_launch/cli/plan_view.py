"""The rich view of a plan: the GPU grid, the processes, the files, the warnings."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from rich.table import Table
from rich.text import Text

from grpo_launch.cli.memory_view import print_memory
from grpo_launch.contracts.plan import Plan, VllmSettings
from grpo_launch.plan.documents import document_text
from grpo_launch.plan.launch_script import command_line, shell_word

ROLE_STYLE = {"trainer": "green", "vllm": "magenta", "replica": "magenta", "proxy": "cyan", "idle": "dim"}


def _cell_style(label: str) -> str:
    if label.startswith("train") and "+" in label:
        return "bold yellow"  # a trainer rank hosting a colocated vLLM shard
    return ROLE_STYLE.get(label.split(" ")[0].replace("train", "trainer"), "")


def _grid(plan: Plan) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("", no_wrap=True)
    for g in range(plan.gpus_per_node):
        table.add_column("CPU " + str(g) if plan.accelerator == "cpu" else f"GPU{g}", no_wrap=True)
    for node, row in enumerate(plan.gpu_map):
        table.add_row(f"node {node}", *(Text(label.replace(" + ", "\n"), style=_cell_style(label)) for label in row))
    return table


def processes_table(plan: Plan) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_header=True)
    for col in ("process", "node", "GPUs", "port", "waits for", "command"):
        table.add_column(col, overflow="fold", no_wrap=col != "command")
    for p in plan.processes:
        gpus = ",".join(map(str, p.gpus)) if p.gpus else "-"
        table.add_row(Text(p.name, style=ROLE_STYLE.get(p.role, "")), str(p.node), gpus,
                      str(p.port or "-"), ", ".join(p.depends_on) or "-", command_line(p))
    return table


def _scheduler(plan: Plan, console: Console) -> None:
    """Who starts what on which node, and how each process learns its node's rank and the addresses."""
    s = plan.scheduler
    job = f" · job file {s.job_file} · submitted with `{' '.join(s.submit)}` in the run directory" if s.job_file else ""
    console.print(f"[bold]scheduler[/] {s.kind}{job}")
    if s.jobs:
        console.print(_jobs(plan))
    else:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("", "nodes", "processes", "started by", "ends"):
            table.add_column(col, overflow="fold")
        for g in s.groups:
            nodes = ",".join(map(str, g.nodes))
            table.add_row(g.name, nodes, ", ".join(g.processes) or "-", g.command, g.ends)
        console.print(table)
    console.print(f"[bold]node rank[/] {s.node_rank}")
    console.print(f"[bold]addresses[/] {s.addresses}: " +
                  ", ".join(f"node {n} {host}" for n, host in enumerate(plan.hosts)))


def _jobs(plan: Plan) -> Table:
    """The machines a scheduler submits one by one (Hugging Face Jobs), in submit order: each one's flavor and
    price, image, mount, exposed ports, the address the others reach it at, its command, and when it ends."""
    s = plan.scheduler
    unit = "GPU" if plan.accelerator == "cuda" else "CPU slot"
    widest = max(j.gpus for j in s.jobs)
    title = (f"{len(s.jobs)} Jobs, submitted in this order · ${s.price_per_hour:.2f}/h together · each has the "
             f"{unit}s its node uses (cluster.gpus_per_node={plan.gpus_per_node} is the widest Job's"
             f"{'' if widest else '; CPU Jobs'}) · {s.storage}")
    table = Table(box=None, pad_edge=False, header_style="bold", title=title, title_justify="left")
    for col in ("job", "node", "runs", "flavor", "$/h", "image", "mount", "exposes", "reached at", "ends", "command"):
        table.add_column(col, overflow="fold", no_wrap=col in ("job", "flavor"))
    ends = {g.name: g.ends for g in s.groups}
    for j in s.jobs:
        table.add_row(j.name, str(j.node), ", ".join(j.processes), f"{j.flavor} ({j.gpus} GPU)" if j.gpus else j.flavor,
                      f"{j.price_per_hour:.2f}", j.image, "read-only" if j.read_only else "read-write",
                      ", ".join(f"{port}{' (' + j.health + ')' if j.health else ''}" for port in j.expose) or "-",
                      j.address, ends[j.name], " ".join(shell_word(a) for a in j.command))
    return table


def vllm_settings_line(v: VllmSettings) -> str:
    """'key=value, ...' for every setting the placement resolved (LoRA slots flattened)."""
    values = {k: val for k, val in dataclasses.asdict(v).items() if k not in ("enabled", "engine", "lora")}
    if v.lora is not None:
        values |= dataclasses.asdict(v.lora)
    return ", ".join(f"{k}={val}" for k, val in values.items() if val is not None)


def print_plan(plan: Plan, *, show_files: bool = False, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    devices = "CPU process" if plan.accelerator == "cpu" else f"GPU ({plan.gpu_type} {plan.gpu_memory_gib:g}GB)"
    console.print(f"[bold]{plan.recipe}[/] · placement={plan.placement} · {plan.nodes} node × "
                  f"{plan.gpus_per_node} {devices} · {plan.parallelism} · {plan.launcher} · {plan.world_size} "
                  f"trainer rank(s)")
    console.print()
    console.print(_grid(plan))
    console.print()
    v = plan.vllm
    if v.enabled:
        console.print(f"[bold]vllm[/]      {v.engine}: {vllm_settings_line(v)}")
    else:
        console.print(f"[bold]generation[/] {v.engine}")
    b = plan.batch
    console.print("[bold]batch[/]     " + ", ".join(f"{k}={val}" for k, val in b.items()))
    console.print(f"[bold]trainer[/]   TRL {plan.trainer_class}(" +
                  ", ".join(f"{k}={val!r}" for k, val in plan.trainer_args.items()) + ")")
    console.print()
    console.print(processes_table(plan))
    console.print()
    _scheduler(plan, console)
    console.print()
    print_memory(plan.memory, console)
    console.print()
    console.print("[bold]files[/]     " + "  ".join(plan.files))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if show_files:
        for name, document in plan.files.items():
            console.rule(name)
            console.print(document_text(name, document), markup=False, soft_wrap=True)
