"""The accelerators grpo-launch knows the speed of: peak dense bf16 matrix throughput, memory bandwidth and the
links between GPUs, each row with its source. Python data, no I/O: the plan (a step-time prediction), the memory
estimate and the run report (MFU) read it alike.

`cluster.gpu_type` names a row (case and '-'/'_'/' ' ignored, aliases included). A type that is not here has no
row: whatever needs a peak says "n/a" or "no prediction" rather than inventing one. CPUs have no row on purpose:
a CPU's bf16 peak depends on its cores, vector units and clock, none of which a recipe states.

Peaks are the vendors' dense figures (without 2:4 structured sparsity, which GRPO training never uses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    name: str                                  # as the plan and the report print it
    peak_bf16_tflops: float                    # dense bf16 tensor throughput, TFLOP/s
    memory_gib: float                          # device memory
    memory_bandwidth_gbs: float                # device memory bandwidth, GB/s (1e9 bytes)
    intra_node_gbs: float                      # GPU-to-GPU within a node, GB/s per GPU, one direction
    intra_node_link: str                       # NVLink 4, PCIe Gen5, ...
    source: str                                # where the numbers come from
    aliases: tuple[str, ...] = ()


ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("H100", 989.4, 80, 3350, 450, "NVLink 4 (900 GB/s both directions)",
                "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "(989.4 dense), HBM3 3.35 TB/s, NVLink 900 GB/s", aliases=("H100-SXM", "H100-80GB", "H100-SXM5")),
    Accelerator("H100-PCIe", 756.5, 80, 2000, 64, "PCIe Gen5 x16 (128 GB/s both directions)",
                "NVIDIA H100 Tensor Core GPU datasheet, PCIe column: BF16 1,513 TFLOPS with sparsity (756.5 "
                "dense), HBM2e 2 TB/s, PCIe Gen5 128 GB/s"),
    Accelerator("H200", 989.4, 141, 4800, 450, "NVLink 4 (900 GB/s both directions)",
                "NVIDIA H200 Tensor Core GPU datasheet, SXM column: BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "(989.4 dense), HBM3e 4.8 TB/s, NVLink 900 GB/s", aliases=("H200-SXM", "H200-141GB")),
    Accelerator("A100-80GB", 312.0, 80, 2039, 300, "NVLink 3 (600 GB/s both directions)",
                "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: BF16 Tensor Core 312 TFLOPS (624 with "
                "sparsity), HBM2e 2,039 GB/s, NVLink 600 GB/s", aliases=("A100", "A100-SXM")),
    Accelerator("A100-40GB", 312.0, 40, 1555, 300, "NVLink 3 (600 GB/s both directions)",
                "NVIDIA A100 Tensor Core GPU datasheet, 40GB SXM column: BF16 Tensor Core 312 TFLOPS, HBM2 "
                "1,555 GB/s, NVLink 600 GB/s"),
    Accelerator("L40S", 362.05, 48, 864, 32, "PCIe Gen4 x16 (64 GB/s both directions)",
                "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity), GDDR6 864 GB/s, "
                "PCIe Gen4 x16 64 GB/s"),
    Accelerator("L4", 121.0, 24, 300, 32, "PCIe Gen4 x16 (64 GB/s both directions)",
                "NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity (121 dense), "
                "GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s"),
    Accelerator("MI300X", 1307.4, 192, 5300, 448, "AMD Infinity Fabric (7 links, 896 GB/s both directions)",
                "AMD Instinct MI300X datasheet: peak BF16 1,307.4 TFLOPS dense, HBM3 5.3 TB/s, Infinity Fabric "
                "aggregate peak 896 GB/s"),
)

_ROWS = {re.sub(r"[\s_-]", "", n).lower(): a for a in ACCELERATORS for n in (a.name, *a.aliases)}


def accelerator(gpu_type: str) -> Accelerator | None:
    """The row `cluster.gpu_type` names, or None where the table has none (a CPU, an unknown GPU)."""
    return _ROWS.get(re.sub(r"[\s_-]", "", gpu_type).lower())


def known_types() -> list[str]:
    return [a.name for a in ACCELERATORS]
