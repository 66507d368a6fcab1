"""The training side: everything that imports torch, transformers or TRL to train. Started on every rank as
`python -m grpo_launch.trainer --run-dir DIR`; it reads the run directory's plan.json (`contracts.rundir`) and never
the recipe, so nothing of the planner is imported here.
"""
