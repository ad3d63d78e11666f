"""The worker's counters pass (``taxmodel profile --counters``'s second run): one step per variant,
nothing traced, no bundle written; the same spec otherwise (taxmodel/runtime/counters.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from taxmodel.runtime.profile import ProfileRequest, build_spec

TOY = str(Path(__file__).with_name("toy_workload.py"))


def test_a_counters_pass_runs_every_variant_once_and_writes_no_bundle(tmp_path):
    spec, world, device = build_spec(ProfileRequest(workload="toy", workload_modules=[TOY], device="cpu", world_size=1,
                                                    iterations=1, warmup=1, variants=["bsp"], out=str(tmp_path / "out")))
    spec.update(counters_pass=True, progress=False)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TRITON_INTERPRET="1")
    env.pop("MASTER_ADDR", None)
    r = subprocess.run([sys.executable, "-m", "taxmodel.runtime.worker", "--spec", str(tmp_path / "spec.json")],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("meta.json"))
