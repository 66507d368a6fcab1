"""Memory fit before launch: model shapes without a download (`catalog`) and the per-GPU, per-phase and per-node
estimate (`estimate`). Pure arithmetic over the plan: `build_plan` computes it (`Plan.memory`); the layout advisor
that searches for layouts that fit is planning, in `plan.advisor`.
"""
