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
from taxmodel.model.ledger import compute_ledger
from taxmodel.trace import importers

CORPUS = Path(__file__).resolve().parents[1] / "data" / "thirdparty"
LEDGER, REFUSED = "ledger", "refused"


@dataclass(frozen=True)
class Case:
    files: tuple[str, ...]
    expect: str
    why: str
    options: dict = field(default_factory=dict)

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
    Case(("tracelens/rocprofv3_908_results_first4000.json.gz",), LEDGER, "rocprofv3 JSON (MI100)"),
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
    Case(("tracelens/mi300x_resnet_act_checkpoint_rank0_of_8.json.gz", "tracelens/b200_eager_rank0_of_8.json.gz"), REFUSED,
         "two different jobs (MI300X with NCCL 2.22.3, B200 with 2.27.5) given as one run", SUBSET),
]
NSYS = next(c for c in CASES if c.files[0].endswith("saxpy_mpi_cuda_rank0.sqlite"))


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
        assert "\n" not in msg and Path(case.files[0]).name in msg


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == REFUSED] + [CASES[0], NSYS], ids=lambda c: c.id)
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
