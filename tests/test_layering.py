"""The package's layering, read from the source: every import goes down the layer order below (or
stays inside its own package), and no two modules import each other, directly or around a circle.

Layers, bottom to top (a module may import its own package and any package in a lower layer):

0. ``errors``: the typed errors everything raises.
1. ``version``, ``fsutil``, ``safetext``, ``limits``, ``workload``, ``vocabulary``: the package
   version, file-system helpers, how names from traces are shown safely, the one size budget of
   inputs, the workload protocol (``Cost``, ``Variant``, ``Workload``, the registry) that the
   built-in kernels implement and the capture and the model read, and the names other libraries'
   kernels have in traces with the roles they play (collectives, vendor GEMMs, copies), which the
   kernels declare their roles with and the importers classify by.
2. ``kernels``: the built-in workloads and their Triton device library. They get everything from
   the runtime (heap, record buffers) through the ``RankContext`` they are handed, so they import
   nothing above the protocol; the model imports them for the plans the kernels really run (tile
   and split choices) and their kernel names.
3. ``trace``: events in (schema, bundles, capture, importers).
4. ``hardware``: the GPUs' numbers (specs, presets, estimates) that both the ledger and the model
   divide by; it reads the trace's field checkers and nothing above.
5. ``ledger``: events -> the measured ledger (plan, per-rank sweep, assembly, windows, clocks,
   per-kernel floors, Dask).
6. ``model``: the analytic model, calibration fits, validation and fusion advice; it builds
   ledgers of predicted timelines and reads measured ones, so it sits above the ledger.
7. ``report``, ``regress``, ``runtime``, ``testing``: the ledger's readers, and the runtime, which
   starts the data flow (it runs a workload, captures its trace, fits a calibration) and so sits
   above everything it drives; none of the four imports another.
8. ``api``: the Python entry points.
9. ``cli`` and the package root (which exports the api); 10. ``__main__`` (``python -m taxmodel``).

The data flow ``runtime -> trace -> ledger/model -> report/regress`` (the README's) is the order in which data
moves; imports point from the module that drives a step to the modules it uses, so nothing below
ever reaches back up to the runtime or the report.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("version", "fsutil", "safetext", "limits", "workload", "vocabulary"),
    ("kernels",),
    ("trace",),
    ("hardware",),
    ("ledger",),
    ("model",),
    ("report", "regress", "runtime", "testing"),
    ("api",),
    ("cli", "<root>"),
    ("__main__",),
)
LAYER_OF = {pkg: i for i, pkgs in enumerate(LAYERS) for pkg in pkgs}


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for ``taxmodel/`` and ``kernels/`` (installed as ``taxmodel.kernels``)."""
    files = {}
    for top in ("taxmodel", "kernels"):
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[0] == "kernels":
                parts = ["taxmodel"] + parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def _canonical(name: str) -> str:
    return "taxmodel." + name if name == "kernels" or name.startswith("kernels.") else name


def _resolve(name: str, files: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` (a module or a name inside one) lives in, else None."""
    name = _canonical(name)
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (at any depth of the file: lazy imports count)."""
    files = _module_files()
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # "from pkg import sub" imports the submodule when there is one, else a name of pkg
                names = [f"{base}.{a.name}" if _canonical(f"{base}.{a.name}") in files else base
                         for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("taxmodel", "kernels"):
                    target = _resolve(name, files)
                    if target and target != mod:
                        graph[mod].add(target)
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def test_every_package_has_a_layer() -> None:
    unknown = {package_of(m) for m in _module_files()} - set(LAYER_OF)
    assert not unknown, f"place {sorted(unknown)} in tests/test_layering.py's LAYERS (and say why there)"


def test_imports_go_down_the_layers() -> None:
    upward = []
    for mod, targets in import_graph().items():
        src = package_of(mod)
        for target in targets:
            dst = package_of(target)
            if dst != src and LAYER_OF.get(dst, -1) >= LAYER_OF.get(src, -1):
                upward.append(f"{mod} -> {target}")
    assert not upward, "imports that reach up (or sideways) the layers:\n" + "\n".join(sorted(upward))


def test_no_import_circles() -> None:
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not circles, "modules that import each other (around a circle):\n" + "\n".join(map(str, circles))


def test_the_checker_sees_imports() -> None:
    """The scan is not vacuous: it finds the edges every layer is known to have."""
    graph = import_graph()
    assert "taxmodel.trace.schema" in graph["taxmodel.ledger.sweep"]
    assert "taxmodel.workload" in graph["taxmodel.kernels.ag_gemm.workload"]
    assert "taxmodel.kernels.ag_gemm.state" in graph["taxmodel.kernels.ag_gemm.push"]  # a relative import
    assert "taxmodel.report.blocks" in graph["taxmodel.report.document"]
    assert "taxmodel.kernels.device.sync" in graph["taxmodel.kernels.device.gate"]  # "from package import module"
