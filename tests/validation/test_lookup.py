"""GEOID lookups against a fixed block list (``dasflow.validation.lookup``): the same answers as Arrow's
``index_in`` / ``is_in``, with the list sorted once instead of hashed on every batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.validation.lookup import GeoidIndex, geoid_keys
from dasflow.validation.products import fact_not_in


def test_geoid_index_answers_as_arrows_index_in() -> None:
    """``GeoidIndex.positions`` equals ``pyarrow.compute.index_in`` (first equal GEOID's position, −1 for none)
    on 15-digit GEOIDs in and out of the list, duplicates in the list, and any other text: shorter, longer, with
    letters, spaces or non-ASCII digits, empty, null — as one array and as a chunked one, against an empty list
    too. Digit strings of other lengths never equal a 15-digit key (no leading-zero aliasing)."""
    rng = np.random.default_rng(5)
    listed = [f"{v:015d}" for v in rng.integers(10**13, 6 * 10**13, 300)]
    values = pa.array([*listed, listed[7], "12345", "0100100010010x", None, "٠١٠٠١٠٠٠١٠٠١٠٠١"], pa.string())
    queries = [*rng.choice(listed, 200).tolist(), *(f"{v:015d}" for v in rng.integers(10**13, 6 * 10**13, 50)),
               "12345", "012345", "000000000012345", "0100100010010x", " 010010001001001", "", None,
               "٠١٠٠١٠٠٠١٠٠١٠٠١", "1" * 16, "-10010001001001"]
    geoid = pa.array(queries, pa.string())

    def expected(q: pa.Array | pa.ChunkedArray, v: pa.Array) -> list[int]:
        return pc.fill_null(pc.index_in(q, value_set=v), -1).to_pylist()

    index = GeoidIndex(values)
    assert index.positions(geoid).tolist() == expected(geoid, values)
    chunked = pa.chunked_array([geoid.slice(0, 100), geoid.slice(100)])
    assert index.positions(chunked).tolist() == expected(chunked, values)
    assert index.positions(geoid, geoid_keys(geoid)).tolist() == expected(geoid, values)
    assert (index.positions(geoid)[:200] >= 0).all() and index.positions(pa.array(["000000000012345"]))[0] == -1
    assert GeoidIndex(pa.array([], pa.string())).positions(geoid).tolist() == [-1] * len(queries)
    assert index.positions(pa.array([], pa.string())).size == 0
    assert geoid_keys(pa.array(["010010001001001", "01001000100100", None])).tolist() == [10010001001001, -1, -1]


def test_membership_fact_is_the_same_with_a_geoid_index() -> None:
    """``fact_not_in`` against a :class:`GeoidIndex` gives the fact it gives against the list itself: no
    violation when every value is listed, else the same count and first row (with and without a row filter,
    a malformed and a null value)."""
    listed = pa.array([f"{v:015d}" for v in range(10**13, 10**13 + 500)], pa.string())
    index = GeoidIndex(listed)
    good = pa.chunked_array([listed.slice(0, 200), listed.slice(300)])
    assert fact_not_in("r", "f", "c", good, index) == fact_not_in("r", "f", "c", good, listed)
    assert fact_not_in("r", "f", "c", good, index)["violations"] == 0
    bad = pa.chunked_array([pa.array(["000000000000001", *listed.slice(0, 50).to_pylist(), "12x", None,
                                      "000000000000001"], pa.string())])
    where = pa.chunked_array([pa.array([False, *[True] * 50, True, True, True])])
    for w in (None, where):
        got = fact_not_in("r", "f", "c", bad, index, where=w)
        assert got == fact_not_in("r", "f", "c", bad, listed, where=w) and got["violations"] > 0, w
