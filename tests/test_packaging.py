"""The distribution installs `kernels/` as `taxmodel.kernels` and nothing under a generic name."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]


def _declared_packages() -> set[str]:
    if tomllib is None:
        pytest.skip("tomllib needs python >= 3.11")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def _package_dirs() -> set[str]:
    found = set()
    for base, prefix in ((ROOT / "taxmodel", "taxmodel"), (ROOT / "kernels", "taxmodel.kernels")):
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join((prefix, *rel.parts)) if rel.parts else prefix)
    return found


def test_every_package_folder_is_declared():
    missing = _package_dirs() - _declared_packages()
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_declared_packages_exist():
    stale = _declared_packages() - _package_dirs()
    assert not stale, f"pyproject.toml lists packages with no folder: {sorted(stale)}"


def test_built_wheel_maps_kernels_under_taxmodel(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("taxmodel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"taxmodel", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    assert "taxmodel/kernels/__init__.py" in names
    assert not any(n.startswith("kernels/") for n in names)
