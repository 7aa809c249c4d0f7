"""PHSafe estimates on release frames: count tables, the PH1/PH5/PH8 averages and input errors (phsafe.md §3
"Statistical postprocessing", phsafe-production.md last section)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.postprocess.posterior import count_posterior, ratio_posterior
from dasflow.products.phsafe.estimates import (
    estimate_file_name,
    estimates_bytes,
    parse_release_file,
    phsafe_estimates,
    read_release_frames,
)

GROUPS = [("1", "USA", "*"), ("1", "USA", "A"), ("06", "STATE", "*")]


def _frame(table: str, cells: dict[int, list[int]], variance: float, iterated: bool = True) -> pd.DataFrame:
    rows = []
    for g, (rid, rtype, it) in enumerate(GROUPS):
        for cell, counts in cells.items():
            row: dict[str, object] = {"REGION_ID": rid, "REGION_TYPE": rtype}
            if iterated:
                row["ITERATION_CODE"] = it
            row |= {f"{table.upper()}_DATA_CELL": cell, "NOISE_DISTRIBUTION": "Discrete Gaussian",
                    "VARIANCE": variance * (2 if table == "PH8_num" and cell == 2 else 1), "COUNT": counts[g]}
            rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture
def frames() -> dict[str, pd.DataFrame]:
    return {
        "PH1_num": _frame("PH1_num", {2: [500, -30, 40], 3: [2400, 300, 90]}, 1700.0),
        "PH1_denom": _frame("PH1_denom", {1: [1500, -20, 60]}, 1000.0),
        "PH8_num": _frame("PH8_num", {2: [2000, 100, 50], 3: [1000, 20, -5]}, 1700.0),
        "PH8_denom": _frame("PH8_denom", {2: [1100, 40, 30], 3: [600, 10, 2]}, 1000.0),
        "PH2": _frame("PH2", {3: [900, 0, -12]}, 92401.68, iterated=False),
    }


def test_count_tables_get_truncated_normal_estimates(frames: dict[str, pd.DataFrame]) -> None:
    """Every released table gets per-cell estimates with the published COUNT/VARIANCE kept beside them."""
    est = phsafe_estimates(frames)
    ph2 = est["PH2"]
    assert list(ph2.columns) == ["REGION_ID", "REGION_TYPE", "PH2_DATA_CELL", "COUNT", "VARIANCE", "ESTIMATE",
                                 "LOWER_90", "UPPER_90"]
    post = count_posterior(frames["PH2"]["COUNT"].to_numpy(float), frames["PH2"]["VARIANCE"].to_numpy(float))
    np.testing.assert_array_equal(ph2["ESTIMATE"].to_numpy(), post.mean)
    assert (ph2["ESTIMATE"] > 0).all() and (ph2["LOWER_90"] >= 0).all()
    assert set(est) >= {"PH1_num", "PH1_denom", "PH8_num", "PH8_denom", "PH1", "PH8"}
    assert "PH5" not in est  # PH5 numerator/denominator not released here


def test_ph1_average_total_and_age_components(frames: dict[str, pd.DataFrame]) -> None:
    """PH1 cell 1 = (N2 + N3)/D with household bounds [1, 10]; cells 2, 3 = N2/D, N3/D with bounds [0, 10]."""
    ph1 = phsafe_estimates(frames)["PH1"]
    assert len(ph1) == 3 * len(GROUPS)
    assert list(ph1["PH1_DATA_CELL"][:3]) == [1, 2, 3]
    total = ph1[ph1["PH1_DATA_CELL"] == 1]
    want = ratio_posterior([2900, 270, 130], [3400] * 3, [1500, -20, 60], [1000] * 3, lo=1.0)
    np.testing.assert_allclose(total["ESTIMATE"], want.mean, rtol=1e-12)
    np.testing.assert_allclose(total["UPPER_90"], want.upper, rtol=1e-12)
    under18 = ph1[ph1["PH1_DATA_CELL"] == 2]
    want2 = ratio_posterior([500, -30, 40], [1700] * 3, [1500, -20, 60], [1000] * 3, lo=0.0)
    np.testing.assert_allclose(under18["ESTIMATE"], want2.mean, rtol=1e-12)
    assert (total["LOWER_90"] >= 1).all() and (ph1["UPPER_90"] <= 10).all() and (ph1["LOWER_90"] >= 0).all()


def test_ph8_average_has_its_own_denominators(frames: dict[str, pd.DataFrame]) -> None:
    """PH8 is not hierarchical: total = (Nown + Nrent)/(Down + Drent) with variances summed (owner's
    numerator variance is 2σ² as published); owner = Nown/Down; renter = Nrent/Drent."""
    ph8 = phsafe_estimates(frames)["PH8"]
    total = ph8[ph8["PH8_DATA_CELL"] == 1]
    want = ratio_posterior([3000, 120, 45], [5100] * 3, [1700, 50, 32], [2000] * 3, lo=1.0)
    np.testing.assert_allclose(total["ESTIMATE"], want.mean, rtol=1e-12)
    owner = ph8[ph8["PH8_DATA_CELL"] == 2]
    want_owner = ratio_posterior([2000, 100, 50], [3400] * 3, [1100, 40, 30], [1000] * 3, lo=1.0)
    np.testing.assert_allclose(owner["LOWER_90"], want_owner.lower, rtol=1e-12)


def test_bad_release_file_is_an_input_error_naming_row_and_column() -> None:
    text = (b"REGION_ID|REGION_TYPE|PH2_DATA_CELL|NOISE_DISTRIBUTION|VARIANCE|COUNT\n"
            b"1|USA|3|Discrete Gaussian|1.5|4\n06|STATE|3|Discrete Gaussian|1.5|x\n")
    with pytest.raises(InputError) as info:
        parse_release_file(text, "PH2.csv")
    assert info.value.row == 3 and info.value.column == "COUNT" and "PH2.csv" in str(info.value.file)
    with pytest.raises(InputError, match="VARIANCE"):
        parse_release_file(text.replace(b"1.5|x", b"-1|4"), "PH2.csv")


def test_missing_denominator_row_is_an_input_error(frames: dict[str, pd.DataFrame]) -> None:
    frames["PH1_denom"] = frames["PH1_denom"].iloc[:-1]
    frames["PH1_num"] = frames["PH1_num"].iloc[:-1]  # the third group now lacks cell 3 and its denominator
    with pytest.raises(InputError, match="PH1"):
        phsafe_estimates({k: v for k, v in frames.items() if k.startswith("PH1")} | {
            "PH1_denom": pd.concat([frames["PH1_denom"], frames["PH1_denom"].iloc[[-1]].assign(REGION_ID="06")])})


def test_store_round_trip_and_reproducible_bytes(tmp_path: object, frames: dict[str, pd.DataFrame]) -> None:
    """Frames read back from a release prefix give byte-identical estimate files on every run."""
    from pathlib import Path
    store = LocalStore(Path(str(tmp_path)))
    for table, frame in frames.items():
        store.put(f"runs/r/release/phsafe/{table}.csv", frame.to_csv(index=False, sep="|").encode())
    read = read_release_frames(store, "runs/r/release/phsafe")
    assert set(read) == set(frames)
    one = {k: estimates_bytes(v) for k, v in phsafe_estimates(read).items()}
    again = read_release_frames(store, "runs/r/release/phsafe/")
    two = {k: estimates_bytes(v) for k, v in phsafe_estimates(again).items()}
    assert one == two
    assert estimate_file_name("PH1") == "estimates/PH1.csv"
    assert one["PH1"].splitlines()[0] == (b"REGION_ID|REGION_TYPE|ITERATION_CODE|PH1_DATA_CELL|ESTIMATE|LOWER_90|"
                                          b"UPPER_90|NUMERATOR_ESTIMATE|DENOMINATOR_ESTIMATE")
