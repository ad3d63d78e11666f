"""README's two set-up commands are exactly what CI runs."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_readme_has_two_setup_commands():
    commands = _readme_setup_commands()
    assert len(commands) == 2, commands
    assert "pip install" in commands[0] and "taxmodel" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_readme_commands_verbatim():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in _readme_setup_commands():
        assert command in ci_lines, f".ci/run does not run README's command: {command}"


def _tour_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## A tour", 1)[1]
    return [line for line in re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0].splitlines() if line.strip()]


def test_every_tour_command_runs_on_cpu_as_written_or_is_marked_gpu(tmp_path, monkeypatch):
    """A new user's first hour: the tour, on this CPU machine, each line as written (the shell's
    glob expanded), after the set-up's `taxmodel profile ag_gemm -o runs`. A line marked GPU is
    one whose input only a GPU makes: the profile of GPU presets must then stop at once and say so."""
    import glob
    import shlex

    from click.testing import CliRunner

    from taxmodel.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").symlink_to(ROOT / "profiles")
    (tmp_path / "taxmodel").symlink_to(ROOT / "taxmodel")
    setup = CliRunner().invoke(cli, ["profile", "ag_gemm", "-o", "runs"])
    assert setup.exit_code == 0, setup.output
    ran, gpu = [], []
    for line in _tour_commands():
        command, _, comment = line.partition("#")
        args = [a for word in shlex.split(command)[1:] for a in (sorted(glob.glob(word)) if "*" in word else [word])]
        if comment.strip().startswith("GPU"):
            gpu.append(args[0])
            if args[0] == "profile":  # refused at once on CPU, saying why and what runs here
                res = CliRunner().invoke(cli, args)
                assert res.exit_code == 2 and "sized for GPUs" in res.output and "--preset tiny" in res.output, res.output
            continue
        res = CliRunner().invoke(cli, args)
        # validate's exit status is its verdict: 1 while some comparisons miss their target (README: 496 of 810 within)
        assert res.exit_code == 0 or (args[0] == "validate" and res.exit_code == 1 and "| workload" in res.output), \
            (line, res.output)
        ran.append(args[0])
    assert gpu == ["profile", "validate", "compare"]
    assert ran == ["workloads", "analyze", "report", "report", "export-trace", "predict", "validate"]
    assert (tmp_path / "report-figures").is_dir() and list((tmp_path / "traces").glob("bsp-*.json"))
