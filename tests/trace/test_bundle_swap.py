"""Replacing a bundle is two renames (old aside, new in place); a writer killed between them
must not hide the old bundle (issue 28). The old one waits under a temporary name of the one
stale pattern (``fsutil.replace_dir``), so the next reader or writer of the path puts it back; a
writer killed after the second rename leaves the old one to be removed next time."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from taxmodel import fsutil
from taxmodel.errors import InputError
from taxmodel.testing.synthetic import synthetic_bundle
from taxmodel.trace.bundle import load_bundle, write_bundle

SHAPE = {"M": 1024, "N": 256, "K": 512}

# The child replaces the bundle at TARGET with SOURCE's and kills itself (SIGKILL: no cleanup
# runs) at the moment named by WHEN: "between" the two renames, or "after" them, before the
# old version is removed.
CHILD = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from taxmodel.trace.bundle import load_bundle, write_bundle

    source, target, when = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    real_replace, real_rmtree = os.replace, shutil.rmtree
    if when == "between":  # the new bundle's rename into place never happens
        os.replace = lambda a, b, **k: die() if Path(b) == target else real_replace(a, b, **k)
    else:  # the old bundle's removal never happens
        shutil.rmtree = lambda p, *a, **k: die() if "-OLD" in Path(p).name else real_rmtree(p, *a, **k)
    b = load_bundle(source)
    write_bundle(target, b.events, b.meta, overwrite=True)
    sys.exit("not killed")
""")


@pytest.fixture
def bundles(tmp_path):
    """(the bundle at the target, variant bsp; the one replacing it, variant fused)."""
    made = {}
    for variant in ("bsp", "fused"):
        case = synthetic_bundle(variant=variant, workload="ag_gemm", shape=SHAPE)
        made[variant] = write_bundle(tmp_path / "src" / variant, case.bundle.events, case.bundle.meta)
    target = write_bundle(tmp_path / "runs" / "b", load_bundle(made["bsp"]).events, load_bundle(made["bsp"]).meta)
    return target, made["fused"]


def _kill_while_replacing(target: Path, source: Path, when: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(source), str(target), when], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]


def _hidden(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith("."))


def test_a_writer_killed_between_the_renames_leaves_the_old_bundle_to_be_put_back(bundles):
    target, source = bundles
    _kill_while_replacing(target, source, "between")
    assert not target.exists()  # the moment the kill left behind: the old bundle aside, the new one whole
    hidden = _hidden(target)
    assert len(hidden) == 2 and all(fsutil._STALE.match(n) for n in hidden), hidden
    assert sum("-OLD" in n for n in hidden) == 1
    # A reader finds the old bundle where the user left it; the killed writer's new one is gone.
    assert load_bundle(target).meta["variant"] == "bsp"
    assert _hidden(target) == []


def test_the_next_write_puts_the_old_bundle_back_before_deciding(bundles):
    target, source = bundles
    _kill_while_replacing(target, source, "between")
    b = load_bundle(source)
    with pytest.raises(InputError, match="a bundle already exists there; pass --force"):
        write_bundle(target, b.events, b.meta, overwrite=False)  # not written over without --force
    assert load_bundle(target).meta["variant"] == "bsp" and _hidden(target) == []


def test_a_writer_killed_after_the_renames_leaves_the_old_bundle_to_be_removed(bundles):
    target, source = bundles
    _kill_while_replacing(target, source, "after")
    assert load_bundle(target).meta["variant"] == "fused"  # the new bundle is in place
    old = [n for n in _hidden(target) if "-OLD" in n]
    assert len(old) == 1
    removed = fsutil.clean_stale_temps(target)
    assert [p.name for p in removed] == old and _hidden(target) == []
    assert load_bundle(target).meta["variant"] == "fused"


def test_a_live_writers_old_bundle_is_left_alone(tmp_path):
    target = tmp_path / "b"
    aside = tmp_path / f"{fsutil.temp_prefix(target)}{fsutil.OLD_TAG}0123abcd{fsutil.TMP_SUFFIX}"  # this pid: alive
    aside.mkdir()
    assert fsutil.clean_stale_temps(target) == [] and aside.is_dir() and not target.exists()


def test_replace_dir_swaps_and_undoes_a_failed_swap(tmp_path, monkeypatch):
    target, new = tmp_path / "t", tmp_path / "n"
    target.mkdir()
    (target / "v").write_text("old")
    new.mkdir()
    (new / "v").write_text("new")
    real = os.replace

    def failing(a, b, **k):
        if Path(b) == target:
            raise OSError(28, "No space left on device")
        return real(a, b, **k)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError):
        fsutil.replace_dir(new, target)
    assert (target / "v").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["n", "t"]
    monkeypatch.setattr(os, "replace", real)
    fsutil.replace_dir(new, target)
    assert (target / "v").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["t"]
