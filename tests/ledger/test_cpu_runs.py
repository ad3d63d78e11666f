"""A CPU run (`taxmodel profile --device cpu`: Triton's interpreter on emulated GPUs) says first that
its times are the interpreter's, not a GPU's, and gives no GPU advice: no "calibrate this GPU", no
"X is 811 ms (24709%) slower than bsp" verdict."""
from __future__ import annotations

from taxmodel.ledger.compute import compute_ledger
from taxmodel.ledger.per_kernel import declared_floor_caveat
from taxmodel.report import headline
from taxmodel.testing.synthetic import synthetic_bundle
from taxmodel.trace.bundle import Bundle
from taxmodel.trace.capture_meta import CPU_RUN_CAVEAT, emulated_gpu



def _cpu(case, variant: str | None = None) -> Bundle:
    meta = dict(case.bundle.meta)
    meta["capture"] = {**(meta.get("capture") or {}), "emulated_gpu": True}
    if variant:
        meta["variant"] = variant
    return Bundle(events=case.bundle.events, meta=meta)


def test_a_cpu_runs_ledger_says_so_first_and_advises_no_gpu_work():
    case = synthetic_bundle(skew_ns=6000, useful_fraction=3.0)  # a declared floor the kernels "beat"
    gpu = compute_ledger(case.bundle, case.hardware)
    cpu = compute_ledger(_cpu(case), case.hardware)
    assert not emulated_gpu(case.bundle.meta) and emulated_gpu(_cpu(case).meta)
    assert CPU_RUN_CAVEAT not in gpu.caveats and any("calibrate this GPU" in c for c in gpu.caveats)
    assert cpu.caveats[0] == CPU_RUN_CAVEAT
    assert not any("calibrate" in c for c in cpu.caveats), cpu.caveats
    assert any("declared floor exceeds" in c for c in cpu.caveats)  # still said, without the GPU advice
    # the numbers themselves are the ledger's, CPU or not
    assert cpu.summary().equals(gpu.summary())


def test_a_cpu_comparison_states_the_difference_and_no_verdict():
    bsp = compute_ledger(_cpu(synthetic_bundle()), synthetic_bundle().hardware)
    slow = synthetic_bundle(variant="fused", flag_wait_ns=20_000, scale=3.0)  # slower: no verdict all the same
    fused = compute_ledger(_cpu(slow), slow.hardware)
    (sentence,) = headline.headlines([bsp, fused])
    assert "on CPU, in Triton's interpreter, fused took" in sentence and "more per iteration than bsp" in sentence
    assert "interpreter times, not GPU times" in sentence
    assert "slower" not in sentence and "%" not in sentence and "saves" not in sentence
    (alone,) = headline.headlines([bsp])
    assert "(on CPU: interpreter times, not GPU times)" in alone


def test_the_declared_floor_caveat_advises_calibration_only_for_a_gpu():
    assert "calibrate this GPU" in declared_floor_caveat(3, 2.0, [0, 1], None)
    assert "calibrate" not in declared_floor_caveat(3, 2.0, [0, 1], None, cpu_run=True)


def test_a_cpu_run_is_the_cpu_spec_on_any_number_of_cpus():
    """A CPU run records the host's CPUs as its emulated GPU's SM count: that count names no part,
    so the nominal CPU spec is the bundle's whatever it is (the set-up's `taxmodel analyze runs/ag_gemm`
    stopped with 'is no preset' on every machine with more than one CPU)."""
    from taxmodel.hardware.specs import resolve_hardware

    for cpus in (1, 2, 16):
        meta = {"hardware": {"name": "CPU (x86_64), emulated GPUs", "vendor": "cpu", "num_sms": cpus, "emulated": True}}
        assert resolve_hardware(meta).key == "cpu"
