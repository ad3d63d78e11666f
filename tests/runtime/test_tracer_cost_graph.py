"""benchmarks/tracer_cost_graph.py's bookkeeping on CPU: how a trace's kernels become steps, and
what is measured of them. The traces it reads need a GPU; here the kernels before the device gate
(the host barrier's) must be dropped, the warm-up step skipped, and a trace whose kernels do not
split into equal steps refused with the kernels named."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tracer_cost_graph  # noqa: E402


def _trace(steps: int, per_step: list[tuple[str, int]], gap_ns: int, between_ns: int) -> list[tuple[str, int, int]]:
    """A barrier kernel, the gate, then ``steps + 1`` steps of (name, duration ns) kernels."""
    rows = [("ncclDevKernel_AllReduce", 0, 500), (tracer_cost_graph.GATE_KERNEL, 600, 2000)]
    t = 3000
    for _ in range(steps + 1):
        for name, dur in per_step:
            rows.append((name, t, t + dur))
            t += dur + gap_ns
        t += between_ns - gap_ns
    return rows


def test_steps_come_after_the_gate_and_the_warm_up_step() -> None:
    rows = _trace(3, [("split", 9000), ("combine", 3000)], gap_ns=400, between_ns=6000)
    steps = tracer_cost_graph.split_steps(rows, 3)
    assert len(steps) == 3 and all([k[0] for k in s] == ["split", "combine"] for s in steps)
    assert steps[0][0][1] > rows[3][1]  # the first traced step is the second after the gate
    d = tracer_cost_graph.describe(steps)
    assert d["windows_us"] == pytest.approx([12.4] * 3)
    assert d["gaps_us"] == [pytest.approx([0.4])] * 3
    assert d["periods_us"] == pytest.approx([12.4 + 6.0] * 2)
    assert d["durations_us"][1] == pytest.approx([9.0, 3.0])


def test_a_trace_that_does_not_split_into_equal_steps_is_refused() -> None:
    rows = _trace(2, [("split", 9000)], gap_ns=0, between_ns=1000)[:-1]
    with pytest.raises(RuntimeError, match="do not split into 3 equal steps: split"):
        tracer_cost_graph.split_steps(rows, 2)
    with pytest.raises(RuntimeError, match="no device gate"):
        tracer_cost_graph.split_steps([("split", 0, 1)], 1)
