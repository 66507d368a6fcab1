"""What the planner and the processes it starts agree on, and nothing else.

The planner (compose, plan, memory) writes a run directory; the processes (the trainer ranks, the routing proxy,
the inference servers) and the supervisor read it. Both sides import the names and shapes they share from here:
the run directory's file names (`rundir`), the typed `plan.json` (`plan`, `memory`), the built-in parts a recipe
can name (`builtins`, `tiny`), and vLLM's fixed names (`vllm`). This package imports nothing from the rest of
grpo-launch except `errors`, so a process never pulls the planner in, and the planner never pulls in torch.
"""
