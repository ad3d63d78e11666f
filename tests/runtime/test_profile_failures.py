"""A rank that raises, hangs or computes wrong results ends the run with one RunError naming it,
within a bounded time, and never touches an existing bundle."""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest

from processes import PAST_TIMEOUT_S

from taxmodel.errors import RunError
from taxmodel.runtime.diagnose import RankExit, diagnose
from taxmodel.runtime.profile import ProfileRequest, bundle_path, profile

TOY = str(Path(__file__).with_name("toy_workload.py"))


def _request(tmp_path, **shape):
    return ProfileRequest(workload="toy", workload_modules=[TOY], device="cpu", world_size=2, iterations=2, warmup=1,
                          out=str(tmp_path), timeout_s=120, variants=["bsp"], progress=False, shape=shape)


@pytest.mark.slow
def test_crashing_rank_is_named_and_old_bundle_kept(tmp_path):
    shape = {"N": 8, "fail_rank": 1, "hang_rank": -1, "wrong_rank": -1}
    old = bundle_path(tmp_path, "toy", "bsp", shape)
    old.mkdir(parents=True)
    (old / "meta.json").write_text("{\"old\": true}")
    with pytest.raises(RunError, match=r"rank 1 failed in phase 'compile' of variant 'bsp': ValueError: toy failure on rank 1") as err:
        profile(dataclasses.replace(_request(tmp_path, fail_rank=1), force=True), quiet=True)
    # The rank's traceback is kept in a file the message names (the run directory is gone).
    log = Path(re.search(r"the tracebacks of rank\(s\) [\d, ]+ are in (\S+)$", str(err.value)).group(1))
    try:
        assert "== rank 1 ==" in log.read_text() and "ValueError: toy failure on rank 1" in log.read_text()
    finally:
        log.unlink()
    assert (old / "meta.json").read_text() == "{\"old\": true}"
    assert sorted(p.name for p in old.iterdir()) == ["meta.json"]


@pytest.mark.slow
def test_hanging_rank_times_out(tmp_path):
    req = _request(tmp_path, hang_rank=1)
    req.timeout_s = 20  # the whole run, start-up included (slow on a loaded 2-core CI machine)
    t0 = time.monotonic()
    expected = (r"timed out after 20 s: rank 1 hung in phase 'compile' of variant 'bsp' "
                r"at toy_workload.py:\d+ \(_maybe_misbehave\) \(rank\(s\) 0 were waiting")
    with pytest.raises(RunError, match=expected):
        profile(req, quiet=True)
    assert time.monotonic() - t0 - 20 < PAST_TIMEOUT_S  # the watchdogs record where the ranks were, then every rank is killed


def test_diagnose_messages():
    st = {0: {"phase": "capture", "variant": "v", "waiting": True, "time": 2.0},
          1: {"phase": "capture", "variant": "v", "waiting": False, "time": 1.0}}
    assert diagnose(st, 2, timed_out=True, timeout_s=5) .startswith(
        "run timed out after 5 s: rank 1 hung in phase 'capture' of variant 'v' (rank(s) 0 were waiting for it)")
    st_err = {0: {"phase": "check", "error": "later", "time": 3.0}, 1: {"phase": "check", "error": "first", "time": 1.0}}
    assert diagnose(st_err, 2, timed_out=False) == "rank 1 failed in phase 'check': first (rank(s) 0 failed after it)"
    assert diagnose({0: {"phase": "done"}}, 2, timed_out=False).startswith("rank(s) 1 never reported")


def test_diagnose_blames_the_rank_that_died_silently_not_the_peer_that_saw_it_go():
    """Rank 1 is SIGKILLed; rank 0 reports "Connection reset by peer" a moment later, before the
    launcher's next poll sees rank 1 gone: rank 1, its signal and its phase are named."""
    st = {0: {"phase": "compile", "variant": "v", "error": "RuntimeError: Connection reset by peer", "time": 100.02},
          1: {"phase": "compile", "variant": "v", "time": 99.0}}
    exits = {0: RankExit(0, code=3, seen_at=100.1), 1: RankExit(1, signal=9, seen_at=100.1)}
    assert diagnose(st, 2, timed_out=False, exits=exits) == (
        "rank 1 was killed by SIGKILL in phase 'compile' of variant 'v' without an error message (out of memory? "
        "killed by hand or by the batch system?) (rank(s) 0 failed after it)")
    # A rank that failed on its own well before a peer vanished is the cause.
    exits = {0: RankExit(0, code=3, seen_at=100.1), 1: RankExit(1, signal=9, seen_at=104.0)}
    assert diagnose(st, 2, timed_out=False, exits=exits).startswith("rank 0 failed in phase 'compile'")
    # A rank gone before it ever reported.
    assert diagnose({0: st[0]}, 2, timed_out=False, exits={1: RankExit(1, code=1, seen_at=99.0)}).startswith(
        "rank 1 exited with code 1 before it reported (at start-up)")


def test_shape_overrides_accept_a_workloads_options_and_name_the_rest():
    """``--shape`` takes the preset's keys and the workload's declared option keys (structure and
    tuning switches); anything else is refused with both lists, before any rank starts."""
    from taxmodel.errors import InputError
    from taxmodel.runtime.profile import build_spec

    def req(**shape):
        return ProfileRequest(workload="flash_decode", device="cpu", world_size=2, variants=["fused"],
                              progress=False, shape=shape)

    spec, _, _ = build_spec(req(fused_slices=2, bsp_slices=2))
    assert spec["shape"] == {"fused_slices": 2, "bsp_slices": 2}
    with pytest.raises(InputError, match=r"unknown shape key\(s\) bogus; the shape has batch.*options: .*fused_slices"):
        build_spec(req(bogus=1))
