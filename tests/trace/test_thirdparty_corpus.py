"""Every real third-party trace in ``tests/data/thirdparty`` (README.md there names each file's
source, commit and license) either imports and gives an exact ledger, or is refused with one
line -- never a traceback.

A ledger here means: at least one window longer than zero, and for every (repetition,
iteration, rank) the parts summing exactly to that window. A refusal means a ``TaxmodelError``
(exit status 2 in the CLI) whose message is a single line naming the file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.errors import TaxmodelError
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace import importers

CORPUS = Path(__file__).resolve().parents[1] / "data" / "thirdparty"
LEDGER, REFUSED = "ledger", "refused"


@dataclass(frozen=True)
class Case:
    files: tuple[str, ...]
    expect: str
    why: str
    options: dict = field(default_factory=dict)
    says: str = ""  # what a refusal must say the file is

    @property
    def id(self) -> str:
        return "+".join(Path(f).name.split(".")[0] for f in self.files)

    def paths(self) -> list[Path]:
        return [CORPUS / f for f in self.files]


SUBSET = {"allow_missing_ranks": True}

CASES = [
    # Kineto (torch.profiler) from several GPUs and jobs
    Case(("kineto/v100_resnet50_integer_us.json.gz",), LEDGER, "integer-us Kineto with 636 zero-duration GPU events"),
    Case(("hta/mi250_minitoy_train_ROCm6_2_kineto.json.gz",), LEDGER, "MI250, ProfilerStep markers"),
    Case(("hta/a100_alexnet_no_steps.json.gz",), LEDGER, "A100, no ProfilerStep markers"),
    Case(("hta/a100_event_sync.json.gz",), LEDGER, "A100, cudaEventSynchronize"),
    Case(("hta/a100_event_sync_multi_stream.json.gz",), LEDGER, "A100, cross-stream event waits, no markers"),
    Case(("hta/a100_triton_example.json.gz",), LEDGER, "A100, one Triton kernel"),
    Case(("hta/a100_nccl_rank0_of_2.json.gz",), LEDGER, "A100, NCCL, rank 0 of 2", SUBSET),
    Case(("hta/sampled_rank0_of_128.json.gz", "hta/sampled_rank1_of_128.json.gz"), LEDGER,
         "two ranks of a 128-rank NCCL training job", SUBSET),
    Case(("hta/rank1_no_world_size.json.gz",), LEDGER, "rank 1 with no world size", SUBSET),
    Case(("hta/rank1_no_world_size.json.gz",), LEDGER, "rank 1 with --world-size 4", {**SUBSET, "world_size": 4}),
    Case(("hta/inference_rank1_no_steps.json.gz",), LEDGER, "rank 1, no world size, no markers", SUBSET),
    Case(("tracelens/h100_bert_small.json.gz",), LEDGER, "H100 inference"),
    Case(("tracelens/mi300x_bert_small.json.gz",), LEDGER, "MI300X inference"),
    Case(("tracelens/mi210_gpu_only.json.gz",), LEDGER, "MI210, GPU activities only"),
    Case(("tracelens/mi300x_torch_compile_triton.json.gz",), LEDGER, "MI300X torch.compile, no markers"),
    Case(("tracelens/mi300x_sglang_qwen3_8b_decode.json.gz",), LEDGER, "MI300X SGLang decode, no markers"),
    Case(("tracelens/mi300x_vllm_decode_graph.json.gz",), LEDGER, "MI300X vLLM decode with graph replays"),
    Case(("tracelens/b200_eager_rank0_of_8.json.gz",), LEDGER, "B200, NCCL, rank 0 of 8, no markers", SUBSET),
    Case(("tracelens/mi300x_resnet_act_checkpoint_rank0_of_8.json.gz",), LEDGER, "MI300X, RCCL, rank 0 of 8", SUBSET),
    # other tools
    Case(("tracelens/rocprofv3_908_results_first4000.json.gz",), LEDGER, "rocprofv3 JSON (MI350X, gfx950)"),
    Case(("pipit/perlmutter_saxpy_mpi_cuda_rank0.sqlite",), LEDGER, "real Nsight Systems export (A100, Perlmutter)"),
    Case(("pipit/perlmutter_cloverleaf_cuda.sqlite",), LEDGER, "real Nsight Systems export (A100, Perlmutter)"),
    # not GPU traces: refused in one line
    Case(("hta/cpu_only_rank34.json.gz",), REFUSED, "CPU-only Kineto trace", SUBSET),
    Case(("hta/a100_no_gpu_events.json.gz",), REFUSED, "Kineto trace without GPU activities"),
    Case(("hta/a100_cupti_range_profiler_only.json.gz",), REFUSED, "CUPTI range-profiler counters only"),
    Case(("hta/mtia_inference_rank0.json.gz",), REFUSED, "MTIA accelerator, not a GPU"),
    Case(("hta/execution_trace_simple_add_et.json.gz",), REFUSED, "PyTorch execution trace, not a profiler trace"),
    Case(("hta/a100_alexnet_truncated.json.gz",), REFUSED, "Kineto JSON cut short"),
    Case(("pipit/perlmutter_saxpy_truncated.sqlite",), REFUSED, "Nsight Systems export cut short"),
    Case(("pipit/not_nsys_test.sqlite",), REFUSED, "an SQLite file that is not an Nsight Systems export"),
    Case(("pipit/perlmutter_saxpy_cpu_only.sqlite.gz",), REFUSED, "an Nsight Systems export without CUDA activity",
         says="Nsight Systems export with no CUDA activity"),
    Case(("rpd/matmul_result_rpd.rpd.gz",), REFUSED, "an RPD (rocmProfileData) database", says="an RPD database"),
    Case(("magma/magma_dgeqrf_nvprof.nvvp.gz",), REFUSED, "an nvprof database", says="an nvprof database"),
    Case(("tracelens/mi300x_resnet_act_checkpoint_rank0_of_8.json.gz", "tracelens/b200_eager_rank0_of_8.json.gz"), REFUSED,
         "two different jobs (MI300X with NCCL 2.22.3, B200 with 2.27.5) given as one run", SUBSET),
]
NSYS = next(c for c in CASES if c.files[0].endswith("saxpy_mpi_cuda_rank0.sqlite"))
SMALL_KINETO = next(c for c in CASES if c.id == "a100_event_sync")


def run_case(case: Case, out: Path):
    """Import the case's files into a bundle at ``out`` and compute its ledger (what `taxmodel
    import` followed by `taxmodel analyze` does)."""
    bundle, _ = importers.import_bundle(case.paths(), out, keep_raw=False, **case.options)
    return compute_ledger(bundle)


def assert_exact(ledger) -> None:
    windows = ledger.windows.set_index(["repetition", "iteration"])["window_ns"]
    assert len(windows) and (windows > 0).all()
    sums = ledger.parts.groupby(["repetition", "iteration", "rank"])["ns"].sum()
    expected = windows.reindex(sums.index.droplevel("rank")).to_numpy()
    assert (sums.to_numpy() == expected).all()
    assert (ledger.parts["ns"] >= 0).all()


def test_every_corpus_file_has_a_case():
    listed = {f for c in CASES for f in c.files}
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file() and p.name not in ("LICENSE", "README.md")}
    assert on_disk == listed


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_corpus_file(case: Case, tmp_path):
    if case.expect == LEDGER:
        assert_exact(run_case(case, tmp_path / "b"))
    else:
        with pytest.raises(TaxmodelError) as err:
            run_case(case, tmp_path / "b")
        msg = str(err.value)
        assert "\n" not in msg and Path(case.files[0]).name in msg and case.says in msg


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == REFUSED] + [SMALL_KINETO, NSYS], ids=lambda c: c.id)
def test_cli_never_shows_a_traceback(case: Case, tmp_path):
    runner = CliRunner()
    args = ["import", *map(str, case.paths()), "-o", str(tmp_path / "b"), "--no-keep-raw"]
    if case.options.get("allow_missing_ranks"):
        args.append("--allow-missing-ranks")
    if case.options.get("world_size"):
        args += ["--world-size", str(case.options["world_size"])]
    res = runner.invoke(cli, args)
    if res.exit_code == 0:
        res = runner.invoke(cli, ["analyze", str(tmp_path / "b")])
    assert res.exit_code == (0 if case.expect == LEDGER else 2), res.output
    assert "Traceback" not in res.output and not isinstance(res.exception, AssertionError)
    if case.expect == REFUSED:
        assert res.output.strip().count("\n") <= 1  # 'format: ...' then the one-line error


def test_a_subset_of_ranks_says_skew_is_unknowable(tmp_path):
    """Rank 0 of an 8-rank RCCL job: the ledger, its JSON and the report's metadata say that 7
    ranks are missing, so skew_wait cannot be measured (ledger/coverage.py)."""
    from taxmodel.report.document import metadata_table
    from taxmodel.trace.bundle import load_bundle

    case = next(c for c in CASES if c.id == "mi300x_resnet_act_checkpoint_rank0_of_8")
    led = run_case(case, tmp_path / "b")
    assert led.to_dict()["missing_ranks"] == [1, 2, 3, 4, 5, 6, 7]
    assert any(c.startswith("only 1 of 8 ranks were imported (missing: 1-7)") for c in led.caveats)
    assert metadata_table([(load_bundle(tmp_path / "b"), led)])["ranks"].tolist() == ["1 of 8"]
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "b")])
    assert res.exit_code == 0 and "x 1 rank(s) of 8 (skew unknowable" in res.output


def test_a_full_run_has_no_missing_ranks(tmp_path):
    led = run_case(SMALL_KINETO, tmp_path / "b")
    assert led.to_dict()["missing_ranks"] == [] and not any("ranks were imported" in c for c in led.caveats)


def test_pipelined_steps_are_not_counted_twice(tmp_path):
    """The real ResNet-50 trace with every other one of each step's last 100 GPU activities
    relabelled as the next step's (as a loop that prefetches the next step's work on a side
    stream would record them): the windows then overlap, and the ledger cuts them into a
    partition -- the windows sum to the time they cover, once, and every rank's parts still
    sum to its window."""
    from taxmodel.trace.bundle import load_bundle

    case = next(c for c in CASES if c.id == "v100_resnet50_integer_us")
    importers.import_bundle(case.paths(), tmp_path / "b", keep_raw=False)
    bundle = load_bundle(tmp_path / "b")
    ev = bundle.events.copy()  # a loaded bundle's columns are read-only
    bundle.events = ev
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"]) & (ev["iteration"] >= 0)].sort_values("start_ns")
    its = sorted(gpu["iteration"].unique())
    for prev, nxt in zip(its, its[1:]):
        ev.loc[gpu.index[gpu["iteration"] == prev][-100::2], "iteration"] = nxt
    led = compute_ledger(bundle)
    assert_exact(led)
    assert any("pipelined steps" in c for c in led.caveats)
    w = led.windows.sort_values("start_ns")
    assert (w["start_ns"].to_numpy()[1:] >= w["end_ns"].to_numpy()[:-1]).all()
    moved = gpu[gpu["iteration"] >= 0]
    assert int(w["window_ns"].sum()) <= int(moved["end_ns"].max() - moved["start_ns"].min())
