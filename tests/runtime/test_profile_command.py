"""``taxmodel profile -- COMMAND`` on CPU, end to end: the hook (inert without torch, chained to the
sitecustomize before it), the schedule (exactly --steps after --skip), step markers, shapes and no
stacks, one trace per rank, two CPU ranks under torchrun, --step-fn, the failure paths (a program
that ends early, a rank killed or crashing mid-capture, the command's exit status and stderr,
Ctrl-C, --timeout), nothing written beside -o, and --counters' pieces that run without a GPU
(issue 40; the GPU check is scripts/check_profile_command.sh)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_runner import stderr_runner

from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.runtime.command import capture_directory, hook_env
from taxmodel.runtime.command_bundle import Capture, done
from taxmodel.runtime.command_counters import attach_pass_counters, ncu_command
from taxmodel.runtime.command_hook import PROCS_DIR, STATUS_DIR, TRACE_DIR, Plan
from taxmodel.runtime.command_job import run_job
from taxmodel.trace.bundle import load_bundle
from taxmodel.trace.ncu import METRICS_ARG

HERE = Path(__file__).resolve().parent
TRAIN = str(HERE / "command_train.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def train(*args: str) -> list[str]:
    return [sys.executable, TRAIN, *args]


def torchrun(*args: str) -> list[str]:
    return [*TORCHRUN, TRAIN, *args]


def profile(args, command):
    """``taxmodel profile ARGS -- COMMAND`` in this process: (exit code, stdout, the stderr lines
    of taxmodel's own; the command's output goes to the test's file descriptors)."""
    r = stderr_runner().invoke(cli, ["profile", *args, "--", *command], prog_name="taxmodel")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.output, [ln for ln in r.stderr.splitlines() if ln.startswith("taxmodel:")]


def pids_of(text: str) -> list[int]:
    """The pids the job's processes printed (command_train.py says its pid first)."""
    return [int(p) for p in re.findall(r"command_train: pid (\d+)", text)]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def step_markers(bundle) -> pd.Series:
    """The loop's own step ranges (command_train's ``step_<i>``) per traced iteration."""
    ev = bundle.events
    marks = ev[(ev["kind"] == "marker") & ev["name"].str.match(r"^step_\d+$") & (ev["iteration"] >= 0)]
    return marks.groupby("rank")["name"].apply(lambda s: sorted(s, key=lambda n: int(n[5:])))


def nothing_beside(out: Path) -> None:
    """No file of taxmodel's outside -o (the capture directory beside it is gone)."""
    assert sorted(p.name for p in out.parent.iterdir()) == ([out.name] if out.exists() else [])


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One job traced by ``python -m taxmodel profile`` (skip 2, steps 3, a loop much longer than
    that), shared by the tests that read its bundle: (exit status, stdout, stderr, -o)."""
    out = tmp_path_factory.mktemp("traced") / "job"
    r = subprocess.run([sys.executable, "-m", "taxmodel", "profile", "--skip", "2", "--steps", "3", "-o", str(out),
                        "--", *train("--loop", "60", "--sleep", "0.02")], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr, out


# --- the hook ------------------------------------------------------------------------------------


def test_the_hook_is_inert_without_torch_and_runs_the_sitecustomize_that_was_there(tmp_path):
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("print('the user sitecustomize ran')\n")
    with capture_directory(tmp_path / "out") as cap:
        env = hook_env(cap, Plan(str(cap), 2, 3), {**os.environ, "PYTHONPATH": str(user)})
        probe = ("import sys; print('torch' in sys.modules, any(p.endswith('site') and 'out.' in p for p in sys.path), "
                 "sys.modules['sitecustomize'].__file__)")
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "the user sitecustomize ran"  # chained, and only once
        assert lines[1].split(" ", 2)[:2] == ["False", "False"]  # no torch, the hook's directory hidden
        assert lines[1].endswith(str(user / "sitecustomize.py"))
        assert not any((cap / d).exists() for d in (PROCS_DIR, STATUS_DIR, TRACE_DIR))  # nothing written
        r = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert len(list((cap / PROCS_DIR).glob("*.json"))) == 1  # registered, so that a stop reaches it
        assert not (cap / STATUS_DIR).exists() and not (cap / TRACE_DIR).exists()  # but no step: no status, no trace
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["user_site"]


def test_a_job_is_traced_in_the_asked_steps_with_shapes_markers_and_no_stacks(traced):
    code, stdout, stderr, out = traced
    assert code == 0, stderr
    b = load_bundle(out)
    assert b.world_size == 1 and b.ranks == [0]
    assert step_markers(b).tolist() == [["step_3", "step_4", "step_5"]]  # --skip 2 --steps 3: steps 3-5, no others
    kernels = b.events[(b.events["kind"] == "kernel") & (b.events["iteration"] >= 0)]
    assert kernels.groupby("iteration")["name"].apply(sorted).tolist() == [["bwd", "fwd"]] * 3
    cap = b.meta["capture"]
    assert (cap["profiler"]["record_shapes"], cap["profiler"]["with_stack"]) == (True, False)
    assert (cap["skip"], cap["steps"], cap["first_step"], cap["iterations"], cap["step"]) == \
        (2, 3, 3, 3, "torch.optim.Optimizer.step")
    assert cap["emulated_gpu"] is True and cap["stopped_after_capture"] is True
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["rank0.json.gz"]
    assert f"wrote {out}" in stdout and "iteration window" in stdout  # the summary and the ledger
    assert "taxmodel: stopped the command once every rank's trace was written (--run-to-end lets it finish)" in stderr
    assert pids_of(stderr) and all(map(gone, pids_of(stderr))) and "rank 0 done" not in stderr  # stopped, not ended
    nothing_beside(out)


@pytest.mark.parametrize("step_fn, flags, skip, traced", [
    ("command_steps:Trainer.step", ["--trainer"], "2", ["step_3", "step_4"]),
    ("__main__:train_step", [], "1", ["step_2", "step_3"]),  # --skip 1: no traced warm-up step
])
def test_step_fn_names_the_step_of_a_loop_without_an_optimizer(tmp_path, step_fn, flags, skip, traced):
    out = tmp_path / "out"
    code, _, notes = profile(["--skip", skip, "--steps", "2", "--step-fn", step_fn, "-o", str(out)],
                             train("--loop", "30", "--no-step", *flags))
    assert code == 0, notes
    b = load_bundle(out)
    assert step_markers(b).tolist() == [traced] and b.meta["capture"]["traced_warmup"] == (skip != "1")
    assert b.meta["capture"]["step"] == step_fn
    nothing_beside(out)


# --- failure paths -----------------------------------------------------------------------------


def test_the_commands_exit_status_and_stderr_reach_the_user(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "taxmodel", "profile", "--skip", "2", "--steps", "2", "--run-to-end",
                        "-o", str(out), "--", sys.executable, TRAIN, "--loop", "5", "--exit", "7"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 7, r.stderr
    assert "command_train: rank 0 done" in r.stderr  # the program's own stderr, and it ran to its end
    assert "taxmodel: the command exited with status 7 after the capture" in r.stderr
    assert load_bundle(out).meta["capture"]["stopped_after_capture"] is False
    nothing_beside(out)


@pytest.mark.parametrize("args, says", [
    (["--loop", "3"], "taxmodel: the command ended (exit status 0) after 3 step(s), before any rank completed a traced "
                      "step of steps 6-10 (--skip 5 --steps 5): nothing was written; lower --skip"),
    (["--no-step"], "taxmodel: the command ended (exit status 0) before its first step: no process called "
                    "torch.optim.Optimizer.step() (for another loop, name its step function with --step-fn"),
])
def test_a_program_that_ends_before_the_steps_is_one_line(tmp_path, args, says):
    out = tmp_path / "out"
    code, _, notes = profile(["-o", str(out)], train(*args))
    assert code == 3
    assert notes[1:] and notes[1].startswith(says) and len(notes) == 2, notes  # the start line, then one line
    assert not out.exists()
    nothing_beside(out)


def test_a_step_fn_that_is_not_there_is_one_line(tmp_path):
    out = tmp_path / "out"
    code, _, notes = profile(["--step-fn", "command_steps:Trainer.nope", "-o", str(out)], train("--trainer"))
    assert code == 3 and not out.exists()
    assert notes[1] == ("taxmodel: taxmodel's step hook failed in rank 0 (pid %s) before the first step: AttributeError: "
                        "--step-fn command_steps:Trainer.nope: command_steps has no Trainer.nope"
                        % re.search(r"pid (\d+)", notes[1]).group(1)), notes
    assert notes[2].endswith("nothing was written") and len(notes) == 3


def test_a_rank_killed_while_tracing_is_named(tmp_path):
    out = tmp_path / "out"
    code, _, notes = profile(["--skip", "2", "--steps", "3", "-o", str(out)], train("--loop", "10", "--kill-at", "4"))
    assert code == 128 + signal.SIGKILL
    assert any(n.startswith("taxmodel: rank 0 never wrote its trace: it ended while tracing steps 3-5") for n in notes)
    assert any("nothing was written" in n for n in notes) and not out.exists()
    nothing_beside(out)


def test_a_crash_mid_capture_keeps_the_complete_steps_and_says_so(tmp_path):
    out = tmp_path / "out"
    code, _, notes = profile(["--skip", "2", "--steps", "3", "-o", str(out)], train("--loop", "10", "--crash-at", "5"))
    assert code == 1  # python's status for the uncaught exception
    assert "taxmodel: the command exited with status 1" in notes
    assert "taxmodel: rank 0 ended during step 5: its trace holds 2 of the 3 traced steps" in notes
    b = load_bundle(out)
    assert step_markers(b).tolist() == [["step_3", "step_4"]] and b.meta["capture"]["iterations"] == 2
    assert any("its trace holds 2 of the 3" in n for n in b.meta["notes"])


def test_two_cpu_ranks_under_torchrun_each_write_their_trace(tmp_path, capfd):
    out = tmp_path / "out"
    code, stdout, notes = profile(["--skip", "2", "--steps", "2", "-o", str(out)], torchrun("--loop", "300", "--sleep", "0.02"))
    assert code == 0, notes
    err = capfd.readouterr().err  # the job's own output; torchrun's ranks lead sessions of their own
    assert len(pids_of(err)) == 2 and all(map(gone, pids_of(err))) and "done" not in err  # stopped, every rank
    b = load_bundle(out)
    assert b.world_size == 2 and b.ranks == [0, 1]
    assert step_markers(b).tolist() == [["step_3", "step_4"]] * 2
    comm = b.events[(b.events["role"] == "comm") & (b.events["iteration"] >= 0)]
    assert sorted(comm["rank"].unique()) == [0, 1] and comm["collective_op"].eq("allreduce").all()
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    assert "Skew wait" in stdout  # the ledger over both ranks
    nothing_beside(out)


def test_ranks_started_by_multiprocessing_spawn_are_ranks_too(tmp_path):
    """No RANK in their environment, and their groups are gone when they exit: the rank is
    torch.distributed's, as seen while the group was up."""
    out = tmp_path / "out"
    code, _, notes = profile(["--skip", "2", "--steps", "2", "-o", str(out)],
                             [sys.executable, str(HERE / "command_spawn.py"), str(tmp_path / "init"), "20"])
    assert code == 0, notes
    b = load_bundle(out)
    assert b.world_size == 2 and b.ranks == [0, 1]
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]


def test_a_rank_crashing_under_torchrun_is_said_and_the_others_kept(tmp_path):
    out = tmp_path / "out"
    code, _, notes = profile(["--skip", "2", "--steps", "3", "-o", str(out)],
                             torchrun("--loop", "12", "--crash-at", "4", "--bad-rank", "1"))
    assert code != 0 and notes[1].startswith(f"taxmodel: the command exited with status {code}")
    assert "taxmodel: rank 1 ended during step 4: its trace holds 1 of the 3 traced steps" in notes
    b = load_bundle(out)
    assert 1 in b.ranks and all(v == ["step_3"] for v in step_markers(b).tolist())  # what every rank completed
    nothing_beside(out)


def _start(args, out):
    """`python -m taxmodel profile ARGS -o out -- python command_train.py ...` in a session of its own."""
    cmd = [sys.executable, "-m", "taxmodel", "profile", *args, "-o", str(out), "--", sys.executable, TRAIN,
           "--loop", "100000", "--sleep", "0.05", "--print-step"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_step(proc, step: int) -> None:
    for line in proc.stdout:
        if line.strip() == f"step {step}":
            return
    raise AssertionError("the job ended before step %d: %s" % (step, proc.stderr.read()[-2000:]))


def test_ctrl_c_stops_the_job_and_keeps_the_complete_steps(tmp_path):
    out = tmp_path / "out"
    proc = _start(["--skip", "2", "--steps", "1000"], out)
    try:
        _wait_for_step(proc, 6)  # steps 3, 4, 5 traced
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    last = [ln for ln in err.splitlines() if ln.startswith("taxmodel:")][-1]
    assert re.match(rf"taxmodel: interrupted: the command and every rank were stopped; wrote {re.escape(str(out))} "
                    r"with what was captured \(1 rank\(s\), \d+ step\(s\)\)$", last), last
    assert all(gone(p) for p in pids_of(err)) and pids_of(err)
    assert len(step_markers(load_bundle(out)).iloc[0]) >= 3
    nothing_beside(out)


def test_timeout_stops_the_job_and_keeps_what_was_traced(tmp_path):
    out = tmp_path / "out"
    proc = _start(["--skip", "2", "--steps", "100000", "--timeout", "20"], out)  # 6 s fell short on a loaded machine
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "taxmodel: the command was stopped at --timeout 20 s" in err
    assert re.search(r"taxmodel: rank 0 ended during step \d+: its trace holds \d+ of the 100000 traced steps", err)
    assert all(gone(p) for p in pids_of(err)) and len(step_markers(load_bundle(out)).iloc[0]) >= 1


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["--steps", "3", "toy"], "--steps applies to a command after -- (a workload's steps are --iterations and --warmup)"),
    (["--preset", "m1", "--", "python", "t.py"], "--preset applies to a built-in workload, not to a command after --"),
    (["toy", "--", "python", "t.py"], "WORKLOAD (toy) applies to a built-in workload, not to a command after --"),
    (["--"], "nothing after --: give the command to profile"),
    (["--", "no-such-program-40"], "no-such-program-40: command not found"),
    (["--step-fn", "train_step", "--", "python", "t.py"], "--step-fn 'train_step': expected MODULE:QUALNAME"),
    (["--skip", "0", "--", "python", "t.py"], "Invalid value for '--skip'"),
    ([], "Missing argument 'WORKLOAD' (or -- COMMAND to profile your own job)"),
])
def test_wrong_uses_are_one_line(args, says):
    r = stderr_runner().invoke(cli, ["profile", *args], prog_name="taxmodel")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], r.stderr


def test_an_output_holding_the_users_files_is_refused_before_the_command_runs(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    marker = tmp_path / "ran"
    r = stderr_runner().invoke(cli, ["profile", "-o", str(out), "--", sys.executable, "-c",
                                     f"open({str(marker)!r}, 'w')"], prog_name="taxmodel")
    assert r.exit_code == 2 and "is a directory holding other things" in r.stderr
    assert not marker.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


# --- --counters without a GPU: the command, the counted step, the attach ----------------------------


def test_the_counters_pass_runs_the_command_under_ncu_for_the_profiled_range_only(tmp_path):
    csv = tmp_path / "c.csv"
    cmd = ncu_command("/opt/ncu", ["torchrun", "train.py", "--lr", "1"], csv)
    assert cmd[0] == "/opt/ncu" and cmd[-4:] == ["torchrun", "train.py", "--lr", "1"]
    opts = cmd[1:-4]
    for pair in (["--profile-from-start", "off"], ["--target-processes", "all"], ["--metrics", METRICS_ARG],
                 ["--log-file", str(csv)], ["--cache-control", "none"]):
        i = opts.index(pair[0])
        assert opts[i:i + 2] == pair
    assert "--csv" in opts


def test_the_counters_mode_marks_exactly_the_first_traced_step(tmp_path):
    with capture_directory(tmp_path / "out") as cap:
        plan = Plan(str(cap), 3, 2, mode="counters")
        end = run_job(train("--loop", "40"), hook_env(cap, plan), cap, done=lambda: done(cap, plan),
                      run_to_end=True, timeout_s=120, grace_s=lambda: 3.0)
        (status,) = Capture.read(cap).statuses
        assert end.code == 0 and status["state"] == "counted" and status["calls"] == 40
        assert status["counted_between_calls"] == [3, 4]  # step 4: from the end of call 3 to the end of call 4
        assert not (cap / TRACE_DIR).exists()  # nothing traced in this pass


def _ncu_csv(rows: list[tuple[str, int, int]]) -> str:
    head = '"ID","Process ID","Kernel Name","Device","Metric Name","Metric Unit","Metric Value"\n'
    body = ""
    for i, (name, read, write) in enumerate(rows):
        for metric, unit, value in (("dram__bytes_read.sum", "byte", read), ("dram__bytes_write.sum", "byte", write),
                                    ("lts__t_sector_hit_rate.pct", "%", 50), ("gpu__time_duration.sum", "ns", 1000)):
            body += f'"{i}","77","{name}","0","{metric}","{unit}","{value:,}"\n'
    return "==PROF== Connected to process 77\n" + head + body


def test_counters_of_one_step_attach_to_every_traced_step_of_the_bundle(traced, tmp_path):
    import shutil

    bundle = tmp_path / "job"
    shutil.copytree(traced[3], bundle)
    wrong = tmp_path / "wrong.csv"
    wrong.write_text(_ncu_csv([("bwd", 1, 2), ("fwd", 3, 4)]))
    before = (bundle / "events.parquet").read_bytes()
    with pytest.raises(InputError, match=r"kernel of step 1 \(repetition 0\) 0 differs: bundle .fwd. vs counters .bwd."):
        attach_pass_counters(bundle, wrong, command=["python", "t.py"], step=3, pass_s=1.0)
    assert (bundle / "events.parquet").read_bytes() == before  # untouched
    csv = tmp_path / "counters.csv"
    csv.write_text(_ncu_csv([("fwd", 1000, 2000), ("bwd", 3000, 4000)]))
    said = attach_pass_counters(bundle, csv, command=["python", "t.py"], step=3, pass_s=1.0)
    assert said.startswith(f"DRAM counters of 6 kernel(s) attached to {bundle} (ncu counted step 3: 2 kernels; "
                           "match per_step)")
    b = load_bundle(bundle)
    k = b.events[(b.events["kind"] == "kernel") & (b.events["iteration"] >= 0)]
    assert k.groupby("name")["dram_read_bytes"].unique().map(list).to_dict() == {"bwd": [3000], "fwd": [1000]}
    assert b.meta["counters"]["counted_step"] == 3 and b.meta["counters"]["pass"].startswith("taxmodel profile")
    assert sorted(p.name for p in (bundle / "raw").iterdir()) == ["rank0.json.gz"]


def test_counters_of_a_cpu_job_are_refused_in_one_line_after_its_bundle_is_written(tmp_path, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho ran > \"$0.ran\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TAXMODEL_NCU", str(fake))
    out = tmp_path / "out"
    r = stderr_runner().invoke(cli, ["profile", "--skip", "2", "--steps", "2", "--counters", "-o", str(out), "--",
                                     sys.executable, TRAIN, "--loop", "30"], prog_name="taxmodel")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"taxmodel: error: --counters: the job ran no CUDA work (a CPU run), there is nothing for ncu to count; {out} "
        "is written without counters")
    assert f"wrote {out}" in r.output and json.loads((out / "meta.json").read_text()).get("counters") is None
    assert not (tmp_path / "ncu.ran").exists()  # refused before ncu ran


def test_a_stop_signals_each_process_once_through_its_group():
    """The command leads its process group and is also registered (it imported torch): the stop
    signal goes to its group once, not to it a second time, nor to a member of that group."""
    from taxmodel.runtime.command_job import once_per_group

    proc = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        member = int(proc.stdout.readline())
        other = subprocess.Popen(["sleep", "30"], start_new_session=True)
        try:
            assert once_per_group([proc.pid, member, proc.pid, other.pid, other.pid]) == [proc.pid, other.pid]
            assert once_per_group([member, proc.pid]) == [proc.pid]  # the leader's group reaches the member
        finally:
            other.kill()
            other.wait()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert once_per_group([proc.pid]) == []  # gone
