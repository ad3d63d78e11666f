"""The cost model, in two halves that share only the hardware numbers and the ledger's categories.

**The measured ledger** (events in, taxes out; docs/ledger.md): ``ledger`` splits every rank's
iteration window exactly into useful work, compute inefficiency, the three taxes and what is left,
with the pieces it is built from: ``categories`` (the names and their order), ``clock`` (aligning
the ranks' clocks), ``windows`` (iteration windows when the trace has no clean markers),
``collectives`` (the same collective across ranks), ``intervals`` (vectorized interval arithmetic),
``stream_waits`` (idle that is a wait on another stream), ``kernel_costs`` and ``ledger_kernels``
(per-kernel roofline floors and locality), ``coverage`` (what missing ranks make unknowable).

**The analytic model** (shapes and hardware in, predicted taxes out; docs/model.md): ``analytic/``
predicts a workload's timeline and ledger; ``calibration`` fits measurements into a hardware file;
``cases``, ``fitting``, ``validate`` and ``validation_markdown`` check the predictions against
measured ledgers and fit the model's free parameters on a documented subset; ``scaling`` compares
world sizes.

Both: ``hardware`` (peaks, bandwidths, calibrated curves) and ``advise`` / ``advise_predict``
(fusion candidates: the ledger's taxes on their boundaries, the analytic model's predicted saving).

The two halves are one package for now; moving the ledger's modules into a sub-package of their
own is a mechanical change left for when nobody else is editing them.
"""
