"""`taxmodel profile` end to end on CPU ranks (the launcher + gloo + Triton's interpreter)
with a toy workload registered by this test's module file."""
from __future__ import annotations

from pathlib import Path

import pytest

import taxmodel
from taxmodel.runtime.profile import ProfileRequest, bundle_path, profile

TOY = str(Path(__file__).with_name("toy_workload.py"))
pytestmark = pytest.mark.slow


def _request(tmp_path, **kw):
    base = dict(workload="toy", workload_modules=[TOY], device="cpu", iterations=3, warmup=1, out=str(tmp_path),
                timeout_s=240, progress=False)
    base.update(kw)
    return ProfileRequest(**base)


def test_one_rank(tmp_path):
    out = profile(_request(tmp_path, world_size=1, variants=["bsp"]), quiet=True)
    shape = {"N": 8, "fail_rank": -1, "hang_rank": -1, "wrong_rank": -1}
    assert out.bundles == [bundle_path(tmp_path, "toy", "bsp", shape)]
    b = taxmodel.load(out.bundles[0])
    k = b.events[b.events["kind"] == "kernel"]
    inside = k[k["iteration"] >= 0]
    assert sorted(inside["iteration"].unique()) == [0, 1, 2]
    assert inside[inside["stream"] == 0]["name"].tolist() == ["scale", "sum"] * 3
    assert set(inside[inside["stream"] == 0]["role"]) == {"compute"}
    assert inside[inside["stream"] == 1]["collective_op"].tolist() == ["allgather"] * 3
    m = b.meta
    assert (m["workload"], m["variant"], m["world_size"], m["ranks"]) == ("toy", "bsp", 1, [0])
    assert m["capture"]["emulated_gpu"] is True and m["capture"]["iterations"] == 3 and m["capture"]["inject"] is None
    assert m["cost"]["flops"] == 16 and m["cost"]["intermediates"][0]["name"] == "gathered"
    assert {"torch", "triton", "python", "taxmodel"} <= set(m["software"])
    assert m["clock_offsets_ns"] == {"0": 0}
    assert (out.bundles[0] / "raw" / "rank0.rep0.json.gz").exists()


def test_two_ranks_all_variants_with_injection(tmp_path):
    out = profile(_request(tmp_path, world_size=2, repeat=2,
                           inject=["sleep_rank=1:20000", "extra_launches=2", "extra_copy=1"]), quiet=True)
    assert out.skipped == {"never": "rank 0: needs hardware nobody has"}
    assert sorted(p.name.split("-")[0] for p in out.bundles) == ["bsp", "ring"]
    bsp = taxmodel.load(next(p for p in out.bundles if p.name.startswith("bsp")))
    ev = bsp.events
    assert bsp.meta["capture"]["inject"] == {"sleep_rank": 1, "sleep_us": 20000.0, "extra_launches": 2, "extra_copy": True}
    assert sorted(ev["rank"].unique()) == [0, 1] and sorted(ev["repetition"].unique()) == [0, 1]
    k = ev[(ev["kind"] == "kernel") & (ev["iteration"] >= 0)]
    per_iter = k.groupby(["repetition", "iteration", "rank"])
    assert len(per_iter) == 2 * 3 * 2
    sleep = k[k["name"] == "taxmodel_inject_sleep"]
    assert sorted(sleep["rank"].unique()) == [1] and len(sleep) == 6 and set(sleep["role"]) == {"other"}
    assert (sleep["end_ns"] - sleep["start_ns"]).min() >= 20_000_000
    # Two empty launches before each kernel but the first ("sum" follows "scale"): 2 per iteration.
    empties = k[k["name"] == "taxmodel_inject_empty"].groupby(["repetition", "iteration", "rank"]).size()
    assert set(empties.tolist()) == {2}
    copies = k[k["name"] == "taxmodel_inject_copy"]
    assert len(copies) == 12 and set(copies["role"]) == {"copy"}
    # Collectives match across ranks by id.
    coll = k[k["collective_op"] == "allgather"]
    assert (coll.groupby(["repetition", "collective_id"])["rank"].nunique() == 2).all()

    ring = taxmodel.load(next(p for p in out.bundles if p.name.startswith("ring")))
    assert ring.meta["fine_grained"] is True
    fused = ring.events[ring.events["name"] == "ring_push"]
    in_steps = fused[fused["iteration"] >= 0]
    assert set(fused["role"]) == {"fused"} and len(in_steps) == 2 * 2 * 3
    # one traced warm-up step per rank and repetition before ProfilerStep#0, in no iteration
    assert ring.meta["capture"]["traced_warmup"] == 1
    # the process's first traced repetition (the first variant's) is thrown away, once per process;
    # the counts above (6 sleeps, 12 copies: 2 repetitions x 3 steps) hold the kept ones only
    first_written = taxmodel.load(out.bundles[0])
    assert first_written.meta["capture"]["discarded_repetitions"] == 1
    assert [taxmodel.load(p).meta["capture"]["discarded_repetitions"] for p in out.bundles[1:]] == [0]
    warm = fused[fused["iteration"] < 0]
    assert len(warm) == 2 * 2 and (warm.groupby(["repetition", "rank"]).size() == 1).all()
    first = in_steps.groupby(["repetition", "rank"])["start_ns"].min()
    warm_end = warm.set_index(["repetition", "rank"])["end_ns"].sort_index()
    assert (warm_end <= first.reindex(warm_end.index)).all()  # before step 0


def test_align_device_gates_every_step_and_says_so_in_meta(tmp_path):
    """--align device on a variant that needs no heap of its own: the run makes one for the gate,
    every rank passes a gate before each traced step (a gate that gave up would fail the run), the
    steps' kernels are the same, and meta records how the steps were aligned."""
    out = profile(_request(tmp_path, world_size=2, variants=["bsp"], align="device", gate_hold_us=5.0), quiet=True)
    b = taxmodel.load(out.bundles[0])
    assert (b.meta["capture"]["align"], b.meta["capture"]["gate_hold_us"]) == ("device", 5.0)
    assert b.meta["capture"]["gate_signals"] == "parallel"  # the gate's adds to every rank at once
    k = b.events[(b.events["kind"] == "kernel") & (b.events["iteration"] >= 0)]
    assert k[k["stream"] == 0].groupby("rank")["name"].apply(list).tolist() == [["scale", "sum"] * 3] * 2
    from taxmodel.trace.capture_meta import alignment_meta, read_alignment

    assert alignment_meta("host", 5.0) == {"align": "host"}
    assert read_alignment({}) == ("host", None)  # bundles from before --align: a host barrier
    assert read_alignment(b.meta["capture"]) == ("device", pytest.approx(5e-6))


def test_align_back_to_back_gates_each_repetition_once_and_is_the_gpu_default(tmp_path):
    """--align back-to-back: one gate per repetition (holding for each of its steps, the traced warm-up
    included), then the steps without a barrier between them; the same kernels per step as a gated
    capture, the warm-up's in no step. auto (the default) is back-to-back on GPUs, host on CPU."""
    from taxmodel.trace.capture_meta import default_alignment, gate_hold_for

    out = profile(_request(tmp_path, world_size=2, variants=["bsp", "ring"], align="back-to-back", gate_hold_us=5.0),
                  quiet=True)
    for path in out.bundles:
        b = taxmodel.load(path)
        cap = b.meta["capture"]
        assert (cap["align"], cap["gate_hold_us"], cap["gate_signals"]) == ("back-to-back", 20.0, "parallel")
        k = b.events[b.events["kind"] == "kernel"]
        steps = k[k["iteration"] >= 0]
        assert sorted(steps["iteration"].unique()) == [0, 1, 2]
        assert steps.groupby("rank").size().nunique() == 1 and len(k[k["iteration"] < 0]) > 0
    assert gate_hold_for("back-to-back", 5.0, 4) == 20.0 and gate_hold_for("device", 5.0, 4) == 5.0
    assert gate_hold_for("host", 5.0, 4) == 0.0
    assert (default_alignment("cuda"), default_alignment("cpu")) == ("back-to-back", "host")
    host = profile(_request(tmp_path / "auto", world_size=1, variants=["bsp"]), quiet=True)
    assert taxmodel.load(host.bundles[0]).meta["capture"]["align"] == "host"  # auto on CPU


@pytest.mark.parametrize("kw,match", [({"align": "sideways"}, "--align"), ({"gate_hold_us": -1.0}, "--gate-hold-us")])
def test_bad_alignment_options_are_refused_before_any_rank_starts(tmp_path, kw, match):
    from taxmodel.errors import InputError

    with pytest.raises(InputError, match=match):
        profile(_request(tmp_path, world_size=2, **kw), quiet=True)


def test_a_rerun_replaces_an_earlier_bundle_only_with_force(tmp_path):
    """A second capture at the same paths is refused before any rank starts (the earlier bundle untouched);
    with --force it replaces it and says so; a path holding the user's own files is refused even then."""
    from click.testing import CliRunner

    from taxmodel.cli import cli

    args = ["profile", "toy", "--workload-module", TOY, "--device", "cpu", "-n", "1", "--variants", "bsp",
            "--iterations", "2", "--warmup", "1", "-o", str(tmp_path)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    bundle = bundle_path(tmp_path, "toy", "bsp", {"N": 8, "fail_rank": -1, "hang_rank": -1, "wrong_rank": -1})
    created = (bundle / "meta.json").read_text()

    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 2 and "--force" in again.output and "Traceback" not in again.output
    assert (bundle / "meta.json").read_text() == created

    forced = CliRunner().invoke(cli, args + ["--force"])
    assert forced.exit_code == 0, forced.output
    assert f"{bundle} (replaced the earlier bundle there: --force)" in forced.output
    assert (bundle / "meta.json").read_text() != created  # a new capture (its own date and times)

    (bundle / "notes.txt").write_text("mine")
    mixed = CliRunner().invoke(cli, args + ["--force"])
    assert mixed.exit_code == 2 and "notes.txt" in mixed.output
    assert (bundle / "notes.txt").read_text() == "mine"


def test_the_terminal_gets_each_thing_once_and_no_library_lines(tmp_path):
    """Run as a user runs it: a variant skipped is said once (not once per rank), each bundle
    written is named once, and what the ranks' libraries print on stderr (Kineto's USDT
    profiler_start lines) is in the run's log, which the last line names."""
    import os
    import re
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "taxmodel", "profile", "toy", "--workload-module", TOY, "--device", "cpu", "-n", "2",
           "--iterations", "2", "--warmup", "1", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert said.count("skipped toy/never: rank 0: needs hardware nobody has") == 1, said
    bundles = sorted(p for p in (out / "toy").iterdir())
    assert [p.name.split("-")[0] for p in bundles] == ["bsp", "ring"]
    assert proc.stdout.splitlines()[1:] == [f"wrote {p}" for p in bundles] and all(said.count(str(p)) == 1 for p in bundles)
    assert "USDT" not in said and "profiler_start" not in said
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("2 bundle(s), 2 rank(s) on cpu"), proc.stderr
    log = Path(re.search(r"is in (\S+)$", last).group(1))
    assert log.parent == tmp and "== rank 0 output ==" in log.read_text()
