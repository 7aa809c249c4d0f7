"""Iteration index on the real 2020 files: semantics (ST3), computed stability (ST4, W7), file validation."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from dasflow.errors import InputError
from dasflow.products.safetab_p.iterations import (
    LevelIndex,
    load_iterations,
    race_iterations,
    spec_formula_stability,
    stability_bound,
)
from dasflow.products.safetab_p.records import encode_combos
from tests.safetab_p.helpers import PACKAGE_DATA, real_iterations, write_dir


def person_iterations(index, level: int, races: list[str], qspan: str) -> set[str]:
    """The flat map of one person through the product's vectorised code path."""
    li = index.levels[level]
    codes = index.encode(np.array([int(c) for c in races], dtype=np.int64))
    row = np.full((1, 8), -1, dtype=np.int64)
    row[0, : len(codes)] = codes
    _, combos = encode_combos(row)
    ptr, idx = race_iterations(li, combos)
    eth = index.encode(np.array([int(qspan)]))[0]
    out = set(li.iteration_codes[idx[ptr[0]:ptr[1]]])
    out |= set(li.iteration_codes[li.eth_idx[li.eth_ptr[eth]:li.eth_ptr[eth + 1]]])
    return out


def test_real_files_counts():
    """The real 2020 files: 1,755 codes, 3,016 race + 38 ethnicity iterations (3,017 lines incl. a blank one),
    14,088 code→iteration rows; LEVEL 0 ignored."""
    index = real_iterations()
    assert len(index.codes) == 1755
    n1, n2 = index.levels[1].n_iterations, index.levels[2].n_iterations
    assert n1 == 48 + 4 and n2 == 2914 + 30
    assert int(index.levels[2].total_only.sum()) == 437 + 354 + 3
    rows = sum(len(li.alone_idx) + len(li.aoic_idx) + len(li.eth_idx) for li in index.levels.values())
    assert rows < 14088  # level-0 rows are not in the index


def test_st3_one_code_non_hispanic():
    """ST3: one race code (Slovak 1340), QSPAN 9950 (Not Hispanic checkbox: no level-1/2 ethnicity
    iteration)."""
    index = real_iterations()
    assert person_iterations(index, 1, ["1340"], "9950") == {"1002", "1113"}  # European alone / AOIC
    assert person_iterations(index, 2, ["1340"], "9950") == {"1061", "1172"}  # Slovak alone / AOIC


def test_st3_two_codes_hispanic():
    """ST3: Slovak + Albanian: alone = ∩ (European alone survives at level 1, nothing at level 2), AOIC = ∪;
    QSPAN 2020 (Mexican American) adds the level-2 ethnicity iteration 4015 Mexican."""
    index = real_iterations()
    assert person_iterations(index, 1, ["1340", "1010"], "2020") == {"1002", "1113"}
    assert person_iterations(index, 2, ["1340", "1010"], "2020") == {"1172", "1114", "4015"}
    # order of the codes does not matter
    assert person_iterations(index, 2, ["1010", "1340"], "2020") == {"1172", "1114", "4015"}


def test_st3_eight_codes_reach_the_stability():
    """ST3: eight codes from eight groups: no alone iteration, 8 AOIC at level 2 + Mexican = 9 = s."""
    index = real_iterations()
    races = ["1340", "3105", "5454", "6050", "7030", "4001", "8000", "2020"]
    lv2 = person_iterations(index, 2, races, "2010")
    assert lv2 == {"1172", "1294", "2749", "3045", "1185", "3876", "4012", "4006", "4015"}
    assert len(lv2) == stability_bound(index.levels[2], 8) == 9
    lv1 = person_iterations(index, 1, races, "2010")
    assert lv1 == {"1113", "1293", "2562", "2833", "1182", "3864", "4003"}


def test_st4_stability_real_files_computed():
    """ST4: computed stability of the real files: 9 at both levels (the paper's s), equal to the production
    formula h_r·max(2, R) + h_e; it shrinks with max_race_codes."""
    index = real_iterations()
    for lv in (1, 2):
        assert stability_bound(index.levels[lv], 8) == 9
        assert spec_formula_stability(index.levels[lv], 8) == 9
    assert stability_bound(index.levels[2], 2) == 3
    assert stability_bound(index.levels[2], 1) == 3  # one code: alone + AOIC + ethnicity


def _random_level(rng: np.random.Generator, n_codes: int, n_iter: int, max_per: int) -> LevelIndex:
    def csr(kmax: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        lists = [np.sort(rng.choice(np.arange(lo, hi), size=rng.integers(0, kmax + 1), replace=False))
                 for _ in range(n_codes)]
        ptr = np.zeros(n_codes + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(x) for x in lists])
        return ptr, np.concatenate(lists).astype(np.int64) if lists else np.zeros(0, np.int64)

    a_ptr, a_idx = csr(max_per, 0, n_iter)
    o_ptr, o_idx = csr(max_per, n_iter, 2 * n_iter)
    e_ptr, e_idx = csr(1, 2 * n_iter, 2 * n_iter + 2)
    n = 2 * n_iter + 2
    return LevelIndex(1, np.array([str(i) for i in range(n)]), np.array([""] * n), np.zeros(n, bool),
                      np.arange(n) < 2 * n_iter, a_ptr, a_idx, o_ptr, o_idx, e_ptr, e_idx)


@pytest.mark.parametrize("seed", range(12))
def test_st4_stability_bound_brute_force(seed: int):
    """ST4 by enumeration of the whole record domain on random small iteration definitions: the bound is
    ≥ max |g(r)|, and equal to it when each code has ≤ 1 alone and ≤ 1 AOIC iteration."""
    rng = np.random.default_rng(seed)
    max_per = 1 if seed % 2 == 0 else 3
    n_codes, R = 6, 3
    level = _random_level(rng, n_codes, 4, max_per)
    combos = [c for k in range(1, R + 1) for c in itertools.combinations(range(n_codes), k)]
    arr = np.full((len(combos), 8), -1, dtype=np.int64)
    for i, c in enumerate(combos):
        arr[i, : len(c)] = c
    ptr, _ = race_iterations(level, arr)
    h_e = int(np.diff(level.eth_ptr).max())
    brute = int(np.diff(ptr).max()) + h_e
    bound = stability_bound(level, R)
    assert bound >= brute
    if max_per == 1:
        assert bound == brute


def test_iteration_file_validation(tmp_path: Path):
    """Bad iteration files are rejected with file, row and column."""
    d = write_dir(tmp_path / "it", iteration_dir=PACKAGE_DATA)
    p = d / "race-characteristic-iterations.txt"
    lines = p.read_text().splitlines()
    lines[3] = lines[3].replace("|2|True|", "|7|True|", 1)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as exc:
        load_iterations(d)
    assert exc.value.row == 4 and exc.value.column == "LEVEL" and "race-characteristic" in str(exc.value)
    d2 = write_dir(tmp_path / "it2", iteration_dir=PACKAGE_DATA)
    m = d2 / "race-and-ethnicity-code-to-iteration.txt"
    m.write_text(m.read_text() + "1001|0042\n")
    with pytest.raises(InputError) as exc2:
        load_iterations(d2)
    assert exc2.value.column == "RACE_ETH_CODE" and exc2.value.row == 14090
