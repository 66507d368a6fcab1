"""A stand-in for `vllm serve` behind grpo-launch's real key guard (contracts.vllm_guard, the middleware every
planned `vllm serve` runs), served by uvicorn as vLLM serves its app: /health, /metrics and /pause, each answering
only what the guard lets through. It is not vLLM and generates nothing."""

import argparse

import uvicorn

from grpo_launch.contracts.vllm_guard import ReplicaKeyGuard

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()

ROUTES = {"/health": b"", "/metrics": b"vllm:num_requests_running 0.0\n", "/pause": b'{"status":"paused"}'}


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = ROUTES.get(scope["path"])
    await send({"type": "http.response.start", "status": 404 if body is None else 200, "headers": []})
    await send({"type": "http.response.body", "body": body or b""})


uvicorn.run(ReplicaKeyGuard(app), host="127.0.0.1", port=args.port, log_level="warning")
