"""Ahead-of-time compilation of our Triton kernels for sm_90 without a GPU, shared by the
``test_*_compile.py`` files: a kernel that runs in Triton's interpreter can still fail to compile
(last seen: "CompilationError at 7:4" on the GPU machine), and the compiled code is where spills,
shared-memory use, TMA/MMA instructions and system-scope fences can be checked.

Compilation runs in a subprocess (the test session imports the kernels under
``TRITON_INTERPRET=1``): the caller's script is appended to ``PRELUDE``, which defines
``build(fn, args, consts, num_warps, num_stages, tag)``. Arguments are specialized as a real
launch specializes them (16-byte-aligned pointers, integers divisible by 16 marked so, 1 folded).
``build`` counts the regexes of the script's ``PATTERNS`` (name -> regex, on the PTX) and
``BODY_PATTERNS`` (on the kernel's TTIR body, after its signature line) and returns them with the
register, spill and shared-memory use. The script prints one JSON line, its last.

``TAXMODEL_COMPILE_TRITON_PATHS`` (os.pathsep-separated directories, each holding another Triton,
e.g. ``pip install --target DIR triton==3.6.0``, the GPU machines' version) adds one run per
directory with that Triton first on the path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PRELUDE = r'''
import json, os, re, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)
OUT = sys.argv[1]
PATTERNS, BODY_PATTERNS = {}, {}

def build(fn, args, consts, num_warps, num_stages, tag):
    sig, attrs, constexprs = {}, {}, dict(consts)
    for name, ty, val in args:
        i = fn.arg_names.index(name)
        if ty == "none":
            sig[name], constexprs[name] = "constexpr", None
        elif ty.startswith("*"):
            sig[name], attrs[(i,)] = ty, [["tt.divisibility", 16]]
        elif ty.startswith("tensordesc"):
            sig[name] = ty
        elif ty in ("i32", "i64") and val == 1:
            sig[name], constexprs[name] = "constexpr", 1
        else:
            sig[name] = ty
            if ty in ("i32", "i64") and val % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for k in consts:
        sig[k] = "constexpr"
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs), target=TARGET,
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    cubin = os.path.join(OUT, tag + ".cubin")
    with open(cubin, "wb") as f:
        f.write(k.asm["cubin"])
    res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin], capture_output=True, text=True).stdout
    usage = dict(re.findall(r"(REG|LOCAL|SHARED):(\d+)", res))
    ptx, ttir = k.asm["ptx"], k.asm["ttir"]
    body = ttir.split("tt.func public @" + fn.__name__, 1)[1].partition("\n")[2]
    out = dict(regs=int(usage.get("REG", -1)), local=int(usage.get("LOCAL", -1)), shared=k.metadata.shared)
    out.update({name: len(re.findall(pat, ptx)) for name, pat in PATTERNS.items()})
    out.update({name: len(re.findall(pat, body)) for name, pat in BODY_PATTERNS.items()})
    return out
'''


def tools_present(triton_dir: Path) -> bool:
    base = triton_dir / "backends" / "nvidia" / "bin"
    return (base / "cuobjdump").exists() and (base / "ptxas").exists()


def tritons() -> list[str]:
    """"local" (this interpreter's Triton) plus the directories of TAXMODEL_COMPILE_TRITON_PATHS."""
    extra = [p for p in os.environ.get("TAXMODEL_COMPILE_TRITON_PATHS", "").split(os.pathsep) if p]
    return ["local"] + extra


def compile_report(script: str, tmp_path_factory, triton_path: str = "local", timeout: float = 600) -> dict:
    """Run ``PRELUDE + script`` in a subprocess with the chosen Triton; its last output line as JSON.
    Skips when that Triton has no NVIDIA backend tools (ptxas, cuobjdump)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    if triton_path == "local":
        import triton

        if not tools_present(Path(triton.__file__).parent):
            pytest.skip("Triton's NVIDIA backend tools (ptxas, cuobjdump) are not installed")
    else:
        if not tools_present(Path(triton_path) / "triton"):
            pytest.skip(f"no Triton with NVIDIA backend tools under {triton_path}")
        # That Triton first; our kernel modules (and torch, iris) from this interpreter's paths.
        env["PYTHONPATH"] = os.pathsep.join([triton_path, str(REPO)]
                                            + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = tmp_path_factory.mktemp("cubins")
    proc = subprocess.run([sys.executable, "-c", PRELUDE + script, str(out)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: Shared memory one H100/H200 SM offers a CTA (bytes).
SM90_SHARED_BYTES = 227 * 1024


def assert_fits_an_sm(report: dict, kernel: str) -> None:
    """No register spills (local memory), a register count a CTA can have, shared memory that fits."""
    r = report[kernel]
    assert r["local"] == 0, f"{kernel} spills registers: {r} (triton {report.get('triton', 'local')})"
    assert 0 < r["regs"] <= 255, r
    assert r["shared"] <= SM90_SHARED_BYTES, r
