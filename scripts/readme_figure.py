"""Regenerate the README's figures from the committed H200 bundles (run from the repository root):

- docs/img/flash_decode_h200x4.png: Flash Decode, eager captures (`profiles/h200x4/flash_decode`),
  batch 1 and KV 1K;
- docs/img/ag_gemm_graph_h200x4.png: AG+GEMM captured as CUDA graphs (`profiles/h200x4-graph/ag_gemm`),
  M=1024 and 8192.
"""
import matplotlib

matplotlib.use("Agg")

from taxmodel.ledger.compute import compute_ledger  # noqa: E402
from taxmodel.report import figures  # noqa: E402
from taxmodel.trace.bundle import find_bundles, load_bundle  # noqa: E402


def ledgers(root: str, keep) -> list:
    return [compute_ledger(load_bundle(p)) for p in find_bundles(root) if keep(p.name)]


fig = figures.ledger_bars(ledgers("profiles/h200x4/flash_decode", lambda n: "batch1x" in n or "kv_len1024x" in n),
                          title="Flash Decode on 4x H200 (torch.profiler, eager launches, bf16, 32 q heads, 8:1 GQA)")
fig.savefig("docs/img/flash_decode_h200x4.png", dpi=110)

fig = figures.ledger_bars(ledgers("profiles/h200x4-graph/ag_gemm", lambda n: "M1024x" in n or "M8192x" in n),
                          title="All-Gather+GEMM on 4x H200, one CUDA graph per iteration (N=K=8192, bf16)")
fig.savefig("docs/img/ag_gemm_graph_h200x4.png", dpi=110)
