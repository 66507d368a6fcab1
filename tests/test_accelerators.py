from grpo_launch.estimate.accelerators import ACCELERATORS, accelerator, known_types


def test_every_row_has_positive_figures_and_a_source():
    for a in ACCELERATORS:
        assert a.peak_bf16_tflops > 0 and a.memory_bandwidth_gbs > 0 and a.intra_node_gbs > 0 and a.memory_gib > 0
        assert a.source and a.intra_node_link


def test_gpu_types_resolve_by_name_and_alias_ignoring_case_and_separators():
    assert accelerator("H100").name == "H100"
    assert accelerator("h100 sxm").name == "H100"
    assert accelerator("a100_80gb").name == "A100-80GB"
    assert accelerator("H200").memory_gib == 141


def test_cpus_and_unknown_types_have_no_row():
    assert accelerator("cpu") is None
    assert accelerator("TPUv5") is None
    assert len(set(known_types())) == len(ACCELERATORS)


def test_the_names_torch_gives_the_devices_resolve():
    assert accelerator("H100 80GB HBM3").name == "H100" and accelerator("H200").name == "H200"
    assert accelerator("A100-SXM4-80GB").name == "A100-80GB" and accelerator("H100 PCIe").name == "H100-PCIe"


def test_every_row_has_network_and_host_links_with_their_source():
    for a in ACCELERATORS:
        assert a.node.inter_node_gbs > 0 and a.node.host_link_gbs > 0 and a.node.source
