"""A stand-in graph backend for CPU tests of ``taxmodel profile --graph`` (no CUDA here).

Passed to the worker as a ``--workload-module`` so that every rank registers it; selected with
``ProfileRequest(graph_backend="fake")``. "Capture" keeps the step without running it (as CUDA
does) and a replay calls it again, so the record pointer a kernel reads at launch is the one the
harness installed before the capture, like a graph's frozen argument. The environment variable
``TAXMODEL_FAKE_GRAPH_FAIL_RANK`` makes the capture fail on that rank.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from taxmodel.runtime.graph import GraphBackend, register_backend

FAIL_RANK_ENV = "TAXMODEL_FAKE_GRAPH_FAIL_RANK"


class FakeGraph:
    def __init__(self, step: Callable[[], None]) -> None:
        self.step = step
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.step()

    def reset(self) -> None:
        self.step = None


@register_backend
class FakeGraphBackend(GraphBackend):
    name = "fake"

    def unavailable_reason(self) -> str | None:
        return None

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        yield

    def capture(self, step: Callable[[], None]) -> Any:
        import torch.distributed as dist

        if os.environ.get(FAIL_RANK_ENV) == str(dist.get_rank()):
            raise RuntimeError("operation not permitted when stream is capturing (fake)")
        return FakeGraph(step)

    def synchronize(self) -> None:
        pass
