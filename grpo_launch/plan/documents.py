"""The files a user can take outside grpo-launch: the DeepSpeed JSON and the accelerate config."""

from __future__ import annotations

import json
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import hosts
from grpo_launch.contracts.devices import Device
from grpo_launch.contracts.plan import Sharding
from grpo_launch.contracts.rundir import ACCELERATE_FILE, DEEPSPEED_FILE
from grpo_launch.errors import UserError

# accelerate's distributed_type for each way the trainer ranks share the model.
DISTRIBUTED_TYPES = {Sharding.ZERO: "DEEPSPEED", Sharding.FSDP2: "FSDP", Sharding.DDP: "MULTI_GPU",
                     Sharding.NONE: "NO"}


def check_zero(config: Config) -> None:
    z = config.zero
    if z.offload_param and z.stage != 3:
        raise UserError(f"zero.offload_param needs ZeRO stage 3 (zero.stage={z.stage})", key="zero.offload_param",
                        hint="choose zero=3 or zero=3-offload, or set zero.offload_param=false")
    if z.offload_optimizer and z.stage == 0:
        raise UserError("zero.offload_optimizer needs DeepSpeed (zero.stage 1, 2 or 3)", key="zero.offload_optimizer",
                        hint="choose zero=3-offload, or set zero.offload_optimizer=false")


def sharding(config: Config, *, fsdp2: bool, processes: int) -> Sharding:
    """How the trainer ranks share the model: the ZeRO stage, else FSDP2 where the placement's trainer takes it,
    else plain data parallel, or one process."""
    if config.zero.stage:
        return Sharding.ZERO
    if fsdp2:
        return Sharding.FSDP2
    return Sharding.DDP if processes > 1 else Sharding.NONE


def deepspeed_config(config: Config, device: Device) -> dict[str, Any]:
    """DeepSpeed's JSON, "auto" where transformers fills the value from the TRL arguments."""
    z = config.zero
    pin = device.pin_memory
    zero: dict[str, Any] = {"stage": z.stage}
    if z.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if z.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    zero |= {k: v for k, v in (("contiguous_gradients", z.contiguous_gradients), ("overlap_comm", z.overlap_comm))
             if v is not None}
    if z.stage == 3:
        zero.update({"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                     "stage3_param_persistence_threshold": "auto",
                     "stage3_gather_16bit_weights_on_model_save": True})
    # No train_batch_size: DeepSpeed derives it. Under torchrun, ZeRO-3's zero.Init reads this file before the
    # process group exists (world size 1) and would reject transformers' "auto" fill for the real world size.
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def accelerate_config(config: Config, device: Device, *, machines: int, processes: int, main_ip: str,
                      shared: Sharding) -> dict[str, Any]:
    """accelerate's config file. Per-node launches add --machine_rank and --main_process_ip; an address known only
    where the job runs (`${GRPO_HOST_K}`) stays out of the file written (`document_text`)."""
    doc: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "num_machines": machines,
        "num_processes": processes,
        "machine_rank": 0,
        "main_process_ip": main_ip,
        "main_process_port": config.run.main_process_port,
        "rdzv_backend": "static",
        "same_network": True,
        "gpu_ids": "all",
        # On a CPU-only machine `use_cpu`/MULTI_CPU make accelerate start a single process; MULTI_GPU goes
        # through torch.distributed.run, which starts them all and falls back to gloo.
        "use_cpu": False,
    }
    if shared == Sharding.ZERO:
        doc["distributed_type"] = DISTRIBUTED_TYPES[shared]
        doc["deepspeed_config"] = {"deepspeed_config_file": DEEPSPEED_FILE,
                                   "zero3_init_flag": config.zero.stage == 3}
        if machines > 1:
            # Without it accelerate takes DeepSpeed's pdsh launcher: every `accelerate launch --machine_rank K`
            # becomes `deepspeed --hostfile None --launcher pdsh ...` (ssh to every node), ignoring --machine_rank.
            # `standard` starts torch.distributed.run on each node, like the other distributed types.
            doc["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
        return doc  # precision comes from deepspeed.json ("auto": the TRL arguments' bf16/fp16)
    doc["mixed_precision"] = device.mixed_precision(config.model.dtype)
    doc["distributed_type"] = DISTRIBUTED_TYPES[shared]
    if shared == Sharding.FSDP2:
        doc["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
            "fsdp_reshard_after_forward": True,
            # FULL_STATE_DICT with FSDP2 + PEFT checkpoints only rank 0's shard of each adapter tensor
            # (huggingface/accelerate#4206); sharded checkpoints resume correctly.
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    return doc


def _accelerate_file(document: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """accelerate.yaml as written: the config without an address known only where the job runs (accelerate would
    take `${GRPO_HOST_0}` for a host name; one machine needs none), and on several machines a header saying what
    `accelerate launch --config_file accelerate.yaml` by hand needs."""
    variables = sorted(hosts.variables_in(document["main_process_ip"]))
    if variables:
        document = {k: v for k, v in document.items() if k != "main_process_ip"}
    machines = document["num_machines"]
    if machines == 1:
        return "", document
    address = " --main_process_ip ADDRESS" if variables else ""
    lines = [f"On trainer node K (0..{machines - 1}): accelerate launch --config_file {ACCELERATE_FILE} "
             f"--machine_rank K{address} ... (launch.sh does)."]
    if variables:
        lines.append(f"main_process_ip, trainer node 0's address, is known only where the job runs ({variables[0]}): "
                     f"pass it with --main_process_ip, or add `main_process_ip: ADDRESS` here.")
    return "".join(f"# {line}\n" for line in lines), document


def document_text(name: str, document: Any) -> str:
    """A generated document in its file's format: text as is, YAML for .yaml, JSON otherwise."""
    if isinstance(document, str):
        return document
    if name.endswith((".yaml", ".yml")):
        import yaml

        class Dumper(yaml.SafeDumper):
            """Multi-line strings (a SkyPilot task's setup and run scripts) as literal blocks, readable as written."""

        def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

        Dumper.add_representer(str, text)
        header, document = _accelerate_file(document) if name == ACCELERATE_FILE else ("", document)
        return header + yaml.dump(document, Dumper=Dumper, sort_keys=False)
    return json.dumps(document, indent=2) + "\n"
