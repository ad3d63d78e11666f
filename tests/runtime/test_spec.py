"""One profile spec: the CLI, the JSON sent to the ranks and the worker's torchrun options agree,
and a rank started by torchrun (no host checked its request) checks it itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taxmodel.errors import InputError
from taxmodel.runtime.spec import ProfileSpec
from taxmodel.runtime.worker import _parse_args

TOY = str(Path(__file__).with_name("toy_workload.py"))


def test_the_readme_torchrun_command_is_a_spec():
    spec, checked = _parse_args(["--workload", "ag_gemm", "--preset", "m8192", "--device", "cuda", "-o", "runs/"])
    assert spec == ProfileSpec(workload="ag_gemm", preset="m8192", device="cuda", out="runs/")
    assert not checked  # nobody checked it: the rank will


def test_a_spec_from_the_host_round_trips_and_counts_as_checked(tmp_path):
    from taxmodel.runtime.profile import build_spec

    sent, world, device = build_spec(ProfileSpec(workload="toy", workload_modules=[TOY], device="cpu", world_size=2,
                                                 variants=["bsp"], shape={"N": 4}, inject=["kill_rank=1@capture"]))
    assert (world, device, sent["preset"], sent["world_size"]) == (2, "cpu", "tiny", 2)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(sent))
    spec, checked = _parse_args(["--spec", str(path)])
    assert checked and spec.to_dict() == sent
    spec, checked = _parse_args(["--spec", str(path), "--iterations", "7", "--shape", "N=2", "--inject", "extra_copy=1"])
    assert not checked  # changed on the rank's command line: checked again there
    assert (spec.iterations, spec.shape, spec.inject) == (7, {"N": 2}, ["kill_rank=1@capture", "extra_copy=1"])


def test_an_unknown_setting_is_refused():
    with pytest.raises(InputError, match=r"unknown setting\(s\) iterationz"):
        ProfileSpec.from_dict({"workload": "toy", "iterationz": 3})


def test_the_cli_options_are_the_specs_fields_with_the_same_defaults():
    """A setting added to the spec but not to `taxmodel profile` (or with another default) shows here."""
    from taxmodel.cli import cli

    cli_only = {"counters", "graph_strict",  # a second pass; a stricter --graph
                "steps", "skip", "step_fn", "run_to_end"}  # `profile -- COMMAND`'s (runtime/command.py)
    spec_only = {"keep_raw", "progress", "graph_backend", "deadline_unix", "counters_pass"}
    params = {p.name: p for p in cli.commands["profile"].params}
    fields = ProfileSpec.__dataclass_fields__
    assert set(params) - cli_only == set(fields) - spec_only
    defaults = ProfileSpec(workload="x").to_dict()
    for name, p in params.items():
        if name in cli_only or name in ("workload", "graph", "shape", "inject", "workload_modules"):
            continue  # an argument, a flag for a mode, or tuples (multiple=True)
        assert p.default == defaults[name], name


def test_torchrun_ranks_check_their_request_and_profile(tmp_path):
    """The multi-node entry of the README, on 2 local CPU ranks: a bad request is refused on the
    rank (exit 2, before joining), a good one writes its bundle."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    worker = ["-m", "taxmodel.runtime.worker", "--workload", "toy", "--workload-module", TOY, "--device", "cpu",
              "--iterations", "2", "--warmup", "1", "-o", str(tmp_path), "--timeout", "120"]
    bad = subprocess.run([sys.executable, *worker, "--variants", "nope"], env=env, capture_output=True, text=True,
                         timeout=180)
    assert bad.returncode == 2 and "toy: unknown variant(s) nope; choose from bsp, ring, never" in bad.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    good = subprocess.run([*torchrun, *worker, "--variants", "bsp"], env=env, capture_output=True, text=True, timeout=180)
    assert good.returncode == 0, good.stderr[:4000] + "\n...\n" + good.stderr[-2000:]  # the cause, and torchrun's summary
    (meta,) = tmp_path.glob("toy/bsp-*/meta.json")
    assert json.loads(meta.read_text())["world_size"] == 2


@pytest.mark.parametrize("size", [0, -1])
def test_a_heap_size_below_one_byte_is_refused(size):
    """--heap-size 0 fell back to the default silently, and -1 reached the heap."""
    with pytest.raises(InputError, match=f"--heap-size {size}: give the bytes"):
        ProfileSpec(workload="toy", heap_bytes=size).check()
    ProfileSpec(workload="toy", heap_bytes=1 << 20).check()


@pytest.mark.parametrize("source, says", [
    ("raise RuntimeError('boom')\n", r"importing it raised RuntimeError: boom at .*wl_\w+\.py:1$"),
    ("x = (\n", r"importing it raised SyntaxError: .* \(wl_\w+\.py, line 1\)$"),
])
def test_a_workload_module_that_fails_is_one_line_of_bad_input(tmp_path, source, says):
    """The user's module raising is their input, not taxmodel's bug: one line naming the module and
    where it failed, exit 2 (was: 'internal error', exit 70)."""
    from cli_runner import stderr_runner

    from taxmodel.cli import cli
    from taxmodel.runtime.spec import import_workload_modules

    mod = tmp_path / f"wl_{'syntax' if 'x = (' in source else 'raises'}.py"
    mod.write_text(source)
    with pytest.raises(InputError, match=says):
        import_workload_modules([str(mod)])
    assert not any(name.startswith("taxmodel_user_workload_wl_") for name in sys.modules)
    r = stderr_runner().invoke(cli, ["workloads", "--workload-module", str(mod)])
    assert r.exit_code == 2 and r.stderr.startswith("taxmodel: error: --workload-module ") and \
        len(r.stderr.strip().splitlines()) == 1, r.stderr
    sys.path.insert(0, str(tmp_path))
    try:  # the same module by name
        with pytest.raises(InputError, match=f"--workload-module {mod.stem}: importing it raised"):
            import_workload_modules([mod.stem])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(mod.stem, None)
