"""Test-suite setup shared by every folder.

Kernels run in Triton's interpreter on these CPU machines, and a kernel module compiles in the
mode it was first imported in. In a full run the kernel tests, collected first, set
``TRITON_INTERPRET=1`` before anything imports a kernel; set it here as well, so that a run of a
few files (whose imports may pull kernels in before their own module sets it) behaves the same.
Tests that compile for a GPU do it in subprocesses without the variable."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
