"""Write in-kernel records into a record buffer from the host, word for word as
``kernels/device/trace.py::mark`` does (for tests of the drain with chosen times)."""
from __future__ import annotations

import torch

from taxmodel.kernels.device import trace

_START_MASK = (1 << trace.CLOCK_BITS) - 1


def write_records(buf: torch.Tensor, rows) -> None:
    """Append ``rows`` (cta, phase name, start, end) as the kernels would: fixed slots (a CTA's
    next free slot; past its slots or the buffer dropped and counted in word 0) or, in append
    mode, the cursor's next slot. Starts keep their low 48 bits, ends are stored whole."""
    ctas, per_cta, append = (int(buf[w]) for w in (trace.CTAS_WORD, trace.PER_CTA_WORD, trace.APPEND_WORD))
    slots = buf[trace.HEADER:].view(-1, trace.RECORD_WORDS)
    for cta, phase, start, end in rows:
        if append:
            slot = int(buf[trace.DROPPED_WORD])
            buf[trace.DROPPED_WORD] += 1
            ok = slot < ctas * per_cta
        else:
            ok = 0 <= cta < ctas
            k = int((slots[cta * per_cta:(cta + 1) * per_cta, 1] != 0).sum()) if ok else 0
            slot = cta * per_cta + k
            ok = ok and k < per_cta
            if not ok:
                buf[trace.DROPPED_WORD] += 1
        if ok:
            slots[slot] = torch.tensor([cta, trace.PHASE_ID[phase] + 1, start & _START_MASK, end])
