"""The words of a rank's sweep: how its GPU rows are classed, how the segments between their edges
are labelled, and where each sub-category sits in the parts table (``sweep.py``, ``idle_gaps.py``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from taxmodel.ledger import intervals as iv
from taxmodel.ledger.categories import SUBCATEGORY_ORDER

#: roles whose kernels keep the rank's GPU busy on its own work (communication under them overlaps)
LOCAL_ROLES = ("compute", "fused", "copy")
#: sweep classes of GPU rows: local work, communication, anything else, and the skew intervals
CLS_LOCAL, CLS_COMM, CLS_OTHER, CLS_SKEW = 0, 1, 2, 3
#: segment labels: local busy, communication before its last member arrived, after it, other, idle
SEG_LOCAL, SEG_SKEW, SEG_TRANSFER, SEG_OTHER, SEG_IDLE = 0, 1, 2, 3, 4
NO_LAUNCH = iv.INT64_MAX - 1  # start key of a GPU activity whose launch call is unknown
#: column of each sub-category in the parts table
SUB = {s: i for i, s in enumerate(SUBCATEGORY_ORDER)}
#: the shares of local busy time, in the order they are taken (the last one is what is left)
LOCAL_LABELS = ("flag_wait", "exposed_comm", "useful", "locality_tax", "compute_inefficiency")


def role_class(role: pd.Series) -> np.ndarray:
    """Sweep class of each GPU row from its role, comparing the few distinct roles only."""
    codes, uniq = pd.factorize(role)
    table = np.array([CLS_LOCAL if u in LOCAL_ROLES else CLS_COMM if u == "comm" else CLS_OTHER for u in uniq] or [CLS_OTHER],
                     np.int64)
    return table[codes]
