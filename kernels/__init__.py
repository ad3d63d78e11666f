"""Built-in workloads, installed as ``taxmodel.kernels``. Importing this package registers them."""
