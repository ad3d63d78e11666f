"""A regression gate nobody can fool (issue 38): every way a review found to make `compare` pass a
slower candidate, or `baseline update` lose or weaken a baseline, now fails loudly."""
from __future__ import annotations

import json
import os
import re
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from taxmodel import fsutil
from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.regress.baseline import LOG_NAME, apply_update, plan_update, read_log, update_lock
from taxmodel.trace.bundle import load_bundle, write_bundle

from cli_runner import stderr_runner
from test_regress_compare import BSP_ROW, write_case, write_side

THIN = dict(world_size=2, iterations=1, repetitions=1)
SLOW = {"bsp": {"kernel_gap_ns": 200_000}}  # a multiple of the window: anything but "unchanged" is a bug


def cli_run(*args):
    res = stderr_runner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.output, res.stderr


def test_a_thin_side_cannot_be_judged_exit_2_one_line(tmp_path):
    base = write_side(tmp_path / "base", seed=1, variants=("bsp",), **THIN)
    slow = write_side(tmp_path / "slow", seed=2, variants=("bsp",), slow=SLOW, **THIN)
    code, out, err = cli_run("compare", base, slow, "--json", tmp_path / "c.json")
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "cannot judge, too few samples" in err
    assert "the baseline has 1 iteration(s), at least 3 needed" in err
    assert json.loads((tmp_path / "c.json").read_text())["exit_code"] == 2
    thick = write_side(tmp_path / "thick", seed=3, variants=("bsp",))
    code, _, err = cli_run("compare", thick, slow)  # a thin candidate alone
    assert code == 2 and "the candidate has 1 iteration(s)" in err


def test_baseline_update_refuses_a_candidate_too_thin_to_gate(tmp_path):
    thin = write_side(tmp_path / "thin", seed=1, variants=("bsp",), **THIN)
    baseline = tmp_path / "profiles" / "h200"
    code, _, err = cli_run("baseline", "update", thin, "--baseline", baseline, "--yes")
    assert code == 2 and "1 iteration(s), at least 3 needed" in err and "could never judge" in err
    assert not baseline.exists()


def test_a_candidate_missing_a_rank_is_named_and_fails(tmp_path):
    base = write_side(tmp_path / "base", seed=1, variants=("bsp",))
    full = load_bundle(write_case(tmp_path / "full", "bsp", variant="bsp", seed=7, world_size=2, iterations=6,
                                  repetitions=8, jitter_ns=5000))
    cand = tmp_path / "cand"
    meta = {**full.meta, "ranks": [0], "notes": ["import: ranks {1} of world size 2 are missing; imported as a subset"]}
    write_bundle(cand / "bsp", full.events[full.events["rank"] == 0], meta)
    code, out, err = cli_run("compare", base, cand)
    assert code == 2, (out, err)
    assert f"{BSP_ROW}: the candidate lacks rank(s) 1 that the baseline has" in err


def test_a_stale_copy_in_the_candidate_dir_is_refused_unless_pooled(tmp_path):
    base = write_side(tmp_path / "base", seed=1, variants=("bsp",))
    cand = write_side(tmp_path / "cand", seed=2, variants=("bsp",), slow=SLOW)
    write_case(cand / "old", "bsp", variant="bsp", seed=9, world_size=2, iterations=6, repetitions=8, jitter_ns=5000)
    code, _, err = cli_run("compare", base, cand)
    assert code == 2 and "2 bundles of " + BSP_ROW in err and "stale copy" in err and "--pool" in err
    code, out, _ = cli_run("compare", base, cand, "--pool")
    assert code in (0, 1) and "pooled as independent repetitions" in out


def test_a_regress_toml_outside_the_project_is_not_applied(tmp_path):
    """/tmp/regress.toml with gate = false used to switch the gate off for any baseline below /tmp."""
    (tmp_path / "regress.toml").write_text("[thresholds.default]\ngate = false\n[thresholds.latency]\ngate = false\n")
    base = write_side(tmp_path / "ci" / "base", seed=1, variants=("bsp",))
    slow = write_side(tmp_path / "ci" / "slow", seed=2, variants=("bsp",), slow=SLOW)
    code, out, _ = cli_run("compare", base, slow)
    assert code == 1, out
    assert "Thresholds: built-in defaults (no regress.toml in" in out and "which is in no project" in out
    (base / "regress.toml").write_text("[thresholds.default]\ngate = false\n[thresholds.latency]\ngate = false\n")
    code, out, _ = cli_run("compare", base, slow)  # beside the baselines: that is the owners' file
    assert code == 0 and f"Thresholds: {base / 'regress.toml'}" in out


@pytest.mark.parametrize("flag", ["--json", "--junit", "--markdown"])
def test_compare_outputs_never_replace_an_input(tmp_path, flag):
    base = write_side(tmp_path / "base", seed=1, variants=("bsp",))
    meta = base / "bsp" / "meta.json"
    before = meta.read_bytes()
    code, _, err = cli_run("compare", base, base, flag, meta)
    assert code == 2 and f"is the input {base / 'bsp'}" not in err and "is inside the input" in err
    assert meta.read_bytes() == before
    code, _, err = cli_run("compare", base, base, "--json", tmp_path / "o.json", "--junit", tmp_path / "o.json")
    assert code == 2 and "o.json: is also the junit output; give each output a file of its own" in err
    assert not (tmp_path / "o.json").exists()


def test_two_updates_at_once_keep_both_rows_and_log_lines(tmp_path):
    """Without the lock each update started from the same old directory: the second rename dropped
    the first one's row and log line while both printed 'updated'."""
    a = write_side(tmp_path / "a", seed=1, variants=("bsp",))
    b = write_side(tmp_path / "b", seed=2, variants=("fused",))
    baseline = tmp_path / "profiles" / "h200"
    done = []

    def second():
        with update_lock(baseline):
            apply_update(plan_update(b, baseline), "b")
            done.append("b")

    with update_lock(baseline):
        plan = plan_update(a, baseline)
        t = threading.Thread(target=second)
        t.start()
        t.join(0.5)
        assert t.is_alive() and not done  # waits for the lock
        apply_update(plan, "a")
    t.join(60)
    assert done == ["b"]
    assert {p.parent.name for p in baseline.rglob("meta.json")} == {"synthetic__bsp__k=512_m=128_n=256",
                                                                     "synthetic__fused__k=512_m=128_n=256"}
    assert [e["message"] for e in read_log(baseline)] == ["a", "b"]
    with update_lock(baseline), pytest.raises(InputError, match="another baseline update"):
        with update_lock(baseline, wait_s=0.1):
            pass


def test_a_killed_update_is_recovered_and_logged_as_a_replacement(tmp_path):
    old = write_side(tmp_path / "old", seed=1, variants=("bsp",))
    new = write_side(tmp_path / "new", seed=2, variants=("bsp",))
    baseline = tmp_path / "profiles" / "h200"
    assert cli_run("baseline", "update", old, "--baseline", baseline, "--yes")[0] == 0
    dead = 2 ** 22 + 12345  # above pid_max's default: never a live process
    aside = baseline.with_name(f".{baseline.name}.{dead}-{fsutil.OLD_TAG}0badcafe{fsutil.TMP_SUFFIX}")
    os.rename(baseline, aside)  # killed between the two renames: the new one never arrived
    code, out, err = cli_run("baseline", "update", new, "--baseline", baseline, "--yes")
    assert code == 0, err
    assert "replace" in out.splitlines()[1] and not aside.exists()
    log = read_log(baseline)
    assert [r["action"] for e in log for r in e["rows"]] == ["add", "replace"]
    assert (baseline / LOG_NAME).is_file()


def test_names_from_bundles_cannot_inject_into_terminal_markdown_or_junit(tmp_path):
    evil = "gemm\x1b]52;c;ZXZpbA==\x07\x1b[2J\x01 ![x](https://e.example/p.png) <img src=x> [l](https://e) @team $x$"
    base = tmp_path / "base"
    cand = tmp_path / "cand"
    for root, seed in ((base, 1), (cand, 2)):
        write_case(root, "b", variant=evil, seed=seed, world_size=2, iterations=6, repetitions=4, jitter_ns=5000,
                   kernel_gap_ns=0 if root is base else 200_000)
    md, junit = tmp_path / "s.md", tmp_path / "j.xml"
    code, out, err = cli_run("compare", base, cand, "--markdown", md, "--junit", junit)
    assert code == 1, (out, err)
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]52" in out
    text = md.read_text()
    assert "\x1b" not in text and "\x07" not in text
    rendered = re.sub(r"(`+).+?\1", "", text)  # inside code spans nothing renders: check the rest
    assert "![" not in rendered and "<img" not in rendered and "](" not in rendered
    assert "https://" not in rendered and " @team" not in rendered and "$x$" not in rendered
    root = ET.parse(junit).getroot()  # valid XML: the control characters are shown, not written
    assert root.get("failures") != "0"
    assert any("\\x01" in (c.get("classname") or "") for c in root.iter("testcase"))
