"""T1's release order: ``tables`` sorts stably by (REGION_TYPE, REGION_ID, ITERATION_CODE) whatever order its
input has, and skips the sort only when the rows are already in that order (``postprocess`` hands them so)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasflow.products.safetab_p import outputs

KEYS = ["REGION_TYPE", "REGION_ID", "ITERATION_CODE"]


def _t1(n: int, seed: int) -> pd.DataFrame:
    g = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "REGION_ID": g.choice(["01", "0100", "02", "1", "10", "9"], n),
        "REGION_TYPE": g.choice(["COUNTY", "STATE", "TRACT"], n),
        "ITERATION_CODE": g.choice(["0001", "001", "1", "A1", "a"], n),
        "COUNT": g.integers(-5, 50, n),
    })
    return frame.astype({c: str for c in KEYS})


def _estimates(t1: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {"t1": t1, "t2": pd.DataFrame(columns=outputs.T2_COLUMNS)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tables_sorts_like_a_stable_sort(seed: int) -> None:
    t1 = _t1(400, seed)  # many ties: the stable order of equal keys (their COUNTs) is checked too
    expected = t1[outputs.T1_COLUMNS].sort_values(KEYS, kind="stable").reset_index(drop=True)
    got = outputs.tables(_estimates(t1))["t1"]
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    assert not outputs._is_sorted(t1, KEYS)
    assert outputs._is_sorted(expected, KEYS)
    pd.testing.assert_frame_equal(outputs.tables(_estimates(expected))["t1"], expected, check_exact=True)


def test_is_sorted_sees_one_swap_in_any_column() -> None:
    base = _t1(200, 3).sort_values(KEYS, kind="stable").drop_duplicates(KEYS).reset_index(drop=True)
    assert outputs._is_sorted(base, KEYS)
    for i in range(len(base) - 1):
        swapped = base.copy()
        swapped.iloc[[i, i + 1]] = swapped.iloc[[i + 1, i]].to_numpy()
        assert not outputs._is_sorted(swapped, KEYS), i


def test_non_arrow_text_is_sorted_by_pandas() -> None:
    t1 = _t1(100, 4).astype({c: object for c in KEYS})
    assert not outputs._is_sorted(t1.sort_values(KEYS, kind="stable"), KEYS)  # not Arrow text: no fast check
    expected = t1.sort_values(KEYS, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(outputs.tables(_estimates(t1))["t1"], expected, check_exact=True)
