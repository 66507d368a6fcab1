"""The CPU inference server, run as a real process on 127.0.0.1 and driven with TRL's own async-GRPO client."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from conftest import free_port

from grpo_launch.compose.schema import TinyModel
from grpo_launch.trainer import tiny_model

REPO = Path(__file__).resolve().parents[1]
TINY_SHAPE = dataclasses.asdict(TinyModel())  # the built-in tiny model's default shape
SERVED = "tiny"
MAX_MODEL_LEN = 96
STARTUP_TIMEOUT_S = 120.0
LORA_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
# The flags a plan passes to `vllm serve` for async-lora replicas (grpo_launch.plan.processes.vllm_serve_argv).
LORA_FLAGS = ("--served-model-name", SERVED, "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
              "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9",
              "--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
              "--max-logprobs", "-1", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
              "--block-size", "16")
PROMPT = [7, 14, 8, 16]  # "3+4=" in the tiny tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'")


def _server_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo_launch.cpu_server", *args]


def _env(extra: dict[str, str]) -> dict[str, str]:
    # This checkout first: the shared venv's editable install points at another one.
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    return {**base, "PYTHONPATH": pythonpath, **extra}


@contextlib.contextmanager
def _serving(model_dir: Path, log_path: Path, flags: tuple[str, ...], env: dict[str, str]) -> Iterator[str]:
    """Start the server, wait for /health, yield its URL; always stop it (SIGTERM, then SIGKILL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        process = subprocess.Popen(_server_command(str(model_dir), "--port", str(port), *flags),
                                   stdout=log, stderr=subprocess.STDOUT, env=_env(env))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert process.poll() is None, f"server exited with {process.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"server not healthy in {STARTUP_TIMEOUT_S}s:\n{log_path.read_text()}"
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    tiny_model.build(out, TINY_SHAPE)
    return out


@pytest.fixture(scope="module")
def lora_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs") / "lora-server.log"


@pytest.fixture(scope="module")
def lora_server(model_dir, lora_log) -> Iterator[str]:
    with _serving(model_dir, lora_log, LORA_FLAGS, LORA_ENV) as url:
        yield url


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> SimpleNamespace:
    """What AsyncGRPOTrainer holds for adapter sync: its config and accelerator, built in that order (building a
    config resets accelerate's state). TRL's client logs through accelerate, so this also makes it usable."""
    from accelerate import Accelerator
    from trl.experimental.async_grpo import AsyncGRPOConfig

    args = AsyncGRPOConfig(output_dir=str(tmp_path_factory.mktemp("run")), max_staleness=0, bf16=False,
                           use_cpu=True, report_to="none")
    return SimpleNamespace(args=args, accelerator=Accelerator(cpu=True),
                           lora_dir=Path(args.output_dir) / ".vllm_lora")


@pytest.fixture(scope="module")
def trl_client(lora_server, trainer):
    """TRL's own client for the async trainer's control calls."""
    from trl.experimental.async_grpo.vllm_client import VLLMClient

    return VLLMClient(lora_server, server_timeout=30)


@pytest.fixture(scope="module")
def reference(model_dir):
    """The same model in this process, to check the server's logprobs against."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _complete(url: str, **body) -> dict:
    response = requests.post(f"{url}/v1/completions", json={"model": SERVED, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _sampled_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0,
                      top_k: int = 0) -> list[float]:
    """Logprobs of `completion`'s tokens under `model`, from logits / temperature restricted to the top k."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logprobs = logits.log_softmax(dim=-1)
    return [float(logprobs[i, t]) for i, t in enumerate(completion)]


def test_refuses_flags_it_cannot_honour(model_dir, tmp_path):
    cases = {("--bogus", "1"): "unrecognized arguments: --bogus",
             ("--tensor-parallel-size", "2"): "runs one process",
             ("--logprobs-mode", "raw_logits"): "invalid choice",
             ("--max-model-len", "4096"): "context length 128"}
    for flags, message in cases.items():
        done = subprocess.run(_server_command(str(model_dir), *flags), capture_output=True, text=True, timeout=60,
                              env=_env({}))
        assert (done.returncode, message in done.stderr) == (2, True), done.stderr
    missing = subprocess.run(_server_command(str(tmp_path / "absent")), capture_output=True, text=True, timeout=60,
                             env=_env({}))
    assert missing.returncode == 2 and "not a local model directory" in missing.stderr


def test_trl_client_reads_what_the_trainer_reads(lora_server, trl_client):
    client = trl_client
    client.wait_for_server_ready(poll_interval_s=0.2)
    assert client.get_max_model_len() == MAX_MODEL_LEN
    assert client.get_world_size() == 1
    assert client.get_dtype() == "torch.float32"
    info = client.get_server_info()
    assert info["lora_config"]["max_loras"] == 2 and info["lora_config"]["max_lora_rank"] == 8
    assert info["parallel_config"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                                       "data_parallel_size": 1, "world_size": 1}
    assert info["cache_config"]["block_size"] == 16
    assert info["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert info["weight_transfer_config"] == {"backend": "nccl"}
    text = requests.get(f"{lora_server}/server_info", timeout=10).json()
    assert isinstance(text["vllm_config"], str) and "not vLLM" in text["engine"]


def test_completions_with_token_id_prompts(lora_server, reference):
    prompts = [PROMPT, [5, 6, 7]]
    body = _complete(lora_server, prompt=prompts, n=3, max_tokens=8, temperature=1.0, logprobs=0, seed=11,
                     return_token_ids=True)
    assert body["object"] == "text_completion" and body["model"] == SERVED
    choices = body["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    assert [c["prompt_token_ids"] for c in choices] == [PROMPT] * 3 + [[5, 6, 7]] * 3
    for choice in choices:
        ids, logprobs = choice["token_ids"], choice["logprobs"]
        assert 1 <= len(ids) <= 8 and len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == len(ids)
        assert choice["finish_reason"] == ("length" if len(ids) == 8 else "stop")
        assert [list(top) for top in logprobs["top_logprobs"]] == [[t] for t in logprobs["tokens"]]
        expected = _sampled_logprobs(reference, choice["prompt_token_ids"], ids)
        assert logprobs["token_logprobs"] == pytest.approx(expected, abs=1e-4)
    assert body["usage"]["prompt_tokens"] == 7
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)

    single = _complete(lora_server, prompt=PROMPT, max_tokens=4, logprobs=0, return_tokens_as_token_ids=True)
    (choice,) = single["choices"]
    assert choice["token_ids"] is None and choice["text"] is not None
    assert all(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
    text = _complete(lora_server, prompt=["3+4="], max_tokens=2, return_token_ids=True)
    assert text["choices"][0]["prompt_token_ids"] == PROMPT


def test_logprobs_are_those_of_the_processed_distribution(lora_server, reference):
    body = _complete(lora_server, prompt=PROMPT, n=4, max_tokens=8, temperature=0.5, top_k=3, logprobs=2, seed=5,
                     return_token_ids=True)
    for choice in body["choices"]:
        expected = _sampled_logprobs(reference, PROMPT, choice["token_ids"], temperature=0.5, top_k=3)
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-4)
        assert all(len(top) <= 3 for top in choice["logprobs"]["top_logprobs"])


def test_seeded_sampling_is_reproducible(lora_server):
    def sample(seed: int) -> list[list[int]]:
        body = _complete(lora_server, prompt=PROMPT, n=2, max_tokens=12, seed=seed, return_token_ids=True)
        return [c["token_ids"] for c in body["choices"]]

    first = sample(1234)
    assert sample(1234) == first
    assert first[0] != first[1]  # sample j draws with seed + j
    assert sample(4321) != first


def test_request_errors_have_vllms_shape(lora_server):
    def post(**body) -> requests.Response:
        return requests.post(f"{lora_server}/v1/completions", json=body, timeout=30)

    unknown = post(model="trl-policy-v9", prompt=PROMPT)
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {"message": "The model `trl-policy-v9` does not exist.",
                                        "type": "NotFoundError", "param": "model", "code": 404}}
    too_long = post(model=SERVED, prompt=PROMPT, max_tokens=MAX_MODEL_LEN)
    assert too_long.status_code == 400 and "maximum context length is 96" in too_long.json()["error"]["message"]
    assert post(model=SERVED, prompt=[10_000]).status_code == 400
    assert post(model=SERVED, prompt=[]).status_code == 400
    streaming = post(model=SERVED, prompt=PROMPT, stream=True)
    assert streaming.status_code == 400 and "not supported" in streaming.json()["error"]["message"]


def test_pause_keep_queues_and_abort_rejects(lora_server, trl_client):
    client = trl_client
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 4, "return_token_ids": True}

    def post() -> requests.Response:
        return requests.post(f"{lora_server}/v1/completions", json=body, timeout=60)

    with ThreadPoolExecutor(max_workers=2) as pool:
        client.pause()  # mode=keep, as every TRL weight sync does
        assert requests.get(f"{lora_server}/is_paused", timeout=10).json() == {"is_paused": True}
        queued = pool.submit(post)
        time.sleep(0.5)
        assert not queued.done()
        assert requests.get(f"{lora_server}/health", timeout=10).status_code == 200
        client.resume()
        assert queued.result(timeout=60).json()["choices"][0]["finish_reason"] in ("stop", "length")

        client.pause()
        frozen = pool.submit(post)
        time.sleep(0.5)
        assert requests.post(f"{lora_server}/pause", params={"mode": "abort"}, timeout=30).status_code == 200
        assert frozen.result(timeout=60).json()["choices"][0]["finish_reason"] == "abort"
        rejected = post()
        assert rejected.status_code == 503 and rejected.json()["error"]["type"] == "ServiceUnavailableError"
        client.resume()
        assert post().status_code == 200

    assert requests.post(f"{lora_server}/pause", params={"mode": "wait"}, timeout=30).status_code == 200
    assert post().status_code == 503
    assert requests.post(f"{lora_server}/pause", params={"mode": "later"}, timeout=30).status_code == 400
    client.resume()
    assert post().status_code == 200


def _policy(model_dir: Path, seed: int):
    """A LoRA policy on the attention projections with random, non-zero B matrices, so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                        task_type="CAUSAL_LM")
    return get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), config).eval()


def _models(url: str) -> dict[str, dict]:
    return {card["id"]: card for card in requests.get(f"{url}/v1/models", timeout=10).json()["data"]}


def _served_logprobs(url: str, model: str, seed: int) -> tuple[list[int], list[float]]:
    (choice,) = _complete(url, model=model, prompt=PROMPT, max_tokens=8, logprobs=0, seed=seed,
                          return_token_ids=True)["choices"]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def test_versioned_adapter_sync_as_the_trainer_does_it(lora_server, trl_client, trainer, model_dir, reference):
    from trl.experimental.async_grpo.async_grpo_trainer import save_lora_adapter, select_adapter_sync

    assert select_adapter_sync(trl_client.get_server_info(), _policy(model_dir, 0), trainer.args) is True
    staleness = trainer.args.max_staleness
    with ThreadPoolExecutor(max_workers=1) as pool:
        for version in (1, 2, 3):
            policy, name = _policy(model_dir, version), f"trl-policy-v{version}"
            adapter_dir = trainer.lora_dir / name
            # AsyncGRPOTrainer._sync_weight_lora, step by step, with a request arriving while paused.
            trl_client.pause()
            queued = pool.submit(_complete, lora_server, prompt=PROMPT, max_tokens=4)
            save_lora_adapter(policy, trainer.accelerator, "default", str(adapter_dir))  # tmp dir, then rename
            trl_client.load_lora_adapter(name, str(adapter_dir))
            trl_client.resume()
            if version - (staleness + 1) > 0:
                trl_client.unload_lora_adapter(f"trl-policy-v{version - (staleness + 1)}")
            if version - (staleness + 1) > 1:
                shutil.rmtree(trainer.lora_dir / f"trl-policy-v{version - (staleness + 1) - 1}")
            assert queued.result(timeout=60)["choices"][0]["finish_reason"] in ("stop", "length")

            cards = _models(lora_server)
            assert set(cards) == {SERVED, name}
            assert (cards[name]["root"], cards[name]["parent"]) == (str(adapter_dir), SERVED)
            ids, logprobs = _served_logprobs(lora_server, name, seed=version)
            assert logprobs == pytest.approx(_sampled_logprobs(policy, PROMPT, ids), abs=1e-4)
            base = _sampled_logprobs(reference, PROMPT, ids)
            assert max(abs(a - b) for a, b in zip(logprobs, base, strict=True)) > 1e-2  # the adapter is applied
    assert sorted(os.listdir(trainer.lora_dir)) == ["trl-policy-v2", "trl-policy-v3"]

    with pytest.raises(Exception, match="has already been loaded"):
        trl_client.load_lora_adapter("trl-policy-v3", str(trainer.lora_dir / "trl-policy-v3"))
    missing = requests.post(f"{lora_server}/v1/load_lora_adapter", timeout=30,
                            json={"lora_name": "trl-policy-v4", "lora_path": str(trainer.lora_dir / "trl-policy-v4")})
    assert missing.status_code == 404 and "No adapter found for" in missing.json()["error"]["message"]
    unknown = requests.post(f"{lora_server}/v1/unload_lora_adapter", json={"lora_name": "trl-policy-v1"}, timeout=30)
    assert unknown.status_code == 404
    trl_client.unload_lora_adapter("trl-policy-v3")
    assert set(_models(lora_server)) == {SERVED}


def test_adapters_past_capacity_are_evicted_and_reloaded(lora_server, lora_log, model_dir, tmp_path):
    policies = {name: _policy(model_dir, seed) for seed, name in enumerate(("a", "b", "c"), start=11)}
    for name, policy in policies.items():
        policy.save_pretrained(tmp_path / name)
        load = requests.post(f"{lora_server}/v1/load_lora_adapter", timeout=30,
                             json={"lora_name": name, "lora_path": str(tmp_path / name)})
        assert load.status_code == 200 and load.text == f"Success: LoRA adapter '{name}' added successfully."
    assert set(_models(lora_server)) == {SERVED, "a", "b", "c"}  # --max-loras 2 bounds what is loaded, not named
    assert "evicting LoRA slot" in lora_log.read_text()
    for name, policy in policies.items():  # "a" was evicted by "c" and comes back from its path
        ids, logprobs = _served_logprobs(lora_server, name, seed=3)
        assert logprobs == pytest.approx(_sampled_logprobs(policy, PROMPT, ids), abs=1e-4)
    replaced = requests.post(f"{lora_server}/v1/load_lora_adapter", timeout=30,
                             json={"lora_name": "a", "lora_path": str(tmp_path / "b"), "load_inplace": True})
    assert replaced.status_code == 200, replaced.text
    ids, logprobs = _served_logprobs(lora_server, "a", seed=3)
    assert logprobs == pytest.approx(_sampled_logprobs(policies["b"], PROMPT, ids), abs=1e-4)
    for name in policies:
        assert requests.post(f"{lora_server}/v1/unload_lora_adapter", json={"lora_name": name},
                             timeout=30).text == f"Success: LoRA adapter '{name}' removed successfully."


def test_routes_and_lora_config_follow_flags_and_environment(model_dir, trainer):
    from trl.experimental.async_grpo.async_grpo_trainer import select_adapter_sync

    from grpo_launch.cpu_server.app import build_app
    from grpo_launch.cpu_server.engine import Engine
    from grpo_launch.cpu_server.server_info import server_info
    from grpo_launch.cpu_server.settings import parse_settings

    def served(flags: list[str], environ: dict[str, str]) -> tuple[set[str], dict]:
        settings = parse_settings([str(model_dir), *flags], environ)
        app = build_app(settings, Engine(settings))
        return {route.resource.canonical for route in app.router.routes()}, server_info(settings, "json")["vllm_config"]

    always = {"/health", "/v1/models", "/v1/completions"}
    dev = {"/pause", "/resume", "/is_paused", "/server_info", "/get_world_size"}
    lora = {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}
    paths, config = served([], {})
    assert paths == always and config["lora_config"] is None
    assert select_adapter_sync(config, _policy(model_dir, 0), trainer.args) is False  # TRL syncs merged weights
    assert served(["--enable-lora"], {"VLLM_SERVER_DEV_MODE": "1"})[0] == always | dev
    assert served(["--enable-lora"], {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})[0] == always | lora


# The tiny model's chat template (message contents concatenated) is no family TRL's add_response_schema knows, and the
# rollout worker refuses a tokenizer it cannot parse responses with: read every completion as plain assistant text.
PLAIN_RESPONSE_TEMPLATE = {"defaults": {"role": "assistant"},
                           "fields": {"content": {"close_pattern": r"<eos>\s*|$", "content": "text"}}}


def test_trl_rollout_worker_gets_rollouts_from_versioned_adapters(lora_server, trl_client, trainer, model_dir,
                                                                  monkeypatch):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import async_rollout_worker
    from trl.experimental.async_grpo.async_grpo_trainer import save_lora_adapter

    from grpo_launch.trainer.rewards import sevens

    # The worker's only use of vLLM is its HTTP API; it asks that the vllm package be installed all the same.
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.response_template = PLAIN_RESPONSE_TEMPLATE
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{a}+{b}="}]} for a, b in ((3, 4), (1, 5))])
    policies = {}

    def sync(version: int) -> None:
        """The trainer's adapter sync (the cold one at train begin, then one per step), then the version bump."""
        policies[version] = _policy(model_dir, 100 + version)
        name = f"trl-policy-v{version}"
        trl_client.pause()
        save_lora_adapter(policies[version], trainer.accelerator, "default", str(trainer.lora_dir / name))
        trl_client.load_lora_adapter(name, str(trainer.lora_dir / name))
        trl_client.resume()
        worker.update_model_version(version)

    worker = async_rollout_worker.AsyncRolloutWorker(
        model_name=SERVED, lora_name="trl-policy", dataset=dataset, reward_funcs=[sevens],
        processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id], num_generations=2, max_inflight_tasks=2,
        queue_maxsize=8, vllm_server_url=lora_server, max_tokens=6, temperature=1.0, request_timeout=60,
        child_ready_timeout=120)
    sync(1)
    try:
        worker.start()
        samples = [worker.rollout_buffer.get(timeout=90) for _ in range(4)]
        sync(2)
        for _ in range(32):  # groups generated before the bump are still queued ahead of the first v2 group
            samples.append(worker.rollout_buffer.get(timeout=90))
            if samples[-1].model_version == 2:
                break
        worker.check_health(stale_after_s=60)
    finally:
        worker.stop()
        for version in policies:
            trl_client.unload_lora_adapter(f"trl-policy-v{version}")

    assert {s.model_version for s in samples} == {1, 2}
    for sample in samples:
        mask = sample.completion_mask.astype(bool)
        prompt_len = int(mask.argmax())
        ids = sample.input_ids.tolist()
        assert tokenizer.decode(ids[:prompt_len]) in ("3+4=", "1+5=") and mask[prompt_len:].all()
        # The logprobs the trainer would use as the old policy's are exactly those of one published adapter: the
        # version the sample names, or a newer one. TRL stamps a group with the version current when its first
        # rollout goes out, while each rollout asks for the version current at its own request, so a group that
        # straddles a bump is labelled with the older version (trl async_rollout_worker: RolloutGroup.model_version
        # vs _request_model).
        served = sample.old_log_probs[mask].tolist()
        matching = [v for v in policies if v >= sample.model_version and served == pytest.approx(
            _sampled_logprobs(policies[v], ids[:prompt_len], ids[prompt_len:]), abs=1e-4)]
        assert matching, f"sample labelled v{sample.model_version} matches no published adapter"
        assert sample.metrics["rewards/sevens"] == sevens([tokenizer.decode(ids[prompt_len:],
                                                                            skip_special_tokens=True)])[0]
