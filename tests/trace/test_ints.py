"""Whole numbers from trace fields: one rule per kind of field (``trace/ints.py``), never an
exception on what a damaged trace writes."""
from __future__ import annotations

import pytest

from taxmodel.trace import ints, nsys
from taxmodel.trace import vendor_common as vc

DAMAGED = [None, True, False, 3.0, float("nan"), float("inf"), [], {}, "", "-", "--5", "+5", "1_000", "0x10", "²",
           "1.5", "12ab", 2 ** 62, -(2 ** 62), "9" * 19]


def test_whole_takes_ints_and_their_decimal_text_only():
    assert [ints.whole(v) for v in (0, 7, -3, "42", " -17 ", "٣", 2 ** 62 - 1, "9" * 18)] == \
        [0, 7, -3, 42, -17, 3, 2 ** 62 - 1, int("9" * 18)]
    assert [ints.whole(v) for v in DAMAGED] == [None] * len(DAMAGED)


def test_nonneg_gives_the_default_for_a_negative_or_no_number():
    assert ints.nonneg("12") == 12 and ints.nonneg(0) == 0
    assert ints.nonneg(-1) == -1 and ints.nonneg("-5", None) is None and ints.nonneg(True, 9) == 9


def test_whole_in_text_finds_the_digits_among_words():
    assert ints.whole_in_text("stream 7") == 7 and ints.whole_in_text(" -4 ") == -4 and ints.whole_in_text(5) == 5
    assert ints.whole_in_text("--5") == 5  # was int("--5"): ValueError out of the importer
    assert ints.whole_in_text("none") is None and ints.whole_in_text(2.0) is None and ints.whole_in_text(2 ** 62) is None


def test_truncated_reads_a_numbers_text_toward_zero():
    assert [ints.truncated(v) for v in (12, "1.5e9", "-2.7", " 3 ")] == [12, 1_500_000_000, -2, 3]
    assert [ints.truncated(v) for v in ("inf", "nan", "1e30", 2.5, True, None, "x")] == [None] * 7


def test_literal_reads_integers_as_code_writes_them():
    assert [ints.literal(v) for v in ("1024", "0x400", " 1_024 ", 1024, "-2")] == [1024, 1024, 1024, 1024, -2]
    assert [ints.literal(v) for v in ("ten", 1.5, True, "0x" + "f" * 20)] == [None] * 4


@pytest.mark.parametrize("value", ["Infinity", "-1", "1e3", "1024.5", "true", '"lots"'])
def test_an_nccl_payload_size_that_is_no_whole_number_is_unknown(value):
    """An NVTX payload's "Infinity" used to raise OverflowError out of the nsys importer."""
    fields = nsys._payload_fields('{"Message size [bytes]": %s, "No. of ranks": %s}' % (value, value))
    assert fields["bytes"] == -1 and fields["nranks"] == -1


def test_an_rccl_count_beyond_int64_is_no_size():
    assert vc.call_from_args("ncclAllReduce", {"count": "9" * 30, "datatype": "ncclFloat32"}) == ("allreduce", -1)
    assert vc.call_from_args("ncclAllReduce", {"count": "0x400", "datatype": "ncclFloat32"}) == ("allreduce", 4096)
