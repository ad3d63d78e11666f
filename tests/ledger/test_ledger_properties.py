"""Property tests: on random traces the ledger partitions every (rank, iteration) window exactly,
every part is non-negative, and the intervals add up to the parts."""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace.bundle import Bundle, make_meta
from taxmodel.trace.schema import normalize_events
from taxmodel.testing.synthetic import synthetic_bundle

ROLES = ["compute", "comm", "fused", "copy", "other"]


def random_bundle(seed: int, n_ranks: int, n_iter: int, per_iter: int) -> Bundle:
    """Kernels with random roles, streams, overlaps and gaps; complete collectives; launches for
    most kernels; host syncs; flag_wait records inside fused kernels."""
    rng = np.random.default_rng(seed)
    rows = []
    corr = 0
    for r in range(n_ranks):
        t = int(rng.integers(0, 5000))
        for it in range(n_iter):
            for j in range(per_iter):
                corr += 1
                role = ROLES[int(rng.integers(0, len(ROLES)))]
                start = t + int(rng.integers(-2000, 4000))  # may overlap the previous kernel
                d = int(rng.integers(1, 8000))
                rows.append(dict(rank=r, stream=int(rng.integers(0, 3)), kind="kernel", role=role, name=f"k{j % 4}_{role}",
                                 start_ns=start, end_ns=start + d, correlation=corr, iteration=it,
                                 collective_id=f"{j % 2}:{it * per_iter + j}" if role == "comm" else ""))
                if rng.random() < 0.8:
                    le = start + int(rng.integers(-6000, 1000))
                    rows.append(dict(rank=r, stream=1, kind="launch", role="other", name="cudaLaunchKernel",
                                     start_ns=le - 500, end_ns=le, correlation=corr, iteration=it))
                if role == "fused":
                    for cta in range(int(rng.integers(1, 4))):
                        a = start + int(rng.integers(0, d))
                        rows.append(dict(rank=r, kind="record", role="fused", name="f", start_ns=a,
                                         end_ns=a + int(rng.integers(1, 3000)), cta=cta, phase="flag_wait"))
                if rng.random() < 0.1:
                    rows.append(dict(rank=r, stream=1, kind="sync", role="other", name="sync",
                                     start_ns=start, end_ns=start + int(rng.integers(1, 9000))))
                t = max(t, start + d) + int(rng.integers(0, 3000))
    df = pd.DataFrame(rows)
    # collectives must run on every member: give every comm id to every rank that has comm of that group
    comm = df[df["role"] == "comm"]
    ids = comm.drop_duplicates("collective_id")
    extra = []
    for r in range(n_ranks):
        have = set(comm.loc[comm["rank"] == r, "collective_id"])
        for row in ids.itertuples():
            if row.collective_id not in have:
                corr += 1
                s = int(row.start_ns) + int(rng.integers(0, 3000))
                extra.append(dict(rank=r, stream=2, kind="kernel", role="comm", name="nccl", start_ns=s, end_ns=s + 1000,
                                  correlation=corr, iteration=row.iteration, collective_id=row.collective_id))
    if extra:
        df = pd.concat([df, pd.DataFrame(extra)], ignore_index=True)
    cost = {"flops": int(rng.integers(0, 10**10)), "hbm_bytes": int(rng.integers(0, 10**8)),
            "link_bytes": int(rng.integers(0, 10**7)), "dtype": "bf16",
            "intermediates": [{"name": "x", "bytes": int(rng.integers(0, 10**8)), "producer": "k1", "consumer": "role:copy"}]}
    meta = make_meta(world_size=n_ranks, ranks=list(range(n_ranks)), hardware={"name": "H100 SXM"}, cost=cost,
                     clock_offsets_ns={str(r): 0 for r in range(n_ranks)}, capture={"clock_offsets_source": "measured"})
    return Bundle(normalize_events(df), meta)


def check_partition(led):
    p = led.parts
    assert (p["ns"] >= 0).all()
    sums = p.groupby(["repetition", "iteration", "rank"])["ns"].sum().reset_index()
    m = sums.merge(led.windows, on=["repetition", "iteration"])
    assert len(m) == len(led.windows) * len(led.ranks)
    assert (m["ns"] == m["window_ns"]).all()
    iv = led.intervals
    assert (iv["end_ns"] > iv["start_ns"]).all()
    got = (iv["end_ns"] - iv["start_ns"]).groupby([iv["repetition"], iv["iteration"], iv["rank"], iv["subcategory"]]).sum()
    want = p.set_index(["repetition", "iteration", "rank", "subcategory"])["ns"]
    want = want[want > 0]
    assert got.sort_index().to_dict() == want.sort_index().to_dict()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n_ranks=st.integers(1, 4), n_iter=st.integers(1, 3), per_iter=st.integers(1, 7))
def test_partition_invariant_on_random_traces(seed, n_ranks, n_iter, per_iter):
    led = compute_ledger(random_bundle(seed, n_ranks, n_iter, per_iter))
    check_partition(led)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), world=st.integers(2, 4), skew=st.integers(0, 20_000), gap=st.integers(0, 3000),
       extra=st.integers(0, 3), graph=st.booleans(), starve=st.integers(0, 10_000), inter=st.integers(0, 50_000_000),
       sync=st.integers(0, 5000), overlap=st.integers(0, 20_000), tail=st.integers(0, 20_000), jitter=st.integers(0, 5000),
       link=st.integers(0, 5 * 10**7), fused=st.booleans(), flag=st.integers(0, 20_000))
def test_synthetic_reference_agrees(seed, world, skew, gap, extra, graph, starve, inter, sync, overlap, tail, jitter, link,
                                    fused, flag):
    case = synthetic_bundle(world_size=world, skew_ns=skew, kernel_gap_ns=gap, extra_launches=extra, graph=graph,
                            host_starved_ns=starve, intermediate_bytes=inter, sync_ns=sync, overlap_ns=overlap,
                            tail_ns=tail, jitter_ns=jitter, link_bytes=link, variant="fused" if fused else "bsp",
                            flag_wait_ns=flag if fused else 0, seed=seed, iterations=2)
    led = compute_ledger(case.bundle, case.hardware)
    check_partition(led)
    m = led.parts.merge(case.expected, on=["repetition", "iteration", "rank", "subcategory"], suffixes=("", "_exp"))
    assert len(m) == len(case.expected)
    assert (m["ns"] == m["ns_exp"]).all(), m[m["ns"] != m["ns_exp"]].to_string()
