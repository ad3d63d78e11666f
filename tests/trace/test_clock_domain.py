"""Which ranks share a clock, as the Kineto importer says it (trace/kineto_ops.clock_domain)."""
from __future__ import annotations

from taxmodel.trace.kineto_ops import clock_domain


def test_one_host_name_is_one_clock():
    d = clock_domain([{"host_name": "n1"}, {"host_name": "n1"}], [0, 1])
    assert d["shared"] is True and "host_of_rank" not in d


def test_several_hosts_say_which_rank_ran_where():
    d = clock_domain([{"host_name": "n1"}, {"host_name": "n2"}, {"host_name": "n1"}], [0, 1, 2])
    assert d["shared"] is False and d["hosts"] == ["n1", "n2"]
    assert d["host_of_rank"] == {"0": "n1", "1": "n2", "2": "n1"}


def test_without_host_names_nothing_is_claimed():
    d = clock_domain([{"host_name": None, "base_time_ns": 1}, {"host_name": None, "base_time_ns": 2}], [0, 1])
    assert d["shared"] is None and "host_of_rank" not in d
