"""What a run measured, in the seeds' terms: `grpo report` and `grpo compare`.

- `run`: a run directory read as it is now (finished, failed or still going): its plan and metrics.jsonl's records.
- `summary`: one run's numbers (`Report`): wall time, median step time, throughput per training GPU and per GPU
  held, the phase split, MFU, samples trained, staleness, rewards, eval scores; rows for a table that more columns
  (a prediction) can join.
- `diagnosis`: the bottleneck in words, from the measured split, with the knob that moves it.
- `compare`: several runs side by side, ratios against the first, comparability, and the reward-parity test.
- `plots`: the reward curve, the phase timeline, the eval curve, the overlaid reward curves (PNG), drawn off the
  run's critical path (`CurvePlotter`: as the trainer closes).

The run directory is read through `contracts.rundir`; the metric names are `contracts.measures`, the phases
`contracts.phases`; docs/report.md is the user's side.
"""
