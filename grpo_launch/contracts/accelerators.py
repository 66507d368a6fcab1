"""The accelerators grpo-launch knows the speed of: peak dense bf16 matrix throughput, memory bandwidth and the
links between GPUs, each row with its source. Python data, no I/O: the plan (a step-time prediction), the memory
estimate and the run report (MFU) read it alike.

The links a step-time prediction needs beside the device's own figures are the network between nodes and the link
to the host's memory (ZeRO offload), per GPU and in one direction. They belong to the server the GPU sits in, not to
the GPU: each row gives the vendor's reference server for it (DGX and its NICs where one exists), and says so.

`cluster.gpu_type` names a row (case and '-'/'_'/' ' ignored, aliases included: the names torch gives the
devices, less "NVIDIA ", are aliases). A type that is not here has no
row: whatever needs a peak says "n/a" or "no prediction" rather than inventing one. CPUs have no row on purpose:
a CPU's bf16 peak depends on its cores, vector units and clock, none of which a recipe states.

Peaks are the vendors' dense figures (without 2:4 structured sparsity, which GRPO training never uses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


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
    inter_node_gbs: float = field(kw_only=True)  # to other nodes, GB/s per GPU, one direction
    host_link_gbs: float = field(kw_only=True)   # to the host's memory (ZeRO offload), GB/s per GPU, one direction
    network_source: str = field(kw_only=True)    # the server those two links assume, and where its numbers come from


# The servers the network and host-link figures assume (see the module docstring).
_DGX_H = ("{dgx} datasheet: 8 x ConnectX-7 400 Gb/s, one per GPU (50 GB/s each); host link PCIe Gen5 x16 "
          "(64 GB/s each way)")
_DGX_A100 = ("NVIDIA DGX A100 datasheet: 8 x ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU (25 GB/s each); host "
             "link PCIe Gen4 x16 (32 GB/s each way)")
_PCIE_SERVER = ("assumed: a PCIe server with one {nic} Gb/s NIC per two GPUs ({each} GB/s each); host link PCIe "
                "{gen} x16 ({host} GB/s each way)")

ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("H100", 989.4, 80, 3350, 450, "NVLink 4 (900 GB/s both directions)",
                "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "(989.4 dense), HBM3 3.35 TB/s, NVLink 900 GB/s",
                aliases=("H100-SXM", "H100-80GB", "H100-SXM5", "H100 80GB HBM3"),
                inter_node_gbs=50, host_link_gbs=64,
                network_source=_DGX_H.format(dgx="NVIDIA DGX H100")),
    Accelerator("H100-PCIe", 756.5, 80, 2000, 64, "PCIe Gen5 x16 (128 GB/s both directions)",
                "NVIDIA H100 Tensor Core GPU datasheet, PCIe column: BF16 1,513 TFLOPS with sparsity (756.5 "
                "dense), HBM2e 2 TB/s, PCIe Gen5 128 GB/s",
                inter_node_gbs=25, host_link_gbs=64,
                network_source=_PCIE_SERVER.format(nic=400, each=25, gen="Gen5", host=64)),
    Accelerator("H200", 989.4, 141, 4800, 450, "NVLink 4 (900 GB/s both directions)",
                "NVIDIA H200 Tensor Core GPU datasheet, SXM column: BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "(989.4 dense), HBM3e 4.8 TB/s, NVLink 900 GB/s", aliases=("H200-SXM", "H200-141GB"),
                inter_node_gbs=50, host_link_gbs=64,
                network_source=_DGX_H.format(dgx="NVIDIA DGX H200")),
    Accelerator("A100-80GB", 312.0, 80, 2039, 300, "NVLink 3 (600 GB/s both directions)",
                "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: BF16 Tensor Core 312 TFLOPS (624 with "
                "sparsity), HBM2e 2,039 GB/s, NVLink 600 GB/s", aliases=("A100", "A100-SXM", "A100-SXM4-80GB"),
                inter_node_gbs=25, host_link_gbs=32,
                network_source=_DGX_A100),
    Accelerator("A100-40GB", 312.0, 40, 1555, 300, "NVLink 3 (600 GB/s both directions)",
                "NVIDIA A100 Tensor Core GPU datasheet, 40GB SXM column: BF16 Tensor Core 312 TFLOPS, HBM2 "
                "1,555 GB/s, NVLink 600 GB/s", aliases=("A100-SXM4-40GB",),
                inter_node_gbs=25, host_link_gbs=32,
                network_source=_DGX_A100),
    Accelerator("L40S", 362.05, 48, 864, 32, "PCIe Gen4 x16 (64 GB/s both directions)",
                "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity), GDDR6 864 GB/s, "
                "PCIe Gen4 x16 64 GB/s",
                inter_node_gbs=12.5, host_link_gbs=32,
                network_source=_PCIE_SERVER.format(nic=200, each=12.5, gen="Gen4", host=32)),
    Accelerator("L4", 121.0, 24, 300, 32, "PCIe Gen4 x16 (64 GB/s both directions)",
                "NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity (121 dense), "
                "GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s",
                inter_node_gbs=6.25, host_link_gbs=32,
                network_source=_PCIE_SERVER.format(nic=100, each=6.25, gen="Gen4", host=32)),
    Accelerator("MI300X", 1307.4, 192, 5300, 448, "AMD Infinity Fabric (7 links, 896 GB/s both directions)",
                "AMD Instinct MI300X datasheet: peak BF16 1,307.4 TFLOPS dense, HBM3 5.3 TB/s, Infinity Fabric "
                "aggregate peak 896 GB/s",
                inter_node_gbs=50, host_link_gbs=64,
                network_source="AMD Instinct MI300X platform: one 400 Gb/s NIC per GPU (50 GB/s each); host link "
                "PCIe Gen5 x16 (64 GB/s each way)"),
)

_ROWS = {re.sub(r"[\s_-]", "", n).lower(): a for a in ACCELERATORS for n in (a.name, *a.aliases)}


def accelerator(gpu_type: str) -> Accelerator | None:
    """The row `cluster.gpu_type` names, or None where the table has none (a CPU, an unknown GPU)."""
    return _ROWS.get(re.sub(r"[\s_-]", "", gpu_type).lower())


def known_types() -> list[str]:
    return [a.name for a in ACCELERATORS]
