"""The shipped H200 calibration file, as the calibrate tests start from it."""
from __future__ import annotations

import json
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "taxmodel" / "data" / "hardware" / "h200-calibrated.json"


def shipped_four_ranks() -> dict:
    """The shipped H200 calibration as its 4-rank run wrote it: without the curves and raw rows of
    other world sizes (``collectives_by_world``, ``measured.raw.collectives_at``) that later
    ``--update -n W`` runs added, so these tests do not depend on which ones the file has."""
    spec = json.loads(SHIPPED.read_text())
    spec.pop("collectives_by_world", None)
    spec["measured"]["raw"].pop("collectives_at", None)
    return spec
