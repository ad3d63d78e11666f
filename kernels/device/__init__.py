"""taxmodel's device library: the Triton device functions every fine-grained kernel shares, and
their small host side. Use it from your own ``@triton.jit`` kernels the way the built-in ones do
(``from taxmodel.kernels.device import sync, trace``); peer loads and stores themselves are Iris's
(``iris.load/store/atomic_*`` with a ``heap_bases`` table).

``sync``: flags between ranks, every wait bounded in time.
    Device: ``now(MODE)``, ``wait_geq(flag_ptr, target, budget, err_ptr, rank, peer, flag_index,
    kernel_id, MODE)``, ``signal`` / ``signal_add`` (release to a peer's heap), ``signal_local``,
    ``fence_tma_after_acquire``.
    Host: ``sync_mode(device)`` (the ``MODE`` constexpr), ``spin_budget(seconds, mode)``,
    ``new_error_buffer(device)`` and ``check_errors(err, kernel_name, ctx)`` (a wait that gave up
    becomes a ``RunError`` naming the rank, peer and flag), ``interpreting()``.

``trace``: in-kernel trace records (what a CTA did when: flag waits, remote loads, compute, pushes).
    Device: ``begin(INSTRUMENT, MODE)`` and ``mark(rec_ptr, cta, phase, t, INSTRUMENT, MODE)`` with
    the phases ``FLAG_WAIT``, ``REMOTE_LOAD``, ``COMPUTE``, ``STORE_PUSH``, ``COMBINE``; with
    ``INSTRUMENT`` false both compile to nothing.
    Host: ``RecordLayout`` (the buffer's shape), ``record_pointer`` and ``instrument_code`` (the
    launch arguments); the runtime allocates and drains the buffers (``RankContext.record_buffer``).

``gate``: ``DeviceGate``, a device-side barrier that releases every rank's GPU at once before a
    traced step (``taxmodel profile --align device``).

``epochs``: a kernel's launch count in device memory, one slot per program (graph replays).
    Device: ``launch_epoch(slots_ptr, pid)`` (this launch's epoch) and ``publish_epoch(slots_ptr,
    pid, epoch)`` (the program's last step). Host: ``new_epoch_slots(device)`` and
    ``check_grid(slots, grid, kernel)`` (every launch on one slots buffer with the same grid).
"""
from . import sync, trace, gate, epochs  # noqa: F401  (sync first: the others use it)

__all__ = ["sync", "trace", "gate", "epochs"]
