"""Built-in workloads, installed as ``taxmodel.kernels``. Importing this package registers them."""

from . import ag_gemm  # noqa: F401  (registers "ag_gemm")
from . import flash_decode  # noqa: F401  (registers "flash_decode")
from . import gemm_rs  # noqa: F401  (registers "gemm_rs")
