"""Hardware for the GPUs people have (issue 36 item 1) and its names (issue 35 item 5): a preset
with cited data-sheet numbers and a host link for every common part, found from the names traces
give their devices; an estimate labelled as such for any other GPU of a known architecture; one
key per part and source, display names accepted, "did you mean" for typos."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.hardware.specs import choose_hardware, find_preset, pcie_bytes_per_s, resolve_hardware, specs_by_key, suggest
from taxmodel.ledger.kernel_costs import hardware_mismatch

# (the device name CUDA or ROCm reports, its SM / CU count, compute capability) -> the preset's key
DEVICES = [
    ("Tesla T4", 40, "7.5", "t4"), ("NVIDIA L4", 58, "8.9", "l4"), ("NVIDIA L40S", 142, "8.9", "l40s"),
    ("NVIDIA A10", 72, "8.6", "a10"), ("NVIDIA A10G", 80, "8.6", "a10g"), ("NVIDIA A40", 84, "8.6", "a40"),
    ("NVIDIA A30", 56, "8.0", "a30"), ("Tesla V100-PCIE-32GB", 80, "7.0", "v100-pcie"),
    ("Tesla V100S-PCIE-32GB", 80, "7.0", "v100s-pcie"), ("Tesla V100-SXM2-16GB", 80, "7.0", "v100"),
    ("NVIDIA GeForce RTX 2080 Ti", 68, "7.5", "rtx-2080-ti"), ("GeForce RTX 2080 Ti", 68, "7.5", "rtx-2080-ti"),
    ("NVIDIA GeForce RTX 3080", 68, "8.6", "rtx-3080"), ("NVIDIA GeForce RTX 3090", 82, "8.6", "rtx-3090"),
    ("NVIDIA GeForce RTX 4080", 76, "8.9", "rtx-4080"), ("NVIDIA GeForce RTX 4090", 128, "8.9", "rtx-4090"),
    ("Quadro RTX 8000", 72, "7.5", "quadro-rtx-6000"), ("NVIDIA RTX A6000", 84, "8.6", "rtx-a6000"),
    ("NVIDIA RTX 6000 Ada Generation", 142, "8.9", "rtx-6000-ada"), ("NVIDIA H20", 78, "9.0", "h20"),
    ("NVIDIA H800", 132, "9.0", "h800"), ("NVIDIA A800-SXM4-80GB", 108, "8.0", "a800"),
    ("NVIDIA GH200 480GB", 132, "9.0", "gh200"), ("NVIDIA GH200 120GB", 132, "9.0", "gh200"),
    ("NVIDIA GH200 144G HBM3e", 132, "9.0", "gh200-144gb"), ("NVIDIA H100 80GB HBM3", 132, "9.0", "h100"),
    ("AMD Instinct MI250X / MI250", 104, "9.0", "mi250"), ("AMD Instinct MI250X / MI250", 110, "9.0", "mi250x"),
    ("AMD Instinct MI210", 104, "9.0", "mi210"),
]


@pytest.mark.parametrize("name, sms, cc, key", DEVICES, ids=[f"{d[0]}/{d[1]}" for d in DEVICES])
def test_a_traces_device_name_finds_its_part(name, sms, cc, key):
    vendor = "amd" if name.startswith("AMD") else "nvidia"
    spec = resolve_hardware({"hardware": {"name": name, "num_sms": sms, "compute_capability": cc, "vendor": vendor}})
    assert spec.key == key
    assert hardware_mismatch({"hardware": {"name": name, "num_sms": sms}}, spec) is None


def test_every_shipped_spec_has_one_key_a_cited_source_and_a_host_link():
    specs = specs_by_key()
    assert len(specs) == len({s.name for s in specs.values()})
    for key, spec in specs.items():
        if spec.source in ("datasheet", "estimated") and spec.vendor != "cpu":
            assert spec.arch and spec.host_bytes_per_s > 0 and spec.host_link_text, key
            if spec.source == "datasheet":  # the data sheet (or whitepaper) its numbers come from
                assert any(w in (spec.extra.get("datasheet", "") + spec.notes).lower() for w in ("datasheet", "whitepaper")), key
            else:
                assert spec.estimated and "estimated" in spec.notes.lower(), key
        assert all(f.split(".")[0] in spec.to_dict() for f in spec.estimated), key
    # the 2080 Ti to 4090 and workstation siblings, the data-center parts of the last three generations
    for key in ("t4", "l4", "l40s", "a10", "a10g", "a40", "a30", "v100-pcie", "rtx-2080-ti", "rtx-3080", "rtx-3090",
                "rtx-4080", "rtx-4090", "quadro-rtx-6000", "rtx-a6000", "rtx-6000-ada", "h20", "h800", "a800", "gh200",
                "gh200-144gb", "mi210", "mi250"):
        assert key in specs


def test_host_links_are_the_pcie_rate_of_their_generation_or_nvlink_c2c():
    assert pcie_bytes_per_s(4, 16) == pytest.approx(16e9 * 128 / 130 / 8 * 16)  # 31.5 GB/s one direction
    assert pcie_bytes_per_s(5, 16) == 2 * pcie_bytes_per_s(4, 16) and pcie_bytes_per_s(9, 16) == 0
    assert find_preset("t4").host_link_text == "PCIe Gen3 x16" and find_preset("h100").host_link_text == "PCIe Gen5 x16"
    gh = find_preset("gh200")
    assert gh.host_link_text == "NVLink-C2C" and gh.host_bytes_per_s == 450e9 and gh.hbm_bytes_per_s == 4.0e12
    assert find_preset("gh200-144gb").hbm_bytes_per_s == 4.9e12  # its own memory, not the H100 SXM's 3.35 TB/s


@pytest.mark.parametrize("hw, basis", [
    ({"name": "NVIDIA GeForce RTX 3060", "num_sms": 28, "compute_capability": "8.6"}, "rtx-3080, rtx-3090"),
    ({"name": "NVIDIA GeForce RTX 3080 Ti", "num_sms": 80, "compute_capability": "8.6"}, "rtx-3080"),
    ({"name": "NVIDIA L40", "num_sms": 142, "compute_capability": "8.9"}, "l40s, rtx-6000-ada"),
    ({"name": "AMD Instinct MI300A", "vendor": "amd", "num_sms": 228, "arch": "gfx942"}, "mi300x"),
])
def test_any_other_gpu_of_a_known_architecture_gets_an_estimate_labelled_with_its_basis(hw, basis):
    spec, note = choose_hardware(None, {"hardware": hw}, prefer_calibrated=False)
    assert spec.source == "estimated" and spec.name == f"{hw['name']} (estimated)"
    assert basis in spec.notes and "estimated" in note and f"{hw['num_sms']} SMs" in spec.notes
    kin = [find_preset(k.strip()) for k in basis.split(",")]
    for dtype, peak in spec.peak_flops.items():  # scaled by SMs from the highest per-SM rate of its kin
        assert peak == pytest.approx(max(k.peak_flops[dtype] / k.num_sms for k in kin if dtype in k.peak_flops) * hw["num_sms"])


def test_an_estimate_takes_what_the_trace_recorded_and_an_architecture_from_kernel_names():
    nsys_like = {"name": "NVIDIA GeForce RTX 3070", "num_sms": 46, "compute_capability": "8.6",
                 "memory_bandwidth_bytes_per_s": 448e9, "l2_bytes": 4 << 20}
    spec = resolve_hardware({"hardware": nsys_like})
    assert spec.hbm_bytes_per_s == 448e9 and spec.l2_bytes == 4 << 20 and "memory bandwidth from the trace" in spec.notes
    hinted = {"vendor": "nvidia", "arch_hint": {"arch": "9.0", "basis": "the kernels' names (e.g. 'sm90_xmma_gemm')"}}
    spec = resolve_hardware({"hardware": hinted})
    assert spec.source == "estimated" and "sm90_xmma" in spec.notes and spec.peak_flops["bf16"] >= 989.4e12
    with pytest.raises(InputError, match="no preset shares its architecture 6.1"):
        resolve_hardware({"hardware": {"name": "NVIDIA GeForce GTX 1080 Ti", "num_sms": 28, "compute_capability": "6.1"}})


@pytest.mark.parametrize("name, key", [("h200", "h200"), ("H200 SXM", "h200"), ("h200 sxm", "h200"),
                                       ("h200-calibrated", "h200-calibrated"), ("H200 SXM (calibrated)", "h200-calibrated"),
                                       ("RTX4090", "rtx-4090"), ("rtx_4090", "rtx-4090"), ("GeForce RTX 4090", "rtx-4090"),
                                       ("A100-40GB", "a100-40gb")])
def test_a_key_or_a_display_name_names_one_spec_case_and_punctuation_ignored(name, key):
    spec, note = choose_hardware(name, None, prefer_calibrated=True)
    assert spec.key == key and note == f"hardware: {spec.shown}, as named"


def test_a_typo_gets_did_you_mean_and_the_keys():
    assert suggest("h2000")[0] == "h200" and suggest("rtx4900")[0] == "rtx-4090"
    with pytest.raises(InputError) as err:
        resolve_hardware(None, "h2000")
    msg = str(err.value)
    assert "did you mean h200" in msg and "h200-calibrated" in msg and "t4" in msg and "\n" not in msg
    res = CliRunner().invoke(cli, ["hardware", "H2000"])
    assert res.exit_code == 2 and "did you mean h200" in res.output


def test_the_hardware_command_lists_every_key_and_shows_one_in_full():
    res = CliRunner().invoke(cli, ["hardware"])
    assert res.exit_code == 0 and all(f"\n{k} " in res.output for k in ("t4", "gh200", "h200-calibrated", "mi250"))
    res = CliRunner().invoke(cli, ["hardware", "GeForce RTX 2080 Ti"])
    assert res.exit_code == 0 and res.output.startswith("rtx-2080-ti: GeForce RTX 2080 Ti (datasheet)") and "whitepaper" in res.output


def test_the_ledger_says_once_which_spec_and_labels_an_estimate(tmp_path):
    from taxmodel.testing.synthetic import synthetic_bundle

    case = synthetic_bundle(variant="bsp", workload="ag_gemm", shape={"M": 1024, "N": 256, "K": 512}, hardware="h100")
    b = case.bundle
    b.meta["hardware"] = {"name": "NVIDIA GeForce RTX 3060", "num_sms": 28, "compute_capability": "8.6", "vendor": "nvidia"}
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.report.terminal import render_ledger

    led = compute_ledger(b)
    assert led.hardware.source == "estimated"
    assert sum(c.startswith("hardware: NVIDIA GeForce RTX 3060 (estimated)") for c in led.caveats) == 1
    text = render_ledger(led)
    assert text.count("hardware: NVIDIA GeForce RTX 3060 (estimated);") == 1


def test_a_recorded_clock_scales_the_estimate_per_sm_and_clock():
    """Nsight Systems records the GPU's clock: an RTX 3070 (46 SMs at 1.725 GHz) scaled per SM and
    clock from the GA102 GeForce whitepaper figures gives its own FP32 rate, 46 x 128 x 2 x 1.725 GHz."""
    hw = {"name": "NVIDIA GeForce RTX 3070", "num_sms": 46, "compute_capability": "8.6", "clock_hz": 1.725e9}
    spec = resolve_hardware({"hardware": hw})
    assert spec.peak_flops["fp32"] == pytest.approx(46 * 128 * 2 * 1.725e9, rel=0.01)
    assert "at the trace's clock of 1.73 GHz" in spec.notes
    without = resolve_hardware({"hardware": {k: v for k, v in hw.items() if k != "clock_hz"}})
    assert "clock" not in without.notes.split("peaks", 1)[1].split(";")[0]
