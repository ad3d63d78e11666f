"""Regenerate docs/img/flash_decode_h200x4.png (the README's figure) from the committed H200 bundles."""
import matplotlib

matplotlib.use("Agg")

from taxmodel.model.ledger import compute_ledger  # noqa: E402
from taxmodel.report import figures  # noqa: E402
from taxmodel.trace.bundle import find_bundles, load_bundle  # noqa: E402

paths = [p for p in find_bundles("profiles/h200x4/flash_decode") if "batch1x" in p.name or "kv_len1024x" in p.name]
fig = figures.ledger_bars([compute_ledger(load_bundle(p)) for p in paths],
                          title="Flash Decode on 4x H200 (torch.profiler, bf16, 32 q heads, 8:1 GQA)")
fig.savefig("docs/img/flash_decode_h200x4.png", dpi=110)
