"""What a bundle's ``meta.capture`` says about how it was captured, read and written in one place:
the capture runtime writes these fields, the model reads them back to predict the same capture.

How traced steps start (``taxmodel profile --align``):

- ``host``: each step starts after a host barrier; ranks start as skewed as their hosts leave it.
- ``device``: also behind a device gate (``kernels/device/gate.py``) that releases every rank's GPU
  together; ``capture.gate_hold_us`` says how long it held the GPUs after the last arrival.
- ``back-to-back`` (the default on GPUs): the gate releases the ranks together once per repetition,
  and the repetition's steps then run back to back on every GPU, queued behind it, with no host
  barrier between them, as a decode or training loop (and an un-profiled CUDA-graph benchmark) runs
  them. A step then starts warm (caches, clocks, the previous step's tail) instead of out of an idle
  GPU, and the ranks stay in the lock step the workload's own synchronization keeps. The gate holds
  ``gate_hold_us`` per step of the repetition, so every host has enqueued all of them first.

No heavy imports: the command line builds its choices from this module, and the model reads the
same values back from bundles (``ModelParams.start_alignment``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from taxmodel.kernels.names import GATE_KERNEL
from taxmodel.kernels.revisions import KERNEL_REVISION, revision_at
from taxmodel.trace.ints import whole

START_ALIGNMENTS = ("host", "device", "back-to-back")
#: Alignments whose steps start behind the device gate (each step, or each repetition's first).
GATED_ALIGNMENTS = ("device", "back-to-back")
#: ``--align auto``: back-to-back steps where there are GPUs (what an un-profiled benchmark of the same
#: step measures; issue 33: host-aligned short steps measured 1.4-6x the benchmark on 4 H100s), the host
#: barrier on the CPU (the interpreter's ranks have no device clock worth aligning).
AUTO_ALIGN = "auto"


def default_alignment(device: str) -> str:
    """What ``--align auto`` means on ``device`` ("cuda" or "cpu")."""
    return "host" if str(device) == "cpu" else "back-to-back"
#: Default hold of the device gate (us): under the profiler a rank's host needs 60-100 us from the
#: gate to its graph launch (2x H200), so every host has enqueued its step before its GPU starts.
DEFAULT_GATE_HOLD_US = 250.0
#: The device gate's kernel in traces: harness work between steps, not the workload's.
GATE_ROLES = {GATE_KERNEL: "other"}


#: How the device gate (kernels/device/gate.py) signals its arrival: to every rank's counter at once.
#: Bundles without ``capture.gate_signals`` were gated by the earlier kernel, whose adds went one
#: after another (on 4 H200s the ranks started ~0, 1 and 2 us apart; on 2, within ~0.6 us).
GATE_SIGNALS = "parallel"


#: What every reading of a CPU run says first: its times are the interpreter's.
CPU_RUN_CAVEAT = ("CPU run: the kernels ran in Triton's interpreter on emulated GPUs, so these are interpreter times, "
                  "not GPU times; they say nothing about how the variants compare on a GPU (profile on GPUs for that)")


def emulated_gpu(meta: Mapping[str, Any] | None) -> bool:
    """Whether a bundle is a CPU run (``taxmodel profile --device cpu``: Triton's interpreter, gloo),
    as its meta says (``capture.emulated_gpu`` or ``hardware.emulated``)."""
    meta = meta or {}
    capture, hardware = meta.get("capture"), meta.get("hardware")
    return bool((isinstance(capture, Mapping) and capture.get("emulated_gpu"))
                or (isinstance(hardware, Mapping) and hardware.get("emulated")))


def graph_meta(graph: bool, requested: str, note: str | None, backend: str) -> Mapping[str, Any]:
    """The bundle's ``meta['capture']`` fields about CUDA/HIP graphs: whether the traced steps
    replayed one (``graph``, what ``CaptureSettings.graph_launch`` reads back), what was asked,
    which backend captured it, and why not when it was asked and not done."""
    return {"graph": bool(graph), "graph_mode": requested, "graph_backend": backend if graph else None,
            "graph_note": None if graph or requested == "off" else note}


def gate_hold_for(align: str, per_step_us: float, steps: int) -> float:
    """The device gate's hold (us) for a capture aligned this way: ``per_step_us`` before every
    step (``device``), or that much for each of the repetition's ``steps`` before its first one
    (``back-to-back``: every host enqueues all of them before its GPU starts); 0 without a gate."""
    if align == "back-to-back":
        return float(per_step_us) * max(int(steps), 1)
    return float(per_step_us) if align == "device" else 0.0


def alignment_meta(align: str, gate_hold_us: float) -> dict[str, Any]:
    """``meta.capture`` fields of a capture aligned this way (what the model needs to predict the
    ranks' start skew of the bundle); ``gate_hold_us``: the hold the gate used (``gate_hold_for``)."""
    out: dict[str, Any] = {"align": str(align)}
    if align in GATED_ALIGNMENTS:
        out["gate_hold_us"] = float(gate_hold_us)
        out["gate_signals"] = GATE_SIGNALS
    return out


def kernel_revision(meta: Mapping[str, Any]) -> int:
    """The kernels' revision a bundle ran: ``meta.capture.kernel_revision`` where the capture wrote
    it, else the one current at its capture time (``meta.created``; ``kernels/revisions.py``)."""
    capture = meta.get("capture")
    recorded = whole(capture.get("kernel_revision")) if isinstance(capture, Mapping) else None
    return recorded if recorded is not None and recorded >= 1 else revision_at(meta.get("created"))


def unprofiled_step_ns(meta: Mapping[str, Any]) -> float | None:
    """The bundle's step timed with nothing traced, as a benchmark runs it (``meta.capture.replay_step_us``
    where ``capture.replay_method`` says how it was measured), in ns; None without one. Bundles from
    before that key timed one graph launch per step (the host's launch rate at short steps): not
    comparable, so not returned."""
    capture = meta.get("capture")
    if not isinstance(capture, Mapping) or not capture.get("replay_method"):
        return None
    value = capture.get("replay_step_us")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        return None
    return float(value) * 1e3


def read_alignment(capture: Mapping[str, Any]) -> tuple[str, float | None]:
    """(align, gate hold in seconds or None) of a bundle's ``meta.capture`` (older bundles: host)."""
    hold = capture.get("gate_hold_us")
    return str(capture.get("align") or "host"), float(hold) * 1e-6 if hold is not None else None


@dataclass(frozen=True)
class CaptureSettings:
    """How a bundle's iterations ran, as far as the analytic model must know to predict that same
    capture: in-kernel records on, one CUDA graph per iteration, the AG+GEMM transport, and how
    the ranks' steps started."""

    instrumented: bool = False
    graph_launch: bool | None = None  # None: the model's default for the variant
    transport: str | None = None  # AG+GEMM fine-grained transport; None: the default (copy engines)
    align: str = "host"
    gate_hold_s: float | None = None
    #: the built-in kernels' revision the bundle ran (``kernels/revisions.py``)
    kernel_revision: int = KERNEL_REVISION

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], instrumented: bool = False) -> "CaptureSettings":
        """The settings a bundle recorded (``instrumented``: whether its events hold in-kernel records)."""
        capture = meta.get("capture") or {}
        config = meta.get("workload_config") or {}
        capture = capture if isinstance(capture, Mapping) else {}
        config = config if isinstance(config, Mapping) else {}
        align, hold = read_alignment(capture)
        transport = config.get("transport")
        return cls(instrumented=bool(instrumented), graph_launch=bool(capture.get("graph")),
                   transport=str(transport) if transport else None, align=align, gate_hold_s=hold,
                   kernel_revision=kernel_revision(meta))
