"""Test-suite setup shared by every folder.

Kernels run in Triton's interpreter on these CPU machines, and a kernel module compiles in the
mode it was first imported in. In a full run the kernel tests, collected first, set
``TRITON_INTERPRET=1`` before anything imports a kernel; set it here as well, so that a run of a
few files (whose imports may pull kernels in before their own module sets it) behaves the same.
Tests that compile for a GPU do it in subprocesses without the variable."""
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Cached cases (``taxmodel.model.case_store``) go to a directory of this test run's own: every
    run computes what it checks, as CI's fresh checkout does, and the user's cache is untouched.
    The workers of one ``pytest -n`` run share it (entries are written atomically), so a case
    computed by one test is not computed again by another. Set before any test runs;
    subprocesses (the CLI, notebooks) inherit it."""
    from taxmodel.model.case_store import CACHE_ENV

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "taxmodel-cache"
    shared.mkdir(exist_ok=True)
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(shared)
    yield
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old
