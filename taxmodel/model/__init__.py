"""The analytic model (shapes and hardware in, predicted taxes out; docs/model.md), and what checks
it against measurements and puts it to use.

``analytic/`` predicts a workload's timeline and builds its ledger with the measured ledger's own
code (``taxmodel.ledger``), so a predicted tax means what a measured one means; ``calibration``
fits ``taxmodel calibrate``'s measurements into a hardware file (``taxmodel.hardware``);
``cases``, ``case_store``, ``fitting``, ``validate`` and ``validation_markdown`` check the
predictions against measured ledgers and fit the model's free parameters on a documented subset;
``scaling`` compares world sizes; ``advise`` / ``advise_regions`` / ``advise_predict`` list fusion
candidates (the measured ledger's taxes on their boundaries, the analytic model's predicted saving).

The measured ledger is the package ``taxmodel.ledger`` and the hardware specs ``taxmodel.hardware``;
``ledger`` and ``hardware`` here only hand their old names on, with a DeprecationWarning.
"""
