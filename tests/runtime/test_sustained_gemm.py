"""benchmarks/sustained_gemm.py's bookkeeping on CPU: the windows of elapsed time and what a run writes.

The clocks it is about need a GPU; here the summary must put each call in the window its start falls
in and compare each window with the first, and a bad shape must be refused with a message."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sustained_gemm  # noqa: E402


def test_calls_are_summarized_by_the_window_their_start_falls_in() -> None:
    # 1 ms calls for 2 ms, then slower 1.25 ms calls: the later windows show the slowdown
    times = [1.0, 1.0] + [1.25] * 40
    starts, acc = [], 0.0
    for t in times:
        starts.append(acc)
        acc += t
    rows = sustained_gemm.summarize(times, starts)
    assert rows[0]["window_ms"] == [0, 2] and rows[0]["calls"] == 2 and rows[0]["median_ms"] == 1.0
    assert rows[1]["window_ms"] == [2, 10] and rows[1]["median_ms"] == 1.25
    assert rows[1]["vs_first"] == pytest.approx(1.25)
    assert sum(r["calls"] for r in rows) == len(times)


def test_a_cpu_run_writes_every_call_and_refuses_bad_shapes(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert sustained_gemm.main(["--cpu", "--shapes", "32x16x8", "--seconds", "0.05", "--pause", "0",
                                "--max-calls", "50", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    shape = got["shapes"][0]
    assert (shape["M"], shape["N"], shape["K"]) == (32, 16, 8)
    assert 0 < shape["calls"] == len(shape["times_ms"]) <= 50
    with pytest.raises(SystemExit, match="not MxNxK"):
        sustained_gemm.main(["--cpu", "--shapes", "8192x8192"])
