"""Memory fit before launch: model shapes (catalog), the per-GPU and per-node estimate (estimate), the layout
advisor (advisor) and their views. `check_fit(composed, plan)` raises the "does not fit" error a launcher shows.

`build_plan` computes the estimate (`Plan.memory`); whether a misfit is fatal is the caller's choice (`--force`).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # The advisor re-plans, so it imports grpo_launch.plan, which imports this package: load it on first use.
    if name in ("advise", "check_fit"):
        from grpo_launch.memory import advisor

        return getattr(advisor, name)
    raise AttributeError(name)
