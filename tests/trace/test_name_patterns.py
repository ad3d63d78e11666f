"""Name patterns run in time linear in the name (issue 28: a 192 KB runtime-call name made one
import take minutes, because ``launch\\w*kernel`` retried from every "launch" of the word)."""
from __future__ import annotations

import re
import time

import pytest

from taxmodel import vocabulary
from taxmodel.trace import kineto

OLD_LAUNCH = re.compile(r"(?i)(?:launch\w*kernel|graphlaunch|memcpy|memset)")
OLD_NCCL_OP = re.compile(r"(?i)nccl\w*?Kernel_([A-Za-z]+)")

NAMES = ["cudaLaunchKernel", "hipLaunchKernel", "cudaLaunchKernelExC_v11060", "cuLaunchKernel", "cudaGraphLaunch",
         "cudaMemcpyAsync", "cudaEventRecord", "launch_kernel", "xlaunch yKernel", "cudaLaunch", "launch-kernel",
         "LaunchCooperativeKernelMultiDevice", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         "void ncclKernel_Broadcast", "_Z23ncclDevKernel_ReduceScatter", "ncclx ncclKernel_SendRecv", "nccl",
         "a nccl b Kernel_X", "ncclnccl_Kernel_AllGather", "foo_ncclDev_bar_ncclKernel_AllReduce"]


@pytest.mark.parametrize("name", NAMES)
def test_the_linear_patterns_match_what_the_old_ones_did(name):
    assert bool(kineto._LAUNCH_CALL.search(name)) == bool(OLD_LAUNCH.search(name))
    old, new = OLD_NCCL_OP.search(name), vocabulary.KERNEL_OP.search(name)
    assert bool(old) == bool(new) and (old is None or old.group(1) == new.group("op"))


@pytest.mark.parametrize("pattern", [kineto._LAUNCH_CALL, vocabulary.KERNEL_OP], ids=["launch", "nccl_op"])
def test_a_megabyte_name_is_matched_in_linear_time(pattern):
    # ~0.1 s each on a loaded 2-core machine; the quadratic patterns needed hours for these. The
    # bound is 100x the linear time, so it says "not quadratic", not how fast this machine is.
    for name in ("launch" * 170_000, "nccl" * 250_000, "ncclKernel" * 100_000, "rccl" * 250_000):
        t = time.perf_counter()
        pattern.search(name)
        assert time.perf_counter() - t < 10.0
