"""The GPUs' numbers that both the measured ledger and the analytic model divide by (docs/hardware.md).

``specs`` is the hardware spec (peaks per dtype, HBM, peer and host links, latencies, SMs, L2),
the presets shipped under ``taxmodel/data/hardware/`` and how a trace's device, a key, a name or a
file resolves to one; ``estimate`` makes a spec for a GPU without a preset from its relatives;
``gpu_names`` is how GPU names are compared.

Its own package, below both readers: the ledger's per-kernel floors and the model's predictions
and calibration fits read the same specs, and neither owns them.
"""
