"""Fixtures for the report tests: (bundle, ledger) pairs.

Real pairs come from ``taxmodel.testing.synthetic`` + ``taxmodel.ledger.compute_ledger``;
``fake_ledger.fake_case`` (the ``Ledger`` frames, numbers chosen by hand) is kept for what the
synthetic generator does not produce (several CTA phases, clock offsets on every rank).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_ledger import fake_case  # noqa: E402


def real_ledger_available() -> bool:
    try:
        import taxmodel.ledger.compute  # noqa: F401
    except ImportError:
        return False
    return True


def synthetic_case(variant: str = "bsp", *, shape: dict | None = None, **kw):
    """(bundle, ledger) from the synthetic generator and the real ledger."""
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.testing.synthetic import synthetic_bundle

    case = synthetic_bundle(variant=variant, workload="ag_gemm", shape=shape or {"M": 1024, "N": 256, "K": 512}, **kw)
    return case.bundle, compute_ledger(case.bundle, case.hardware)


@pytest.fixture(scope="session")
def fake_cases():
    """bsp and fg_pull at two sizes (fake ledger)."""
    return [fake_case(v, m=m, seed=m) for v in ("bsp", "fg_pull") for m in (1024, 4096)]


@pytest.fixture(scope="session")
def real_cases():
    """bsp and fused at two sizes, with injected skew, launch and flag-wait taxes (real ledger)."""
    if not real_ledger_available():
        pytest.skip("taxmodel.ledger.compute is not written yet (the ledger helper is on it)")
    out = []
    for scale, m in ((1.0, 1024), (2.0, 4096)):
        shape = {"M": m, "N": 256, "K": 512}
        out.append(synthetic_case("bsp", shape=shape, scale=scale, skew_ns=4000, kernel_gap_ns=500, extra_launches=2,
                                  intermediate_bytes=1 << 24, seed=m))
        out.append(synthetic_case("fused", shape=shape, scale=scale, skew_ns=4000, flag_wait_ns=3000, seed=m))
    return out
