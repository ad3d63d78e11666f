"""The event schema: normalization fills sentinels and dtypes; validation names the field."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from taxmodel.errors import BundleError
from taxmodel.trace import schema


def _rows(**overrides) -> pd.DataFrame:
    base = {"rank": [1, 0, 0], "kind": ["kernel", "launch", "kernel"], "name": ["b", "l", "a"],
            "start_ns": [30, 5, 10], "end_ns": [40, 8, 20]}
    base.update(overrides)
    return pd.DataFrame(base)


def test_normalize_fills_sentinels_dtypes_order_and_sorts():
    df = _rows(extra_column=[1, 2, 3])
    out = schema.normalize_events(df)
    assert list(out.columns) == list(schema.COLUMN_NAMES)
    for col in schema.COLUMNS:
        if col.dtype == "string":  # object on pandas 2, the str dtype on pandas 3
            assert pd.api.types.is_string_dtype(out[col.name]), col.name
        else:
            assert str(out[col.name].dtype) == col.dtype, col.name
    # sorted by (rank, start, end)
    assert list(out["name"]) == ["l", "a", "b"]
    assert list(out["rank"]) == [0, 0, 1]
    assert set(out["device"]) == {-1} and set(out["correlation"]) == {-1} and set(out["iteration"]) == {-1}
    assert set(out["role"]) == {"other"} and set(out["collective_id"]) == {""} and set(out["repetition"]) == {0}
    schema.validate_events(out)


def test_normalize_fills_missing_values_of_optional_columns():
    out = schema.normalize_events(_rows(correlation=[1.0, np.nan, 3.0], name=["x", None, "z"]))
    assert list(out["correlation"]) == [-1, 3, 1]
    assert list(out["name"]) == ["", "z", "x"]


@pytest.mark.parametrize("column", ["rank", "kind", "start_ns", "end_ns"])
def test_missing_required_column_is_named(column):
    with pytest.raises(BundleError, match=f"required column '{column}' is missing"):
        schema.normalize_events(_rows().drop(columns=column))


def test_missing_value_in_required_column_is_named():
    with pytest.raises(BundleError, match="column 'start_ns' has missing values"):
        schema.normalize_events(_rows(start_ns=[1.0, np.nan, 3.0]))


def test_unconvertible_value_is_named():
    with pytest.raises(BundleError, match="column 'stream' cannot be read as int64"):
        schema.normalize_events(_rows(stream=["7", "x", "9"]))


def test_validate_names_unknown_kind_and_role():
    ok = schema.normalize_events(_rows())
    with pytest.raises(BundleError, match=r"column 'kind' has unknown value 'gpu_thing'"):
        schema.validate_events(ok.assign(kind=["kernel", "gpu_thing", "kernel"]))
    with pytest.raises(BundleError, match=r"column 'role' has unknown value 'magic'"):
        schema.validate_events(ok.assign(role=["magic", "other", "other"]))


def test_validate_durations():
    ok = schema.normalize_events(_rows())
    # an instantaneous marker or host call is fine
    schema.validate_events(ok.assign(end_ns=ok["start_ns"], kind=["marker", "launch", "sync"]))
    with pytest.raises(BundleError, match=r"field 'end_ns' is not after 'start_ns' for kernel 'a' on rank 0"):
        schema.validate_events(ok.assign(end_ns=ok["start_ns"]))
    with pytest.raises(BundleError, match="field 'end_ns' is not after 'start_ns' for launch"):
        schema.validate_events(ok.assign(end_ns=ok["start_ns"] - 1, kind=["launch"] * 3))


def test_validate_dtype_and_rank():
    ok = schema.normalize_events(_rows())
    with pytest.raises(BundleError, match="column 'start_ns' has dtype float64"):
        schema.validate_events(ok.assign(start_ns=ok["start_ns"].astype(float)))
    with pytest.raises(BundleError, match="missing column 'phase'"):
        schema.validate_events(ok.drop(columns="phase"))
    with pytest.raises(BundleError, match="column 'rank' has a negative value"):
        schema.validate_events(ok.assign(rank=np.array([-1, 0, 0], dtype="int32")))


def test_empty_events_and_docs():
    empty = schema.empty_events()
    schema.validate_events(empty)
    assert list(empty.columns) == list(schema.COLUMN_NAMES)
    docs = schema.column_docs()
    assert list(docs["column"]) == list(schema.COLUMN_NAMES) and docs["meaning"].str.len().min() > 0
    assert set(schema.REQUIRED) == {"rank", "kind", "start_ns", "end_ns"}


def test_events_from_columns_takes_the_columns_over_and_keeps_the_rows_asked_for():
    df = _rows(extra_column=[1, 2, 3], correlation=[1.0, np.nan, 3.0])
    columns = {c: df[c].to_numpy() for c in df.columns}
    out = schema.events_from_columns(columns, np.array([0, 2]))
    assert columns == {}  # taken over
    pd.testing.assert_frame_equal(out, schema.normalize_events(df.iloc[[0, 2]]))
    whole = schema.events_from_columns({c: df[c] for c in df.columns})  # Series too, every row
    pd.testing.assert_frame_equal(whole, schema.normalize_events(df))


@pytest.mark.parametrize("ranks", [[1, 0], [0, 1, 0], [2, 0, 1]], ids=["out_of_order", "duplicated", "three"])
def test_concat_events_is_normalize_of_the_concatenation(ranks):
    parts = [schema.normalize_events(_rows(rank=[r] * 3, start_ns=[30 + i, 5, 10], name=[f"p{i}", "l", "a"]))
             for i, r in enumerate(ranks)]
    want = schema.normalize_events(pd.concat(parts, ignore_index=True))
    frames = list(parts)
    pd.testing.assert_frame_equal(schema.concat_events(frames), want)
    assert frames == []  # taken over
    two_ranks = schema.normalize_events(pd.concat(parts[:2], ignore_index=True))  # kept in the order given
    want = schema.normalize_events(pd.concat([two_ranks, parts[-1]], ignore_index=True))
    pd.testing.assert_frame_equal(schema.concat_events([two_ranks, parts[-1]]), want)
