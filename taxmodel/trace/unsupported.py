"""Profiler outputs taxmodel recognizes but does not read, each refused in one line that says what
the file is and how to get a supported one (checked by content before any importer claims it,
``importers.detect_format``).

- an Nsight Systems report (``.nsys-rep``, ``.qdrep``): a binary only ``nsys`` reads; its SQLite
  export is supported. Such reports begin with "NVIDIA Tegra Profiler Report" (Nsight Systems'
  container header, whatever the target);
- an nvprof database (``.nvvp``, ``.prof``; CUDA 10 and older): SQLite with CUPTI activity tables
  whose names live in ``StringTable``, where Nsight Systems exports have ``StringIds``;
- an RPD database (rocmProfileData's ``rpd_tracer``): SQLite with ``rocpd_api`` and ``rocpd_op``
  tables, not the ``rocpd_kernel_dispatch`` ones of rocprofv3's own rocpd output;
- an Nsight Systems SQLite export without any CUDA activity table (captured without
  ``--trace=cuda``, or of a process that ran no GPU work).
"""
from __future__ import annotations

from pathlib import Path

NSYS_REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"
_NSYS_EXPORT_TABLES = frozenset({"TARGET_INFO_SESSION_START_TIME", "ThreadNames", "META_DATA_EXPORT", "EXPORT_META_DATA",
                                 "TARGET_INFO_SYSTEM_ENV", "ProcessStreams", "OSRT_API", "NVTX_EVENTS"})
_NSYS_GPU_TABLES = frozenset({"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"})


def refusal(path: Path, head: bytes, names: set[str]) -> str | None:
    """The one-line refusal of a file in a recognized but unsupported format, else None; ``head``
    and ``names`` (a SQLite file's tables and views) as the importers' ``sniff`` gets them."""
    if head.startswith(NSYS_REPORT_MAGIC):
        return (f"{path}: an Nsight Systems report (.nsys-rep/.qdrep), a binary only nsys reads; export it with "
                f"`nsys export --type sqlite -o {Path(path).stem}.sqlite {path}` and import the .sqlite")
    if not names:
        return None
    if "StringTable" in names and "StringIds" not in names and any(n.startswith("CUPTI_ACTIVITY_KIND_") for n in names):
        return (f"{path}: an nvprof database (.nvvp/.prof, CUDA 10 and older), which taxmodel does not read; profile "
                "again with Nsight Systems (`nsys profile --trace=cuda,nvtx`, then `nsys export --type sqlite`) or "
                "torch.profiler")
    if {"rocpd_api", "rocpd_op"} <= names and not any(n.startswith("rocpd_kernel_dispatch") for n in names):
        return (f"{path}: an RPD database (rocmProfileData's rpd_tracer: rocpd_api/rocpd_op tables), not rocprofv3's "
                "rocpd output; profile again with `rocprofv3 --kernel-trace --memory-copy-trace --hip-trace` "
                "(ROCm 6.2+; rocpd, JSON or CSV output) or torch.profiler")
    if names & _NSYS_EXPORT_TABLES and not names & _NSYS_GPU_TABLES and "StringIds" in names:
        return (f"{path}: an Nsight Systems export with no CUDA activity (no kernel, memcpy or memset table: captured "
                "without --trace=cuda, or the process ran no GPU work); capture with `nsys profile --trace=cuda,nvtx` "
                "and export with `nsys export --type sqlite`")
    return None
