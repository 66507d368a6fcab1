"""Trainer launch: one launcher process per trainer node (accelerate reading accelerate.yaml, or torchrun), each
starting that node's trainer ranks running the trainer entrypoint."""

from __future__ import annotations

import math

from grpo_launch.contracts.plan import Diagnosis, ProcessSpec, Role
from grpo_launch.contracts.rundir import ACCELERATE_FILE
from grpo_launch.plan.context import Context
from grpo_launch.plan.layout import Layout

TRAINER_MODULE = "grpo_launch.trainer"


def rendezvous_diagnoses(main_ip: str, port: int, timeout_s: float) -> tuple[Diagnosis, ...]:
    """torch.distributed's errors when the nodes' rendezvous does not complete, and what they mean (the errors,
    not the warnings of connection attempts it retries)."""
    where, key = f"{main_ip}:{port}", "run.rendezvous_timeout_s"
    return (
        Diagnosis(r"DistStoreError: Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined",
                  f"the trainer rendezvous at {where} did not complete within {timeout_s:g} s ({key}): not every "
                  f"trainer node joined; start each node's `grpo run --node-rank K` within that time"),
        Diagnosis(r"DistNetworkError: The client socket has timed out after \d+ms while trying to connect to",
                  f"trainer node 0's rendezvous at {where} did not answer within {timeout_s:g} s ({key}): start "
                  f"node 0, and check that {main_ip} is this node's way to reach it"),
    )


def trainer_processes(ctx: Context, layout: Layout, depends_on: tuple[str, ...], extra_env: dict[str, str],
                      secrets: tuple[str, ...]) -> list[ProcessSpec]:
    """One launcher per trainer node. Several nodes rendezvous at trainer node 0 within run.rendezvous_timeout_s.
    `secrets`: variables it reads besides env.passthrough."""
    config = ctx.config
    machines = len(layout.trainer_nodes)
    main_ip = ctx.hosts[layout.trainer_nodes[0]]
    port = config.run.main_process_port
    ctx.ports.claim(layout.trainer_nodes[0], port, "the trainer rendezvous", "run.main_process_port")
    timeout = config.run.rendezvous_timeout_s
    rendezvous = ["--rdzv_conf", f"timeout={math.ceil(timeout)}"] if machines > 1 else []
    diagnoses = rendezvous_diagnoses(main_ip, port, timeout) if machines > 1 else ()
    entry = ("-m", TRAINER_MODULE, "--run-dir", ".")
    out = []
    for machine_rank, node in enumerate(layout.trainer_nodes):
        if config.launcher == "accelerate":
            argv = ["accelerate", "launch", "--config_file", ACCELERATE_FILE]
            if machines > 1:  # the address on the command line too: a scheduler's job may give it at run time
                argv += ["--machine_rank", str(machine_rank), "--main_process_ip", main_ip, *rendezvous]
        else:
            argv = ["torchrun", "--nnodes", str(machines), "--node_rank", str(machine_rank),
                    "--nproc_per_node", str(len(layout.trainer_gpus)), "--master_addr", main_ip,
                    "--master_port", str(port), *rendezvous]
        name = "trainer" if machines == 1 else f"trainer-node{node}"
        out.append(ProcessSpec(name=name, role=Role.TRAINER, node=node, gpus=layout.trainer_gpus,
                               argv=tuple(argv) + entry, env=ctx.env(layout.trainer_gpus) | extra_env,
                               pass_env=tuple(dict.fromkeys([*config.env.passthrough, *secrets])),
                               depends_on=depends_on,
                               ranks=layout.ranks_on(node),
                               diagnoses=diagnoses,
                               exit_timeout_s=config.run.exit_timeout_s if machines > 1 else None))
    return out
