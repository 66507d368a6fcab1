"""What the planner and the processes it starts agree on, and nothing else.

The planner (compose, plan, estimate) writes a run directory; the processes (the trainer ranks, the routing proxy,
the inference servers), the supervisor and the report read it. Both sides import the names and shapes they share
from here: the run directory, each file's name, typed record, writer and reader (`rundir`), the typed plan
(`plan`, `memory`, `performance`, `schedulers`), TRL's fields and the facts of a plan's TRL arguments
(`trl_fields`), a step's phases (`phases`) and the measure records' names (`measures`), the built-in parts a recipe
can name (`builtins`, `tiny`), and vLLM's fixed names (`vllm`). This package imports nothing from the rest of
grpo-launch except `errors`, so a process never pulls the planner in, and the planner never pulls in torch.
"""
