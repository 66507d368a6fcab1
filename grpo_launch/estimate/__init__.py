"""Estimates: arithmetic over a plan and the facts of its hardware and model, below the planner, which asks them.

- `catalog`: model shapes without a download (the catalog, or a local model's config.json);
- `accelerators`: each GPU's datasheet peaks and links, with their sources;
- `memory`: what every GPU and node holds, per phase (`Plan.memory`);
- `step_time`: what one optimizer step takes, phase by phase (`Plan.prediction`); each placement combines the phases
  its own way (`plan.placements`).

Nothing here reads a file but a local model's config.json (`catalog.local_config`) or knows a placement's name; the
layout advisor, which plans alternatives and ranks them by these estimates, is planning (`plan.advisor`).
"""
