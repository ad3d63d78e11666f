"""Hardware counters from Nsight Compute: the reader, the matching to a bundle's kernels, and the
``import --counters`` / ``profile --counters`` doors (issue 24 items 1, 2)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.trace.bundle import load_bundle, write_bundle
from taxmodel.trace.counter_match import attach_counters, function_name
from taxmodel.trace.ncu import METRICS_ARG, read_counters

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "ncu"
TRAIN = ROOT / "profiles" / "h200x1-train"


# --- the reader on real exports -------------------------------------------------------------------

def test_reads_a_real_export_with_preamble_base_units_and_thousands_separators():
    c = read_counters(DATA / "locality_ncu.csv")
    assert list(c["name"]) == ["axpb_kernel", "relu_kernel", "fused_kernel"] * 2
    first = c.iloc[0]  # the CSV says "3,086,336" byte, "256" byte, "4,960" ns, "84.06" %
    assert (first["dram_read_bytes"], first["dram_write_bytes"], first["duration_ns"]) == (3086336, 256, 4960)
    assert first["l2_hit_pct"] == pytest.approx(84.06)
    assert (first["device"], first["stream"], first["process_id"], first["grid"], first["block"]) == (0, 7, 554, "(512, 1, 1)", "(256, 1, 1)")
    big = c.iloc[3:]  # 1 GiB: every kernel streams about 1 GB each way
    assert (big["dram_read_bytes"] > 1.0e9).all() and (big["dram_write_bytes"] > 1.0e9).all()


def test_skips_the_programs_own_output_between_ncu_lines():
    c = read_counters(DATA / "train_step_first12.csv")
    assert len(c) == 12 and list(c["kernel_id"]) == list(range(12))
    assert c["name"].iloc[0].startswith("void at::vectorized_gather_kernel<16, long>")
    assert (c["dram_read_bytes"] >= 0).all() and c["duration_ns"].gt(0).all()


def test_range_replay_rows_read_as_one_row_per_range():
    c = read_counters(DATA / "locality_ncu_range.csv")
    assert list(c["name"]) == ["range"] * 4 and (c["stream"] == -1).all()  # ncu writes stream "n/a"
    assert c["dram_read_bytes"].iloc[2] > 2 * c["dram_read_bytes"].iloc[3] * 0.99  # unfused 1 GiB chain reads y again


def _rewrite(text: str, fn) -> str:
    out = []
    for line in text.splitlines():
        m = re.match(r'^(".*","(dram__bytes_(?:read|write)\.sum|gpu__time_duration\.sum)",)"([^"]*)","([^"]*)"$', line)
        out.append(fn(m) if m else line)
    return "\n".join(out) + "\n"


def test_scaled_units_are_converted_back(tmp_path):
    text = (DATA / "locality_ncu.csv").read_text()

    def scale(m):
        v = float(m.group(4).replace(",", ""))
        if m.group(2).startswith("dram"):
            return f'{m.group(1)}"Mbyte","{v / 1e6:.6f}"'
        return f'{m.group(1)}"usecond","{v / 1e3:.3f}"'
    f = tmp_path / "scaled.csv"
    f.write_text(_rewrite(text, scale))
    base, scaled = read_counters(DATA / "locality_ncu.csv"), read_counters(f)
    for col in ("dram_read_bytes", "dram_write_bytes", "duration_ns"):
        assert np.allclose(scaled[col], base[col], rtol=1e-6, atol=1), col


def test_raw_page_with_a_units_row(tmp_path):
    f = tmp_path / "raw.csv"
    f.write_text('"ID","Process ID","Kernel Name","Device","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"\n'
                 '"","","","","Kbyte","Kbyte","usecond"\n'
                 '"0","7","k1","0","1.5","2,000","3.25"\n'
                 '"1","7","k2","0","n/a","4","1"\n')
    c = read_counters(f)
    assert list(c["dram_read_bytes"]) == [1500, -1] and list(c["dram_write_bytes"]) == [2_000_000, 4000]
    assert list(c["duration_ns"]) == [3250, 1000] and c["l2_hit_pct"].isna().all()


@pytest.mark.parametrize("body, match", [
    ("just some program output\n", "no ncu CSV table"),
    ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","sm__cycles.sum","cycle","5"\n', "no DRAM byte counters"),
    ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","dram__bytes_read.sum","furlong","5"\n', "unknown metric unit"),
    ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","dram__bytes_read.sum","byte","lots"\n', "not a number"),
])
def test_bad_exports_are_refused_in_one_line(tmp_path, body, match):
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(InputError, match=match):
        read_counters(f)


def test_a_report_file_without_ncu_report_says_how_to_export(tmp_path):
    f = tmp_path / "x.ncu-rep"
    f.write_bytes(b"\0binary")
    with pytest.raises(InputError, match="ncu --import x.ncu-rep --csv"):
        read_counters(f)


# --- names: ncu's spelling against the tracers' --------------------------------------------------

@pytest.mark.parametrize("kineto, ncu", [  # the same kernels as Kineto and ncu named them on the H200
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
     "void at::<unnamed>::cunn_SoftMaxForward<4, float, float, float, at::<unnamed>::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*, void*, unsigned int)",
     "void cudnn::compute_dot_do_o_specialized<1, 64>(const void *, const void *, void *, void *, unsigned int)"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>, std::array<char *, 1>>(int, T2, T3)"),
    ("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT"),
    ("axpb_kernel", "axpb_kernel"),
])
def test_function_names_agree_across_the_two_spellings(kineto, ncu):
    assert function_name(kineto) == function_name(ncu)


def test_different_kernels_keep_different_function_names():
    names = ["void at::native::vectorized_elementwise_kernel<4, X>(int)", "void at::native::unrolled_elementwise_kernel<X>(int)",
             "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_bias_TNT", "axpb_kernel"]
    assert len({function_name(n) for n in names}) == len(names)


# --- matching ---------------------------------------------------------------------------------------

KINETO = ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
          "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", "axpb_kernel"]
NCU = ["void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>, std::array<char *, 1>>(int, T2, T3)",
       "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", "axpb_kernel"]


def _events(steps: int = 3, warm: bool = True, names=KINETO) -> pd.DataFrame:
    rows, t = [], 1000
    plan = ([-1] if warm else []) + list(range(steps))
    for it in plan:
        for n in names:
            rows.append(dict(rank=0, device=0, stream=7, kind="kernel", role="compute", name=n, start_ns=t, end_ns=t + 400, repetition=0,
                             iteration=it, grid="512,1,1", block="256,1,1"))
            rows.append(dict(rank=0, device=-1, stream=1, kind="launch", role="other", name="cudaLaunchKernel",
                             start_ns=t - 300, end_ns=t - 100, iteration=it, repetition=0))
            t += 1000
    return pd.DataFrame(rows)


def _counters(n_steps: int = 1, names=NCU, grid="(512, 1, 1)") -> pd.DataFrame:
    k = len(names) * n_steps
    return pd.DataFrame({"process_id": 9, "device": 0, "stream": 7, "kernel_id": np.arange(k), "name": list(names) * n_steps,
                         "grid": grid, "block": "(256, 1, 1)", "dram_read_bytes": 1000 + np.arange(k), "dram_write_bytes": 50,
                         "l2_hit_pct": 42.5, "duration_ns": 400})


def test_one_step_of_counters_stands_for_every_step():
    ev = _events()
    out, rep = attach_counters(ev, _counters())
    k = out[out["kind"] == "kernel"]
    assert rep.mode == "per_step" and rep.kernels == 9
    assert list(k[k["iteration"] == 2]["dram_read_bytes"]) == [1000, 1001, 1002]
    assert (k[k["iteration"] == -1]["dram_read_bytes"] == -1).all()  # warm-up kernels stay unmeasured
    assert (k[k["iteration"] >= 0]["l2_hit_pct_x100"] == 4250).all()
    assert (out[out["kind"] == "launch"]["dram_read_bytes"] == -1).all()


def test_counters_of_every_kernel_or_of_every_step_match_one_to_one():
    ev = _events()
    out, rep = attach_counters(ev, _counters(4))
    assert rep.mode == "all" and list(out[out["kind"] == "kernel"]["dram_read_bytes"]) == list(range(1000, 1012))
    out, rep = attach_counters(ev, _counters(3))
    k = out[out["kind"] == "kernel"]
    assert rep.mode == "steps" and list(k[k["iteration"] >= 0]["dram_read_bytes"]) == list(range(1000, 1009))


def test_counters_of_another_program_are_refused_naming_the_first_mismatch():
    ev = _events()
    swapped = [NCU[0], NCU[2], NCU[1]]
    with pytest.raises(InputError, match=r"rank 0 device 0: kernel of step 0 \(repetition 0\) 1 differs: bundle 'nvjet.*"
                                         r"vs counters 'axpb_kernel' \(function name\)"):
        attach_counters(ev, _counters(names=swapped))
    with pytest.raises(InputError, match=r"\(grid dims\)"):
        attach_counters(ev, _counters(grid="(1024, 1, 1)"))
    with pytest.raises(InputError, match=r"2 kernels in the counters, the bundle has 12 \(9 inside steps, 3 per step\)"):
        attach_counters(ev, _counters(names=NCU[:2]))


def test_steps_that_differ_from_each_other_are_refused():
    ev = _events()
    ev.loc[(ev["kind"] == "kernel") & (ev["iteration"] == 1) & (ev["name"] == "axpb_kernel"), "name"] = "other_kernel"
    with pytest.raises(InputError, match="step 1 .* differs"):
        attach_counters(ev, _counters())


def test_ranks_pair_with_devices_and_unpairable_groups_are_refused():
    a, b = _events(), _events()
    b["rank"], b["device"] = 1, np.where(b["kind"] == "kernel", 1, -1)
    ev = pd.concat([a, b], ignore_index=True)
    c0 = _counters()
    c1 = _counters().assign(device=1, process_id=10, dram_read_bytes=lambda d: d["dram_read_bytes"] + 5000)
    out, rep = attach_counters(ev, pd.concat([c0, c1], ignore_index=True))
    k = out[(out["kind"] == "kernel") & (out["iteration"] == 0)]
    assert list(k[k["rank"] == 1]["dram_read_bytes"]) == [6000, 6001, 6002] and rep.groups == 2
    with pytest.raises(InputError, match="cannot pair"):
        attach_counters(ev, pd.concat([c0, c0.assign(process_id=10)], ignore_index=True))


# --- the doors -----------------------------------------------------------------------------------------

def test_import_with_counters_end_to_end_on_the_real_training_step(tmp_path):
    out = tmp_path / "b1"
    r = CliRunner().invoke(cli, ["import", str(TRAIN / "trace_eager_b1.json.gz"), "--counters",
                                 str(TRAIN / "ncu_eager_b1.csv.gz"), "-o", str(out), "--no-keep-raw"])
    assert r.exit_code == 0, r.output
    b = load_bundle(out)
    k = b.events[b.events["kind"] == "kernel"]
    assert b.meta["counters"]["match"] == "per_step" and b.meta["counters"]["counter_rows"] == 570
    assert (k["dram_read_bytes"] >= 0).all() and len(k) == 4 * 570
    per_step = k.groupby("iteration")["dram_read_bytes"].sum()
    assert per_step.nunique() == 1 and 6.0e9 < per_step.iloc[0] < 8.0e9  # the same counted step, 6.9 GB read


def test_import_refuses_counters_of_another_run_and_writes_nothing(tmp_path):
    out = tmp_path / "b8"
    r = CliRunner().invoke(cli, ["import", str(TRAIN / "trace_eager_b8.json.gz"), "--counters",
                                 str(TRAIN / "ncu_eager_b1.csv.gz"), "-o", str(out)])
    assert r.exit_code == 2 and r.output.count("\n") <= 2, r.output
    assert "570 kernels in the counters, the bundle has 2352" in r.output and "first difference is kernel 0" in r.output
    assert not out.exists()


def test_profile_counters_is_refused_on_cpu_and_on_several_ranks():
    from taxmodel.runtime.counters import check_request

    r = CliRunner().invoke(cli, ["profile", "ag_gemm", "--device", "cpu", "--counters"])
    assert r.exit_code == 2 and "--counters" in r.output and "--device cuda" in r.output and r.output.count("\n") == 1
    with pytest.raises(InputError, match="use -n 1"):
        check_request("cuda", 4)


def test_counters_pass_attaches_to_every_bundle_or_to_none(tmp_path, monkeypatch):
    from taxmodel.runtime.counters import attach_to_bundles

    one, two = tmp_path / "one", tmp_path / "two"
    write_bundle(one, _events(), {"source": "synthetic", "world_size": 1})
    write_bundle(two, _events(names=KINETO[:2]), {"source": "synthetic", "world_size": 1})
    csv = tmp_path / "c.csv"
    head = '"ID","Process ID","Kernel Name","Block Size","Grid Size","Device","Metric Name","Metric Unit","Metric Value"\n'

    def rows(names):
        return "".join(f'"{i}","9","{n}","(256, 1, 1)","(512, 1, 1)","0","{m}","byte","{100 + i}"\n'
                       for i, n in enumerate(names) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
    csv.write_text("==PROF== x\n" + head + rows(NCU + [NCU[2], NCU[1]]))  # the second bundle's step is wrong
    with pytest.raises(InputError, match=r"two: rank 0 device 0: kernel of step 0 \(repetition 0\) 0 differs"):
        attach_to_bundles(csv, [one, two])
    assert (load_bundle(one).events["dram_read_bytes"] == -1).all()  # nothing attached anywhere
    csv.write_text(head + rows(NCU + NCU[:2]))
    assert attach_to_bundles(csv, [one, two], pass_s=1.0) == 9 + 6
    assert load_bundle(two).meta["counters"]["match"] == "per_step"
    csv.write_text(head + rows(NCU + NCU[:2] + NCU[:1]))
    with pytest.raises(InputError, match="1 kernels more"):
        attach_to_bundles(csv, [one, two])


def test_the_metrics_argument_names_what_the_reader_needs():
    assert METRICS_ARG.split(",")[:2] == ["dram__bytes_read.sum", "dram__bytes_write.sum"]


def test_ncus_own_scaled_units_round_the_exact_report_values():
    """The same report exported with ncu's default units (Mbyte/Kbyte, 3 significant digits) and read
    exactly by ncu_report on the H200: the units are decimal (Kbyte = 1000 bytes) and only rounded."""
    import json

    exact = json.loads((DATA / "locality_ncu_report_exact.json").read_text())
    c = read_counters(DATA / "locality_scaled_units.csv")
    assert list(c["name"]) == exact["names"]
    for col in ("dram_read_bytes", "dram_write_bytes", "duration_ns"):
        assert np.allclose(c[col], exact[col], rtol=5e-3), col


def test_the_python_door_takes_counters_too():
    from taxmodel.api import Profile

    prof = Profile.from_traces(TRAIN / "trace_eager_b1.json.gz", counters=TRAIN / "ncu_eager_b1.csv.gz")
    k = prof.events[prof.events["kind"] == "kernel"]
    assert prof.meta["counters"]["kernels_with_counters"] == len(k) == 2280 and (k["dram_write_bytes"] >= 0).all()
