"""``dasflow.io.arrays.unique``: the very result of ``np.unique`` (values, dtype, order) by one sort."""

from __future__ import annotations

import numpy as np
import pytest

from dasflow.io.arrays import unique

RNG = np.random.default_rng(20261129)

CASES = {
    "distinct int64": RNG.permutation(50_000).astype(np.int64) * 7 - 3,
    "repeated int64": RNG.integers(-5, 40, 10_000),
    "int16 with both ends": np.array([32767, -32768, 0, 32767, -32768], dtype=np.int16),
    "uint64 above int64": np.array([2**64 - 1, 0, 2**63, 2**64 - 1], dtype=np.uint64),
    "int8": RNG.integers(-128, 127, 1_000).astype(np.int8),
    "bool": np.array([True, False, True]),
    "2-D (flattened)": RNG.integers(0, 9, (40, 30)),
    "text": np.array(["06", "01", "72", "06", "", "1"]),
    "objects (strings)": np.array(["0601", "01", "0601", "9"], dtype=object),
    "empty": np.zeros(0, dtype=np.int64),
    "one": np.array([5]),
    "floats with NaN (np.unique's own path)": np.array([1.5, np.nan, -0.0, 0.0, np.nan, 1.5]),
}


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_unique_is_np_unique(values: np.ndarray) -> None:
    got, want = unique(values), np.unique(values)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_unique_takes_lists_and_does_not_change_its_input() -> None:
    values = np.array([3, 1, 3, 2])
    np.testing.assert_array_equal(unique(values), [1, 2, 3])
    np.testing.assert_array_equal(values, [3, 1, 3, 2])
    np.testing.assert_array_equal(unique([4, 4, 0]), [0, 4])
