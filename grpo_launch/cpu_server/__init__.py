"""A CPU inference engine for smoke tests: serves a small local model with transformers behind the part of vLLM's HTTP
API that TRL's async GRPO uses (completions with token ids and logprobs, pause/resume, runtime LoRA adapters).

It is never vLLM: no paged KV cache, no prefix cache, no continuous batching, one request batch at a time. A plan can
put `python -m grpo_launch.cpu_server MODEL ...` where it would put `vllm serve MODEL ...` on a machine without GPUs.
Only this package imports torch, transformers and peft, and `settings` does not: bad flags fail in a fraction
of a second.
"""
