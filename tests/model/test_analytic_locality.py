"""The analytic model's locality (issue 24): DRAM bytes per kernel (a tiled GEMM's operand re-reads,
an intermediate that the L2 keeps), checked against the committed hardware counters, and the
locality tax the ledger's own code predicts from them, capped as a measured one is."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from taxmodel.errors import InputError
from taxmodel.model.analytic import predict, resolve_model_hardware
from taxmodel.model.analytic.costs import gemm_dram_bytes, l2_bytes, l2_kept_fraction
from taxmodel.hardware.specs import HardwareSpec, find_preset
from taxmodel.trace.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[2]
COUNTERS = ROOT / "benchmarks" / "results" / "h200x1-counters"
CHAIN = ROOT / "profiles" / "h200x1-locality" / "locality_chain"
MIB = 1 << 20


def _counted(path: Path, name: str) -> tuple[float, float]:
    """Mean (read, written) DRAM bytes per step of the kernels called ``name`` in a committed bundle."""
    ev = load_bundle(path).events
    k = ev[(ev["kind"] == "kernel") & (ev["iteration"] >= 0) & (ev["name"] == name) & (ev["dram_read_bytes"] >= 0)]
    assert len(k), f"{path.name}: no counted {name}"
    return float(k["dram_read_bytes"].mean()), float(k["dram_write_bytes"].mean())


@pytest.mark.parametrize("m", [1024, 8192])
def test_the_wave_model_gives_the_triton_gemms_counted_reads(m):
    """The persistent Triton GEMM (128x256 tiles, GROUP_M 8, 132 programs: the bundles' config label)
    read what the counters counted: A once per wave touching its rows, B once per wave touching its
    columns. Nothing is fitted; the one-GPU pull bundles at M=1024 and 8192 are the test."""
    if not COUNTERS.exists():
        pytest.skip("no counter bundles committed")
    path = COUNTERS / "ag_gemm" / f"pull-M{m}xN8192xK8192xtp0"
    assert "128x256x64-s3-w8-g8" in load_bundle(path).meta["workload_config"]["label"]
    read, written = _counted(path, "ag_gemm_kernel")
    a, b, c = gemm_dram_bytes(m, 8192, 8192, 2, (128, 256), 132, 60 * MIB)
    assert a + b == pytest.approx(read, rel=0.005)
    assert a + b > 1.1 * (m + 8192) * 8192 * 2  # well above reading each operand once
    assert c == m * 8192 * 2 and written <= c * 1.01


def test_operands_that_fit_the_l2_are_read_once():
    a, b, c = gemm_dram_bytes(1024, 1024, 1024, 2, (128, 256), 132, 60 * MIB)
    assert (a, b, c) == (1024 * 1024 * 2,) * 3
    # the same GEMM without a known L2: the waves' re-reads
    a0, b0, _ = gemm_dram_bytes(1024, 1024, 1024, 2, (128, 256), 132, 0)
    assert a0 + b0 >= a + b


def test_l2_kept_fraction():
    l2 = 60 * MIB
    assert l2_kept_fraction(8 * MIB, 16 * MIB, 16 * MIB, l2) == 1.0  # both kernels' traffic fits
    assert l2_kept_fraction(1024 * MIB, 2048 * MIB, 2048 * MIB, l2) == 0.0  # larger than the L2
    assert l2_kept_fraction(32 * MIB, 170 * MIB, 64 * MIB, l2) == 0.0  # beside a GEMM streaming 170 MiB
    assert l2_kept_fraction(8 * MIB, 16 * MIB, 16 * MIB, 0) == 0.0  # unknown L2: every byte round-trips
    # in between: the share of the intermediate whose bytes in between fit
    assert l2_kept_fraction(10 * MIB, 20 * MIB, 100 * MIB, l2) == pytest.approx((60 - 20) / (100 - 20))
    assert l2_kept_fraction(10 * MIB, 100 * MIB, 20 * MIB, l2) == pytest.approx((60 - 20) / (100 - 20))


@pytest.mark.parametrize("n, kept", [(2097152, 1.0), (268435456, 0.0)])
def test_the_chains_counters_agree_with_the_l2_term(n, kept):
    """The committed locality chain (y = 1.5x - 0.25 into relu, fp32): 8 MiB of y stays in the
    L2 (the unfused chain moved no more than the fused one's compulsory bytes), 1 GiB goes to DRAM
    and back. The L2 term says the same from the sizes alone."""
    if not CHAIN.exists():
        pytest.skip("no locality chain committed")
    y = 4 * n
    traffic = 2 * y  # each kernel streams one vector in and one out
    assert l2_kept_fraction(y, traffic, traffic, 60 * MIB) == kept
    counted = sum(sum(_counted(CHAIN / f"unfused-N{n}", k)) for k in ("axpb_kernel", "relu_kernel"))
    compulsory = 2 * y  # x read, z written
    round_trip = 2 * y * (1 - kept)
    assert counted - compulsory == pytest.approx(round_trip, abs=0.05 * compulsory)


def test_a_calibrated_file_takes_the_l2_of_its_datasheet_preset():
    cal, _ = resolve_model_hardware("h200-calibrated")
    assert cal.source == "calibrated" and cal.l2_bytes == 0  # calibrate does not measure it
    assert l2_bytes(cal) == 60 * MIB == find_preset("H200 SXM").l2_bytes
    assert l2_bytes(find_preset("H100 SXM")) == 50 * MIB
    assert l2_bytes(find_preset("MI300X")) == 0  # left out: which AMD cache level plays the part is not measured
    stranger = dataclasses.replace(cal, name="Some GPU", aliases=())
    assert l2_bytes(stranger) == 0


def test_a_hardware_file_with_a_wrong_l2_is_refused():
    d = find_preset("H200 SXM").to_dict()
    assert d["l2_bytes"] == 60 * MIB and HardwareSpec.from_dict(d).l2_bytes == 60 * MIB
    with pytest.raises(InputError, match="l2_bytes"):
        HardwareSpec.from_dict({**d, "l2_bytes": "60 MiB"})


def _locality_us(pred) -> float:
    return pred.taxes_ns()["locality_tax"] / 1e3


def test_an_intermediate_the_l2_keeps_is_predicted_to_cost_nothing():
    """Flash decode's split partials (1.4 MB at batch 1, KV 16K) fit the L2: predicted 0, where the
    same GPU without a known L2 predicts their round trip."""
    cal, _ = resolve_model_hardware("h200-calibrated")
    shape = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 16384}
    with_l2 = predict("flash_decode", "fused", shape, 1, cal)
    no_l2 = predict("flash_decode", "fused", shape, 1, dataclasses.replace(cal, name="no L2", aliases=()))
    assert with_l2.ledger.locality == "predicted"
    assert _locality_us(with_l2) == pytest.approx(0.0, abs=0.01)
    from taxmodel.kernels.flash_decode.split_kv import plan_splits
    from taxmodel.kernels.flash_decode.workload import split_config

    splits = plan_splits(1, 4, 16384, 132, split_config(shape, "cuda")).num_splits  # as the model plans them
    partials = 32 * splits * 129 * 4  # fp32 partials: q heads x splits x (D + 1)
    assert partials > MIB  # written and read back once: 2 x bytes at HBM bandwidth
    assert _locality_us(no_l2) == pytest.approx(2 * partials / cal.hbm_bytes_per_s * 1e6, rel=0.05)


def test_a_compute_bound_gemms_re_reads_hide_under_its_compute():
    """The vendor GEMM of AG+GEMM bsp at 8192^3 re-reads about a GB beyond its compulsory bytes (over
    200 us at HBM bandwidth), but all its traffic takes less time than its compute floor: the
    ledger's definition charges none of it (docs/ledger.md 5b), as for the committed bundle's
    counters (1.38 GB in a 1.40 ms kernel: 0 measured)."""
    cal, _ = resolve_model_hardware("h200-calibrated")
    shape = {"M": 8192, "N": 8192, "K": 8192, "tp": 0}
    p = predict("ag_gemm", "bsp", shape, 1, cal)
    a, b, c = gemm_dram_bytes(8192, 8192, 8192, 2, p.params.vendor_tile, 132, 60 * MIB)
    assert (a + b + c - 3 * 8192 * 8192 * 2) / cal.hbm_bytes_per_s > 200e-6
    assert (a + b + c) / cal.hbm_bytes_per_s < 2 * 8192**3 / cal.peak_flops["bf16"]
    assert _locality_us(p) == 0.0
    if COUNTERS.exists():
        from taxmodel.ledger.compute import compute_ledger

        led = compute_ledger(load_bundle(COUNTERS / "ag_gemm" / "bsp-M8192xN8192xK8192xtp0"))
        assert led.locality == "measured" and led.parts.loc[led.parts["subcategory"] == "locality_tax", "ns"].sum() == 0
