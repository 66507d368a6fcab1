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
class NodeLinks:
    """The links of the server a GPU sits in, per GPU and in one direction."""

    inter_node_gbs: float        # to other nodes, GB/s
    host_link_gbs: float         # to the host's memory (ZeRO offload), GB/s
    source: str                  # the server, and where its numbers come from


PCIE_X16_GBS = {4: 32, 5: 64}    # a PCIe x16 link's GB/s each way, by generation


def _links(server: str, nic: str, nic_gbit: int, gpus_per_nic: int, pcie_gen: int) -> NodeLinks:
    """A server's links per GPU, from its NICs and the PCIe generation of its GPUs' host link."""
    each = nic_gbit / 8 / gpus_per_nic
    host = PCIE_X16_GBS[pcie_gen]
    share = "one per GPU" if gpus_per_nic == 1 else f"one per {gpus_per_nic} GPUs"
    return NodeLinks(each, host, f"{server}: {nic} {nic_gbit} Gb/s, {share} ({each:g} GB/s each); host link PCIe "
                                 f"Gen{pcie_gen} x16 ({host} GB/s each way)")


_DGX_A100 = _links("NVIDIA DGX A100 datasheet", "8 x ConnectX-6 HDR InfiniBand", 200, 1, 4)


def _dgx_h(dgx: str) -> NodeLinks:
    return _links(f"NVIDIA {dgx} datasheet", "8 x ConnectX-7", 400, 1, 5)


def _pcie_server(nic_gbit: int, pcie_gen: int) -> NodeLinks:
    return _links("assumed: a PCIe server", "NICs of", nic_gbit, 2, pcie_gen)


@dataclass(frozen=True)
class Accelerator:
    name: str                                  # as the plan and the report print it
    peak_bf16_tflops: float                    # dense bf16 tensor throughput, TFLOP/s
    memory_gib: float                          # device memory
    memory_bandwidth_gbs: float                # device memory bandwidth, GB/s (1e9 bytes)
    intra_node_gbs: float                      # GPU-to-GPU within a node, GB/s per GPU, one direction
    intra_node_link: str                       # NVLink 4, PCIe Gen5 x16, ... (twice intra_node_gbs both ways)
    source: str                                # where the numbers come from
    aliases: tuple[str, ...] = ()
    node: NodeLinks = field(kw_only=True)      # the server it sits in


ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("H100", 989.4, 80, 3350, 450, "NVLink 4",
                "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "(989.4 dense), HBM3 3.35 TB/s, NVLink 900 GB/s",
                aliases=("H100-SXM", "H100-80GB", "H100-SXM5", "H100 80GB HBM3"), node=_dgx_h("DGX H100")),
    Accelerator("H100-PCIe", 756.5, 80, 2000, 64, "PCIe Gen5 x16",
                "NVIDIA H100 Tensor Core GPU datasheet, PCIe column: BF16 1,513 TFLOPS with sparsity (756.5 "
                "dense), HBM2e 2 TB/s, PCIe Gen5 128 GB/s", node=_pcie_server(400, 5)),
    Accelerator("H200", 989.4, 141, 4800, 450, "NVLink 4",
                "NVIDIA H200 Tensor Core GPU datasheet, SXM column: BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "(989.4 dense), HBM3e 4.8 TB/s, NVLink 900 GB/s", aliases=("H200-SXM", "H200-141GB"),
                node=_dgx_h("DGX H200")),
    Accelerator("A100-80GB", 312.0, 80, 2039, 300, "NVLink 3",
                "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: BF16 Tensor Core 312 TFLOPS (624 with "
                "sparsity), HBM2e 2,039 GB/s, NVLink 600 GB/s", aliases=("A100", "A100-SXM", "A100-SXM4-80GB"),
                node=_DGX_A100),
    Accelerator("A100-40GB", 312.0, 40, 1555, 300, "NVLink 3",
                "NVIDIA A100 Tensor Core GPU datasheet, 40GB SXM column: BF16 Tensor Core 312 TFLOPS, HBM2 "
                "1,555 GB/s, NVLink 600 GB/s", aliases=("A100-SXM4-40GB",), node=_DGX_A100),
    Accelerator("L40S", 362.05, 48, 864, 32, "PCIe Gen4 x16",
                "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity), GDDR6 864 GB/s, "
                "PCIe Gen4 x16 64 GB/s", node=_pcie_server(200, 4)),
    Accelerator("L4", 121.0, 24, 300, 32, "PCIe Gen4 x16",
                "NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity (121 dense), "
                "GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s", node=_pcie_server(100, 4)),
    Accelerator("MI300X", 1307.4, 192, 5300, 448, "AMD Infinity Fabric, 7 links",
                "AMD Instinct MI300X datasheet: peak BF16 1,307.4 TFLOPS dense, HBM3 5.3 TB/s, Infinity Fabric "
                "aggregate peak 896 GB/s", node=_links("AMD Instinct MI300X platform", "NICs of", 400, 1, 5)),
)

_ROWS = {re.sub(r"[\s_-]", "", n).lower(): a for a in ACCELERATORS for n in (a.name, *a.aliases)}


def accelerator(gpu_type: str) -> Accelerator | None:
    """The row `cluster.gpu_type` names, or None where the table has none (a CPU, an unknown GPU)."""
    return _ROWS.get(re.sub(r"[\s_-]", "", gpu_type).lower())


def known_types() -> list[str]:
    return [a.name for a in ACCELERATORS]
