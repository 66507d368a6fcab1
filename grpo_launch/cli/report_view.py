"""The report's tables as the console shows them: a row per measure, a column per source (a run's measured
values; compare's runs side by side; a prediction can join as one more column over the same row keys)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from grpo_launch.report.summary import Row


def table(columns: dict[str, list[Row]], *, title: str | None = None) -> Table:
    """`columns`: header -> that column's rows; rows are matched by key, in the order they first appear."""
    order: dict[str, str] = {}
    for rows in columns.values():
        for row in rows:
            order.setdefault(row.key, row.label)
    out = Table(box=None, show_header=len(columns) > 1, header_style="bold", pad_edge=False, title=title,
                title_justify="left", title_style="bold")
    out.add_column("", style="dim", no_wrap=True)
    for header in columns:
        out.add_column(header, overflow="fold")
    values = {header: {row.key: row.value for row in rows} for header, rows in columns.items()}
    for key, label in order.items():
        out.add_row(label, *(values[h].get(key, "") for h in columns))
    return out


def findings_text(findings) -> Text:
    text = Text()
    for finding in findings:
        text.append(f"  {finding.kind}: ", style="bold yellow").append(finding.text)
        if finding.knob:
            text.append(f"  [{finding.knob} = {finding.value}]", style="cyan")
        text.append("\n")
    return text
