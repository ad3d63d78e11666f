"""Thread-ranks and Triton's interpreter: kernel source rewrites run one thread at a time."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from taxmodel.runtime.context import _serialize_rewrites


def test_two_threads_never_rewrite_a_kernel_at_the_same_time():
    """The interpreter's first call of a kernel parses and compiles its source; CPython 3.11's AST
    state is shared between threads, so the rewrites must not overlap."""
    inside, overlaps = [0], []

    class Rewriter:
        def rewrite_ast(self):
            inside[0] += 1
            overlaps.append(inside[0])
            time.sleep(0.02)
            inside[0] -= 1
            return "rewritten"

    interp = SimpleNamespace(FunctionRewriter=Rewriter)
    _serialize_rewrites(interp)
    out = []
    threads = [threading.Thread(target=lambda: out.append(Rewriter().rewrite_ast())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == ["rewritten"] * 4 and max(overlaps) == 1
    _serialize_rewrites(SimpleNamespace())  # an interpreter without the class: nothing to do
