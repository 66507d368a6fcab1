"""The KV-prefix routing proxy (`grpo proxy`): one OpenAI-compatible endpoint in front of N `vllm serve` replicas.

Generation requests go to the replica most likely to hold the prompt's KV prefix; adapter loads, pause/resume and
cache resets reach every replica; everything else answers as one server of data-parallel size 1, so TRL keeps
adapter-only sync on. aiohttp is imported only inside this package: `grpo plan` never loads it.
"""
