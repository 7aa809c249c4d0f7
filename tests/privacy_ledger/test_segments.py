"""The ledger's segmented measure-once protocol (issue #20): a key drawn segment by segment, its NMF an index of
the segments' SHA-256, every segment bound through the committed index."""

from __future__ import annotations

import io
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dasflow.errors import IntegrityError, LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.privacy.ledger import Cap, Ledger, decode_nmf, encode_nmf, is_index
from dasflow.privacy.measurement import MeasurementSpec, NoisyMeasurement

SEGMENTS = ["01", "02", "06"]
BINDING = {"config_sha256": "c" * 64, "rng_mode": "test", "inputs_sha256": "i" * 64}


def _spec() -> MeasurementSpec:
    return MeasurementSpec(product="p", key="p/county/total", level="county", privacy_defn="zcdp",
                           mechanism="discrete_gaussian", budget=Fraction(1, 2), sensitivity=Fraction(2),
                           noise=Fraction(2), cells=30, variance=Fraction(2))


def _ledger(tmp: Path) -> Ledger:
    ledger = Ledger(LocalStore(tmp / "store"), "r1", BINDING)
    ledger.freeze_plan([_spec()], Cap(rho=Fraction(1)))
    return ledger


class Drawer:
    """A draw per segment that records its calls; raises at ``crash_at`` (a process dying mid-key)."""

    def __init__(self, crash_at: str | None = None) -> None:
        self.calls: list[str] = []
        self.crash_at = crash_at
        self.gen = np.random.default_rng(7)

    def __call__(self, segment: str) -> NoisyMeasurement:
        if segment == self.crash_at:
            raise RuntimeError("killed")
        self.calls.append(segment)
        base = 100 * SEGMENTS.index(segment)
        units = np.arange(base, base + 10)
        table = pd.DataFrame({"UNIT": units, "NOISY": self.gen.integers(-50, 50, size=10),
                              "VARIANCE": [Fraction(2)] * 10})
        return NoisyMeasurement(spec=_spec(), table=table, rng_mode="test")


def _measure(ledger: Ledger, draw: Callable[[str], NoisyMeasurement]) -> tuple[list[str], int]:
    entries, drawn = ledger.measure_segmented(_spec(), SEGMENTS, draw, attempt="a")
    return [e.segment for e in entries], drawn


def test_segments_are_drawn_once_indexed_and_bound(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    draw = Drawer()
    assert _measure(ledger, draw) == (SEGMENTS, 3)
    assert draw.calls == SEGMENTS
    commit = ledger.committed(_spec().key)
    assert commit is not None and commit.nmf_key == ledger.nmf_key(_spec().key)
    assert is_index(ledger.store.get(commit.nmf_key))
    loaded = ledger.load(_spec(), commit)
    assert loaded.table["UNIT"].tolist() == [*range(10), *range(100, 110), *range(200, 210)]
    assert loaded.table["VARIANCE"].tolist() == [Fraction(2)] * 30
    segs = ledger.segments(_spec(), commit)
    assert segs is not None and [s.rows for s in segs] == [10, 10, 10]
    one = ledger.load_segment(_spec(), segs[1])
    assert one.table["UNIT"].tolist() == list(range(100, 110))
    assert ledger.verify(deep=True) == [_spec().key]
    # committed: nothing drawn again, no segment read
    again = Drawer()
    assert _measure(ledger, again) == (SEGMENTS, 0) and again.calls == []
    # a different list of segments for the committed key is not silently accepted
    with pytest.raises(LedgerRefusal):
        ledger.measure_segmented(_spec(), ["01", "01"], again, attempt="b")


def test_resume_after_a_crash_mid_key_draws_only_the_missing_segments(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    with pytest.raises(RuntimeError):
        _measure(ledger, Drawer(crash_at="02"))
    first = ledger.store.get(ledger.segment_key(_spec().key, "01"))
    assert ledger.committed(_spec().key) is None and not ledger.store.exists(ledger.nmf_key(_spec().key))
    resumed = Drawer()
    assert _measure(Ledger(ledger.store, "r1", BINDING), resumed) == (SEGMENTS, 2)
    assert resumed.calls == ["02", "06"]  # segment 01 reached storage: reused, never redrawn
    assert ledger.store.get(ledger.segment_key(_spec().key, "01")) == first
    commit = ledger.committed(_spec().key)
    assert commit is not None
    assert ledger.load(_spec(), commit).table["UNIT"].size == 30


def test_a_segment_deleted_mid_key_is_refused_never_redrawn(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    with pytest.raises(RuntimeError):
        _measure(ledger, Drawer(crash_at="06"))
    ledger.store.delete(ledger.segment_key(_spec().key, "02"))
    draw = Drawer()
    with pytest.raises(IntegrityError, match=r"seg=02\.parquet.*never drawn again"):
        _measure(Ledger(ledger.store, "r1", BINDING), draw)
    assert draw.calls == []


def test_a_tampered_or_deleted_segment_is_named(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    _measure(ledger, Drawer())
    commit = ledger.committed(_spec().key)
    assert commit is not None
    skey = ledger.segment_key(_spec().key, "02")
    good = ledger.store.get(skey)
    table = pq.read_table(io.BytesIO(good)).to_pandas()
    table.loc[0, "NOISY"] += 1  # the same metadata and binding, one noisy answer changed
    forged = encode_nmf(NoisyMeasurement(spec=_spec(), table=table, rng_mode="test"), _spec(), BINDING,
                        segment="02")
    ledger.store.put(skey, forged)
    with pytest.raises(IntegrityError, match=r"seg=02\.parquet.*does not match"):
        ledger.load(_spec(), commit)
    with pytest.raises(IntegrityError, match=r"seg=02\.parquet"):
        ledger.verify(deep=True)
    ledger.verify(deep=False)  # the chain of commits is intact; only the deep check reads segments
    ledger.store.delete(skey)
    with pytest.raises(IntegrityError, match=r"seg=02\.parquet.*missing"):
        ledger.load(_spec(), commit)
    with pytest.raises(IntegrityError, match=r"seg=02\.parquet.*missing"):
        ledger.verify(deep=True)
    # a segment of another key or segment put in its place is refused by its metadata
    ledger.store.put(skey, ledger.store.get(ledger.segment_key(_spec().key, "01")))
    with pytest.raises(IntegrityError, match=r"seg=02\.parquet"):
        ledger.load(_spec(), commit)


def test_an_uncommitted_index_is_checked_before_it_is_committed(tmp_path: Path) -> None:
    """A crash after the index was written and before the commit: the resume commits it after checking every
    segment; an edited segment is refused instead."""
    ledger = _ledger(tmp_path)
    _measure(ledger, Drawer())
    commit_key = f"{ledger.root}/entries/{_spec().key}.committed.json"
    ledger.store.delete(commit_key)  # as if the process died before committing
    assert _measure(Ledger(ledger.store, "r1", BINDING), Drawer()) == (SEGMENTS, 0)
    ledger.store.delete(commit_key)
    skey = ledger.segment_key(_spec().key, "06")
    data = ledger.store.get(skey)
    ledger.store.put(skey, data[:-20] + bytes(20))
    with pytest.raises(IntegrityError, match=r"seg=06\.parquet"):
        _measure(Ledger(ledger.store, "r1", BINDING), Drawer())


def test_segments_are_bound_to_the_release(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    with pytest.raises(RuntimeError):
        _measure(ledger, Drawer(crash_at="06"))
    other = Ledger(ledger.store, "r1", {**BINDING, "inputs_sha256": "x" * 64})
    with pytest.raises(IntegrityError, match=r"seg=01\.parquet.*not bound"):
        _measure(other, Drawer())


def test_fraction_columns_round_trip_exactly_through_the_nmf() -> None:
    """Variance columns are decoded once per distinct value: the values, their order and their type are exactly
    those encoded (several γ, a huge and a negative value, an empty table)."""
    values = [Fraction(2), Fraction(10**30 + 1, 3), Fraction(-7, 9), Fraction(2), Fraction(10**30 + 1, 3)]
    table = pd.DataFrame({"UNIT": np.arange(5), "NOISY": np.arange(5) - 2, "VARIANCE": values})
    back = decode_nmf(encode_nmf(NoisyMeasurement(spec=_spec(), table=table, rng_mode="test"), _spec()), _spec())
    assert back.table["VARIANCE"].tolist() == values
    assert all(type(v) is Fraction for v in back.table["VARIANCE"]) and back.table["VARIANCE"].dtype == object
    empty = table.iloc[:0].reset_index(drop=True)
    back = decode_nmf(encode_nmf(NoisyMeasurement(spec=_spec(), table=empty, rng_mode="test"), _spec()), _spec())
    assert len(back.table) == 0


def test_answer_vectors_are_stored_delta_encoded() -> None:
    """An NMF's integer answer vectors (a list column, TopDown's NOISY) round-trip exactly — values, widths,
    empty and long vectors — and are stored delta-encoded (DELTA_BINARY_PACKED, no dictionary), the other
    columns LZ4; the bytes are deterministic. Noise-like vectors take well under the plain encoding's bytes."""
    gen = np.random.default_rng(11)
    # noisy block counts: mostly-zero true counts plus rounded Gaussian noise, one vector with wide values
    rows = [(gen.poisson(0.5, 2016) + np.rint(gen.normal(0.0, 8.0, 2016))).astype(np.int16) for _ in range(200)]
    rows[7] = gen.integers(-30000, 30000, size=2016).astype(np.int16)
    rows[3] = np.zeros(0, dtype=np.int16)
    table = pd.DataFrame({"UNIT": np.arange(200), "NOISY": rows, "VARIANCE": [Fraction(9, 2)] * 200})
    m = NoisyMeasurement(spec=_spec(), table=table, rng_mode="test")
    data = encode_nmf(m, _spec())
    assert encode_nmf(m, _spec()) == data
    back = decode_nmf(data, _spec()).table
    assert back["UNIT"].tolist() == list(range(200))
    assert all(np.array_equal(a, b) and np.asarray(b).dtype == np.int16 for a, b in zip(rows, back["NOISY"],
                                                                                          strict=True))
    meta = pq.read_metadata(io.BytesIO(data)).row_group(0)
    cols = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    vec = cols["NOISY.list.element"]
    assert "DELTA_BINARY_PACKED" in vec.encodings and not vec.has_dictionary_page
    assert cols["UNIT"].compression == "LZ4" and cols["VARIANCE"].compression == "LZ4"
    plain = io.BytesIO()
    pq.write_table(pq.read_table(io.BytesIO(data)), plain, compression="lz4", use_dictionary=False)
    assert len(data) < 0.6 * len(plain.getvalue())


def test_an_nmf_stores_each_fraction_as_its_exact_text_whether_objects_are_shared_or_not() -> None:
    """``encode_nmf`` formats a variance column once per distinct Fraction object (a column shares one object per
    γ); every row still gets its own value's "p/q" text, and decoding gives the exact values back."""
    shared, other = Fraction(3, 7), Fraction(10**30 + 1, 3)
    values = [shared, other, shared, Fraction(3, 7), Fraction(-5, 2), other, Fraction(4)]  # equal, not identical
    table = pd.DataFrame({"UNIT": np.arange(len(values)), "NOISY": np.arange(len(values)) - 3, "VARIANCE": values})
    data = encode_nmf(NoisyMeasurement(spec=_spec(), table=table, rng_mode="test"), binding=BINDING)
    stored = pq.read_table(io.BytesIO(data)).column("VARIANCE").to_pylist()
    assert stored == ["3/7", f"{10**30 + 1}/3", "3/7", "3/7", "-5/2", f"{10**30 + 1}/3", "4"]
    assert decode_nmf(data, _spec()).table["VARIANCE"].tolist() == values
    assert pq.read_schema(io.BytesIO(data)).metadata[b"dasflow.fraction_columns"] == b'["VARIANCE"]'
