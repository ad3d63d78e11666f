"""`TAXMODEL_AG_GEMM_TRANSPORT` picks the fine-grained transport for `taxmodel profile` (and with
it whether pull/push can be captured in a CUDA graph); an explicit GemmConfig wins."""
from __future__ import annotations

import pytest

from taxmodel.errors import InputError
from taxmodel.kernels.ag_gemm.gemm_tiles import GemmConfig
from taxmodel.kernels.ag_gemm.workload import TRANSPORT_ENV, AgGemm


def test_default_is_the_copy_engines_graph_safe_for_pull_only(monkeypatch):
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    wl = AgGemm()
    assert wl.config_summary()["transport"] == "ce"
    v = wl.variants()
    assert v["bsp"].graph_safe and v["pull"].graph_safe and not v["push"].graph_safe


def test_sm_transport_from_the_environment_is_graph_safe(monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "sm")
    wl = AgGemm()
    assert wl.config_summary("cpu")["transport"] == "sm"
    v = wl.variants()
    assert v["pull"].graph_safe and v["push"].graph_safe


def test_an_explicit_config_wins_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "sm")
    assert AgGemm(GemmConfig(transport="ce")).config_summary()["transport"] == "ce"
    monkeypatch.setenv(TRANSPORT_ENV, "nvlink")
    with pytest.raises(InputError, match="TAXMODEL_AG_GEMM_TRANSPORT='nvlink'"):
        AgGemm().variants()
