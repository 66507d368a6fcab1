"""The trainer entrypoint, run by accelerate or torchrun on every rank: `python -m grpo_launch.trainer --run-dir DIR`.

It reads plan.json from the run directory (it never re-composes the recipe), builds the dataset, reward functions,
LoRA config and TRL trainer the plan names, trains (resuming from the newest checkpoint when there is one), and
logs every step to metrics.jsonl. Only the trainer package imports torch and TRL.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from grpo_launch.contracts.inputs import Lora
from grpo_launch.contracts.plan import Plan, Trainer
from grpo_launch.contracts.rundir import (
    FINAL_MODEL_DIR,
    REWARDS_DIR,
    append_metrics,
    checkpoint_dir,
    mark_checkpoint,
    read_plan,
    resumable_checkpoints,
    set_checkpoint_aside,
    sync_checkpoint,
)
from grpo_launch.contracts.secrets import secret_names, secret_values
from grpo_launch.trainer.data import import_target, load_training_dataset
from grpo_launch.trainer.measure import StepMeter, instrument, measure_callback
from grpo_launch.trainer.progress import PROGRESS, step_callback, write_failure
from grpo_launch.trainer.vllm_sync import reloads

RUN_DIR = Path(".")  # every rank works in its run directory (`main` goes there)


def load_reward(target: str):
    """'module:function', or 'path/file.py:function' (copied into the run's rewards/ by `grpo run`)."""
    where, _, func = target.rpartition(":")
    if where.endswith(".py"):
        # Imported by module name from rewards/ (not from a file spec) so it pickles into TRL's worker processes.
        sys.path.insert(0, str(Path(REWARDS_DIR).resolve()))
        return import_target(f"{Path(where).stem}:{func}")
    return import_target(target)


def _metrics_callback():
    from transformers import TrainerCallback

    class MetricsToJsonl(TrainerCallback):
        """Appends every log record of the main process to metrics.jsonl (step, wall time, TRL's metrics)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                append_metrics(RUN_DIR, {"step": state.global_step, "time": time.time(), **logs})

    return MetricsToJsonl()


def peft_config(lora: Lora | None):
    if lora is None:
        return None
    from peft import LoraConfig

    targets = lora.target_modules
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, task_type="CAUSAL_LM",
                      target_modules=targets[0] if targets == ["all-linear"] else targets)


def _untie_output_head(async_grpo_trainer) -> None:
    """FSDP2 cannot place one parameter in two shard groups, and accelerate shards embed_tokens apart from the root
    that holds lm_head: a model with tied embeddings (Qwen2.5-Math-1.5B) dies in prepare ("is shared with a
    parameter already managed by another FSDP group"). Give lm_head its own copy when the model is created. Numerically
    inert for LoRA, which trains neither; the replicas keep serving the original tied checkpoint."""
    import torch

    create = async_grpo_trainer.create_model_from_path

    def create_untied(model_id, **kwargs):
        model = create(model_id, **kwargs)
        if getattr(model.config, "tie_word_embeddings", False):
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
            model.config.tie_word_embeddings = False
        return model

    async_grpo_trainer.create_model_from_path = create_untied


def _common(plan: Plan, dataset, rewards, meter: StepMeter) -> dict:
    inputs = plan.trainer_inputs
    held_out = None
    if inputs.data.eval is not None:
        held_out = load_training_dataset(inputs.data, inputs.seed, chat=inputs.chat_prompts,
                                         held_out=True)
    return dict(model=inputs.model, reward_funcs=rewards, train_dataset=dataset, eval_dataset=held_out,
                peft_config=peft_config(inputs.lora),
                callbacks=[_metrics_callback(), step_callback(), measure_callback(meter), _checkpoint_callback()])


def measured(trainer, meter: StepMeter):
    """The trainer with wall-clock marks on its phases (trainer.measure)."""
    instrument(trainer, meter)
    return trainer


def train_grpo(plan: Plan, dataset, rewards) -> None:
    from trl import GRPOConfig, GRPOTrainer

    if plan.device.host_tensor_locations:
        _allow_indexed_cpu_locations()
    served = plan.vllm.server is not None  # TRL's server mode: its client reaches the server with the key
    args = GRPOConfig(**{**plan.trainer_args, **({"vllm_server_base_url": server_url(plan)} if served else {})})
    reload = reloads(plan)
    if reload:
        from grpo_launch.trainer.vllm_sync import use_reload_sync

        use_reload_sync()
    if plan.vllm.colocated is not None:
        from grpo_launch.trainer.vllm_sync import configure_colocated_engine

        configure_colocated_engine(**colocated_engine_args(plan, args))
    meter = StepMeter(RUN_DIR)
    trainer = measured(GRPOTrainer(args=args, **_common(plan, dataset, rewards, meter)), meter)
    if served:  # its client holds the URL now; the arguments, which checkpoints save, go back to the plain one
        trainer.args.vllm_server_base_url = plan.vllm.server.url
    run_trainer(trainer, plan)
    if reload:
        from grpo_launch.trainer.vllm_sync import check_engine_follows

        check_engine_follows(trainer, [row["prompt"] for row in dataset.select(range(3))])


def colocated_engine_args(plan: Plan, args) -> dict:
    """What TRL's LLM(...) call in each rank leaves out: vllm.enforce_eager (else vLLM captures CUDA graphs, or on a
    CPU compiles the model for 20 s a start), and where weights sync by reload the model's dtype (vLLM's CPU build
    would run a float32 checkpoint in bfloat16)."""
    engine_args = {"enforce_eager": True} if plan.vllm.colocated.enforce_eager else {}
    dtype = (args.model_init_kwargs or {}).get("dtype")
    if reloads(plan) and dtype is not None:
        engine_args["dtype"] = dtype
    return engine_args


def server_url(plan: Plan) -> str:
    """The URL of the trainer's vLLM server (TRL's vllm_server_base_url: the proxy, or the one `vllm serve`) as
    TRL's clients reach it. A server that requires a key (a keyed proxy; every `vllm serve`, contracts.vllm_guard)
    gets it in the URL's user info: TRL's clients (`requests` sessions for control calls, an aiohttp session for
    generation) take no headers, and all send a URL's credentials as HTTP Basic auth, which the proxy and the
    replicas' guard accept. A variable the environment does not hold sends nothing (the replicas' key on a node its
    scheduler did not give it: the launch said so). The URL lives in memory only; the supervisor keeps the key out
    of the logs."""
    url = plan.vllm.replicas.proxy_url if plan.vllm.replicas is not None else plan.vllm.server.url
    name = plan.trainer_inputs.server_key_env
    key = os.environ.get(name) if name else None
    if not key:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"grpo:{quote(key, safe='')}@{parts.netloc}"))


def train_async_loop(plan: Plan, dataset, rewards) -> None:
    """AsyncGRPOTrainer needs CUDA: where it cannot run, TRL's async pieces run in a loop of our own (one process:
    it resumes from its newest whole checkpoint, as it marks them)."""
    from grpo_launch.trainer.async_cpu import Checkpoints, train_on_cpu

    checkpoints = Checkpoints(Path(plan.trainer_facts.output_dir), plan.marks_checkpoints, set_aside)
    train_on_cpu(plan, dataset, rewards, peft_config(plan.trainer_inputs.lora), RUN_DIR, server_url(plan),
                 checkpoints)


def train_async_grpo(plan: Plan, dataset, rewards) -> None:
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

    from grpo_launch.trainer.response_templates import ensure_response_template
    from grpo_launch.trainer.tree_attention import use_sdpa_tree_attention

    if plan.trainer_inputs.attn_implementation == "sdpa":
        use_sdpa_tree_attention()
    _untie_output_head(async_grpo_trainer)
    tokenizer = AutoTokenizer.from_pretrained(plan.trainer_inputs.model)
    ensure_response_template(tokenizer)
    meter = StepMeter(RUN_DIR)
    args = AsyncGRPOConfig(**{**plan.trainer_args, "vllm_server_base_url": server_url(plan)})
    trainer = AsyncGRPOTrainer(args=args, processing_class=tokenizer, **_common(plan, dataset, rewards, meter))
    # Its client and rollout worker hold the URL now; the arguments, which checkpoints save, go back to the plain one.
    trainer.args.vllm_server_base_url = plan.vllm.replicas.proxy_url
    run_trainer(measured(trainer, meter), plan)


# What the trainer entrypoint runs, by the plan's TrainerInputs.trainer.
TRAINERS = {Trainer.GRPO: train_grpo, Trainer.ASYNC_GRPO: train_async_grpo, Trainer.ASYNC_LOOP: train_async_loop}


def _allow_indexed_cpu_locations() -> None:
    """Multi-process CPU runs give each rank the device 'cpu:N', and transformers resumes the optimizer with
    torch.load(map_location=args.device), which torch cannot map ("don't know how to restore data location ...
    tagged with cpu:0"). A deserializer for 'cpu:N' keeps such tensors on the CPU, where they already are."""
    import torch

    def on_cpu(obj, location: str):
        return obj if location.startswith("cpu:") else None

    torch.serialization.register_package(99, lambda obj: None, on_cpu)


def _checkpoint_callback():
    """A transformers callback that marks each checkpoint whole once it is: every rank syncs what it wrote to disk,
    the ranks meet, and rank 0 writes the marker (`contracts.rundir.CheckpointRecord`)."""
    from transformers import TrainerCallback

    class MarkCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            checkpoint = checkpoint_dir(Path(args.output_dir), state.global_step)
            if checkpoint.is_dir():
                sync_checkpoint(checkpoint)
            _barrier()
            if state.is_world_process_zero:
                mark_checkpoint(checkpoint, state.global_step)

    return MarkCheckpoints()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def agreed_checkpoint(output_dir: str, marked: bool) -> str | None:
    """The checkpoint every rank resumes from: rank 0's newest whole one, which every rank must have whole too (a
    rank deciding alone, on nodes that keep their own checkpoints, loaded step N where others started afresh)."""
    import torch.distributed as dist

    mine = resumable_checkpoints(Path(output_dir), marked=marked)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return str(mine[0]) if mine else None
    choice = [mine[0].name if mine else None]
    dist.broadcast_object_list(choice, src=0)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, choice[0] is None or any(p.name == choice[0] for p in mine))
    if not all(everyone):
        lacking = [rank for rank, has in enumerate(everyone) if not has]
        raise RuntimeError(f"rank 0 resumes from {choice[0]}, which rank(s) {lacking} do not have whole in "
                           f"{output_dir}: the nodes keep checkpoints of their own. Put trainer.output_dir on storage "
                           f"every node mounts at the same path")
    return str(Path(output_dir) / choice[0]) if choice[0] else None


def set_aside(checkpoint: Path, error: BaseException) -> RuntimeError:
    """A checkpoint that failed to load, set aside so that the next resume takes the one before it: the error the
    run fails with."""
    set_checkpoint_aside(checkpoint, "".join(traceback.format_exception_only(error)).strip())
    return RuntimeError(f"{checkpoint} could not be loaded, and is set aside: `grpo run --resume` resumes from the "
                        f"checkpoint before it")


def _loaded_callback(loaded: list[bool]):
    """A transformers callback that notes when training begins: the checkpoint resumed from has loaded by then."""
    from transformers import TrainerCallback

    class Loaded(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            loaded.append(True)

    return Loaded()


def run_trainer(trainer, plan: Plan) -> None:
    """Train a TRL trainer to the end, resuming from the newest whole checkpoint when there is one. A checkpoint that
    fails to load is set aside (the next resume takes the one before it) and the run fails saying so."""
    state = trainer.accelerator.state
    print(f"[grpo-launch] rank {state.process_index} of {state.num_processes} ({state.distributed_type}, "
          f"{state.device})", flush=True)
    output_dir = trainer.args.output_dir
    checkpoint = agreed_checkpoint(output_dir, plan.marks_checkpoints)
    if checkpoint and trainer.accelerator.is_main_process:
        print(f"[grpo-launch] resuming from {checkpoint}", flush=True)
    loaded: list[bool] = []
    trainer.add_callback(_loaded_callback(loaded))
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except BaseException as error:
        if checkpoint is None or loaded:
            raise
        raise set_aside(Path(checkpoint), error) from error
    if trainer.eval_dataset is not None and not _evaluated_at(trainer, trainer.state.global_step):
        trainer.evaluate()  # at the end too, as the colocate post scored its final models
    trainer.save_model(os.path.join(output_dir, FINAL_MODEL_DIR))
    if trainer.accelerator.is_main_process:
        print(f"[grpo-launch] training finished at step {trainer.state.global_step}", flush=True)


def _evaluated_at(trainer, step: int) -> bool:
    return any("eval_reward" in entry and entry.get("step") == step for entry in trainer.state.log_history)


def train(plan: Plan) -> None:
    inputs = plan.trainer_inputs
    PROGRESS.enter("loading the dataset")
    dataset = load_training_dataset(inputs.data, inputs.seed, chat=inputs.chat_prompts)
    PROGRESS.enter("loading the reward functions")
    rewards = [load_reward(r.target) for r in inputs.rewards]
    PROGRESS.enter("building the trainer")
    TRAINERS[inputs.trainer](plan, dataset, rewards)


def _exit(code: int) -> None:
    """Leave without running interpreter teardown: in about 1 of 10 multi-process CPU runs, a joinable C++ thread
    destroyed at teardown aborts rank 0 after training finished (SIGABRT). A barrier, destroy_process_group, a
    flush and os._exit prevented it in 20 of 20 runs."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            if code == 0:
                dist.barrier()
            dist.destroy_process_group()
    except Exception:  # a broken process group must not hide the training result
        traceback.print_exc()
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", default=".", help="the run directory holding plan.json")
    args = parser.parse_args()
    os.chdir(args.run_dir)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    code = 0
    secrets: tuple[str, ...] = ()
    try:
        plan = read_plan(RUN_DIR).with_addresses(os.environ)  # a scheduler's job gives node addresses
        secrets = secret_values(secret_names(plan), os.environ)
        train(plan)
    except BaseException as error:  # noqa: BLE001  (every failure must reach _exit, which passes the code on)
        traceback.print_exc()
        write_failure(error, secrets)
        code = 1
    _exit(code)


if __name__ == "__main__":
    main()
