"""The rich view of a plan: the GPU grid, the processes, the memory, the step time, the files, the warnings."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from grpo_launch.cli.console import console as plain_console
from grpo_launch.cli.console import counted, rule
from grpo_launch.cli.memory_view import print_memory
from grpo_launch.cli.prediction_view import print_prediction
from grpo_launch.contracts.plan import Plan, VllmSettings
from grpo_launch.contracts.secrets import secret_names
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.contracts.vllm import REPLICA_KEY_ENV
from grpo_launch.plan.documents import document_text
from grpo_launch.plan.launch_script import command_line

ROLE_STYLE = {"trainer": "green", "vllm": "magenta", "replica": "magenta", "proxy": "cyan", "idle": "dim"}


def _cell_style(label: str) -> str:
    if label.startswith("train") and "+" in label:
        return "bold yellow"  # a trainer rank hosting a colocated vLLM shard
    return ROLE_STYLE.get(label.split(" ")[0].replace("train", "trainer"), "")


def _grid(plan: Plan) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("", no_wrap=True)
    for g in range(plan.gpus_per_node):
        table.add_column(f"GPU{g}" if plan.device.gpus else f"{plan.device.label} {g}", no_wrap=True)
    for node, row in enumerate(plan.gpu_map):
        table.add_row(f"node {node}", *(Text(label.replace(" + ", "\n"), style=_cell_style(label)) for label in row))
    return table


def processes_table(plan: Plan) -> Table:
    """A row per process. A CPU plan's processes hold no GPU (CUDA_VISIBLE_DEVICES=''): no GPUs column there."""
    on_gpus = plan.device.gpus
    table = Table(box=None, pad_edge=False, header_style="bold", show_header=True)
    for col in ("process", "node", *["GPUs"] * on_gpus, "port", "waits for", "command"):
        table.add_column(col, overflow="fold", no_wrap=col != "command")
    for p in plan.processes:
        gpus = [",".join(map(str, p.gpus)) if p.gpus else "-"] * on_gpus
        table.add_row(Text(p.name, style=ROLE_STYLE.get(p.role, "")), str(p.node), *gpus,
                      str(p.port or "-"), Text(", ".join(p.depends_on) or "-"), Text(command_line(p)))
    return table


def bounds_line(plan: Plan) -> str:
    """How long the supervisor waits for what (plan.json has each process's own values)."""
    parts = [f"{p.name} ready within {p.ready_timeout_s:g} s" for p in plan.processes if p.ready_url]
    watched = [p for p in plan.processes if p.liveness]
    if watched:
        live = watched[0].liveness
        parts.append(f"a ready server is dead after {live.failures} unanswered probes in a row, one every "
                     f"{live.interval_s:g} s (noticed within {live.bound_s:g} s)")
    exits = {p.exit_timeout_s for p in plan.processes if p.exit_timeout_s}
    if exits:
        parts.append(f"trainer nodes exit within {max(exits):g} s of each other")
    parts += [f"prepare {step.name} within {step.timeout_s:g} s" for step in plan.prepare]
    return "; ".join(parts)


def secrets_line(plan: Plan) -> str:
    """The variables the processes read a secret from: names only, the values stay in the environment."""
    names = secret_names(plan)
    if not names:
        return ""
    line = f"read by name from the environment, never written: {', '.join(names)}"
    if REPLICA_KEY_ENV in names:
        line += (f"; every vLLM server requires {REPLICA_KEY_ENV} on every route but /health (yours, else made for "
                 f"the run where grpo starts every node)")
    return line


def _scheduler(plan: Plan, console: Console) -> None:
    """Who starts what on which node, and how each process learns its node's rank and the addresses."""
    s = plan.scheduler
    job = f" · job file {s.job_file} · submitted with `{shell_line(s.submit)}` in the run directory" \
        if s.job_file else ""
    console.print(f"[bold]scheduler[/] {escape(s.kind + job)}")
    if s.jobs:
        console.print(_jobs(plan))
    else:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("", "nodes", "processes", "started by", "ends"):
            table.add_column(col, overflow="fold")
        for g in s.groups:
            nodes = ",".join(map(str, g.nodes))
            table.add_row(*map(Text, (g.name, nodes, ", ".join(g.processes) or "-", g.command, g.ends)))
        console.print(table)
    if s.verbatim:
        console.print(f"[bold]as written[/] in {escape(str(s.job_file))}, not quoted (shell commands and scheduler "
                      f"options, by design):")
        for line in s.verbatim:
            console.print(Text.assemble(f"  {line.key}: ", (line.text, "bold")), soft_wrap=True)
    console.print(f"[bold]node rank[/] {escape(s.node_rank)}")
    console.print("[bold]addresses[/] " + escape(f"{s.addresses}: " + ", ".join(f"node {n} {host}"
                                                                             for n, host in enumerate(plan.hosts))))


def _jobs(plan: Plan) -> Table:
    """The machines a scheduler submits one by one (Hugging Face Jobs), in submit order: each one's flavor and
    price, image, mount, exposed ports, the address the others reach it at, its command, and when it ends."""
    s = plan.scheduler
    unit = "GPU" if plan.device.gpus else "CPU slot"
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
    return ", ".join(f"{k}={val}" for k, val in v.items())


def print_plan(plan: Plan, *, show_files: bool = False, memory_tables: bool = False,
               console: Console | None = None) -> None:
    """The plan, compact: the memory estimate as a verdict line per kind of memory unless `memory_tables`."""
    console = console or plain_console()
    devices = counted(plan.gpus_per_node, plan.device.slot)
    if plan.device.gpus:
        devices += f" ({plan.gpu_type} {plan.gpu_memory_gib:g}GB)"
    console.print(f"[bold]{escape(plan.recipe)}[/] " + escape(f"· placement={plan.placement} · "
                                                             f"{counted(plan.nodes, 'node')} × {devices} · "
                                                             f"{plan.parallelism} · {plan.launcher} · "
                                                             f"{counted(plan.world_size, 'trainer rank')}"))
    console.print()
    console.print(_grid(plan))
    console.print()
    v = plan.vllm
    if v.enabled:
        console.print(f"[bold]vllm[/]      {escape(f'{v.engine}: {vllm_settings_line(v)}')}")
    else:
        console.print(f"[bold]generation[/] {escape(v.engine)}")
    console.print("[bold]batch[/]     " + escape(", ".join(f"{k}={val}" for k, val in plan.batch.items())))
    console.print(f"[bold]trainer[/]   TRL {plan.trainer_class}(" +
                  escape(", ".join(f"{k}={val!r}" for k, val in plan.trainer_args.items())) + ")")
    console.print()
    console.print(processes_table(plan))
    if bounds := bounds_line(plan):
        console.print(f"[bold]bounds[/]    {bounds}")
    if secrets := secrets_line(plan):
        console.print(f"[bold]secrets[/]   {escape(secrets)}")
    console.print()
    _scheduler(plan, console)
    console.print()
    print_memory(plan.memory, console, tables=memory_tables)
    console.print()
    print_prediction(plan.prediction, console)
    console.print()
    console.print("[bold]files[/]     " + escape("  ".join(plan.files)))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    if show_files:
        for name, document in plan.files.items():
            rule(console, escape(name))
            console.print(document_text(name, document), markup=False, soft_wrap=True)
