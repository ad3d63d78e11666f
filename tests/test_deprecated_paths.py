"""The import paths that moved with the ledger's own package (issue 41) still work for the code
users wrote against them (docs/ledger.md and scripts named ``taxmodel.model.ledger``,
docs/hardware.md ``taxmodel/model/hardware.py``), and each name they hand on says where it lives now."""
from __future__ import annotations

import pytest


def test_the_old_ledger_path_hands_on_the_ledger_with_a_warning():
    import taxmodel.ledger as ledger
    from taxmodel.ledger import compute

    with pytest.warns(DeprecationWarning, match="taxmodel.model.ledger is deprecated: import compute_ledger from taxmodel.ledger"):
        from taxmodel.model.ledger import compute_ledger
    with pytest.warns(DeprecationWarning, match="Ledger from taxmodel.ledger.result"):
        from taxmodel.model.ledger import Ledger
    assert compute_ledger is compute.compute_ledger is ledger.compute_ledger
    assert Ledger is ledger.Ledger
    with pytest.raises(ImportError):
        from taxmodel.model.ledger import rank_ledger  # noqa: F401  (never a public name there)


def test_the_old_hardware_path_hands_on_the_specs_with_a_warning():
    from taxmodel.hardware import specs

    with pytest.warns(DeprecationWarning, match="import resolve_hardware from taxmodel.hardware.specs"):
        from taxmodel.model.hardware import resolve_hardware
    assert resolve_hardware is specs.resolve_hardware
    with pytest.raises(ImportError):
        from taxmodel.model.hardware import nope  # noqa: F401
