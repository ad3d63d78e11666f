"""Built-in workloads, installed as ``taxmodel.kernels``: one package per workload (``BUILTIN``),
the device library their kernels share (``device``), and the kernels' names (``names``).

Importing this package imports no workload (so ``names`` costs nothing to import);
``taxmodel.workload.load_builtin_workloads`` imports the ``BUILTIN`` packages, which registers them.
"""

BUILTIN = ("ag_gemm", "flash_decode", "gemm_rs")
