"""Flash Decode: sequence-parallel decode attention, bulk-synchronous (``bsp``) and fine-grained
(``fused``). Importing this package registers the ``flash_decode`` workload."""
from taxmodel.kernels.flash_decode.workload import FlashDecode, FlashDecodeState, kv_lengths

__all__ = ["FlashDecode", "FlashDecodeState", "kv_lengths"]
