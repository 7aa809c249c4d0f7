"""The race/ethnicity characteristic-iteration index, built once from the four public files.

A person's iterations at iteration level L (the flat map g of the paper, per geography):

- alone iterations = ∩ over the person's race codes of each code's ALONE=True level-L race iterations;
- alone-or-in-combination iterations = ∪ over the person's race codes of each code's ALONE=False iterations;
- ethnicity iterations = the level-L ethnicity iterations of the person's QSPAN code;
- the person's iterations = the union of the three (they are disjoint: an iteration is either alone or not,
  and
  race and ethnicity iteration codes are required to be distinct).

Stability (W7, ST4): :func:`stability_bound` computes from the files an upper bound on |g_L(r)| over the whole record
domain (every combination of ≤ max_race_codes distinct codes and every QSPAN code), and it is exact when every code maps
to at most one alone and one alone-or-in-combination iteration per level (true of the 2020 files; tested).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.arrays import unique

CODES_FILE = "race-and-ethnicity-codes.txt"
RACE_ITER_FILE = "race-characteristic-iterations.txt"
ETH_ITER_FILE = "ethnicity-characteristic-iterations.txt"
CODE_TO_ITER_FILE = "race-and-ethnicity-code-to-iteration.txt"
ITERATION_FILES = (CODES_FILE, RACE_ITER_FILE, ETH_ITER_FILE, CODE_TO_ITER_FILE)

#: the packaged real 2020 files (public domain, U.S. Census Bureau; see data/PROVENANCE.md)
PACKAGED_DIR = Path(__file__).parent / "data"

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _read(path: Path, columns: list[str]) -> pd.DataFrame:
    if not path.is_file():
        raise InputError("file not found", file=str(path))
    df = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False, na_filter=False)
    df.columns = [c.strip() for c in df.columns]
    if list(df.columns) != columns:
        raise InputError(f"header must be {'|'.join(columns)}, got {'|'.join(df.columns)}", file=str(path),
                         row=1)
    out: pd.DataFrame = df.apply(lambda s: s.str.strip())
    return out


def _bad(df: pd.DataFrame, mask: pd.Series, path: Path, column: str, what: str) -> None:
    if bool(mask.any()):
        i = int(np.flatnonzero(mask.to_numpy())[0])
        raise InputError(f"{what}: {df[column].iloc[i]!r}", file=str(path), row=i + 2, column=column)


@dataclass(frozen=True)
class LevelIndex:
    """Iterations of one iteration level and each code's maps into them (CSR over code indices).

    ``iteration_codes`` lists the level's race iterations then its ethnicity iterations; ``total_only`` marks the
    DETAILED_ONLY iterations (the paper's TotalOnly set), ``coarse_only`` the COARSE_ONLY ones (None = none).
    """

    level: int
    iteration_codes: npt.NDArray[np.str_]
    iteration_names: npt.NDArray[np.str_]
    total_only: BoolArray
    is_race: BoolArray
    alone_ptr: IntArray
    alone_idx: IntArray
    aoic_ptr: IntArray
    aoic_idx: IntArray
    eth_ptr: IntArray
    eth_idx: IntArray
    coarse_only: BoolArray | None = None

    @property
    def n_iterations(self) -> int:
        return len(self.iteration_codes)

    def restrict(self, keep: BoolArray) -> LevelIndex:
        """The level with only the iterations where ``keep`` (order kept, indices renumbered).

        Every part of the flat map is a set operation per code (alone = ∩, in-combination = ∪, ethnicity = the
        code's list), and intersecting with a fixed set commutes with ∩ and ∪, so the restricted level's flat
        map of any record is exactly the full flat map of that record intersected with the kept iterations."""
        new_pos = np.cumsum(keep).astype(np.int64) - 1

        def csr(ptr: IntArray, idx: IntArray) -> tuple[IntArray, IntArray]:
            kept = keep[idx]
            owner = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))[kept]
            out = np.zeros(len(ptr), dtype=np.int64)
            np.cumsum(np.bincount(owner, minlength=len(ptr) - 1), out=out[1:])
            return out, new_pos[idx[kept]]

        a_ptr, a_idx = csr(self.alone_ptr, self.alone_idx)
        o_ptr, o_idx = csr(self.aoic_ptr, self.aoic_idx)
        e_ptr, e_idx = csr(self.eth_ptr, self.eth_idx)
        co = None if self.coarse_only is None else self.coarse_only[keep]
        return replace(self, iteration_codes=self.iteration_codes[keep], iteration_names=self.iteration_names[keep],
                       total_only=self.total_only[keep], is_race=self.is_race[keep], alone_ptr=a_ptr,
                       alone_idx=a_idx, aoic_ptr=o_ptr, aoic_idx=o_idx, eth_ptr=e_ptr, eth_idx=e_idx,
                       coarse_only=co)

    def for_granularity(self, iteration_set: str) -> LevelIndex:
        """The iterations a region type of this granularity tabulates (Census ``REGION_GRANULARITY_MAPPING``
        with the flat-map filters of ``safetab_p_analytics``): ``"detailed"`` → COARSE_ONLY = False;
        ``"coarse"`` → DETAILED_ONLY = False; ``"all"`` → every iteration (granularity rule off)."""
        if iteration_set == "all":
            return self
        if iteration_set == "detailed":
            coarse = self.coarse_only if self.coarse_only is not None else np.zeros(self.n_iterations, bool)
            return self.restrict(~coarse)
        if iteration_set == "coarse":
            return self.restrict(~self.total_only)
        raise ValueError(f"unknown iteration set {iteration_set!r}")


@dataclass(frozen=True)
class IterationIndex:
    """The parsed, validated iteration files: code list and one :class:`LevelIndex` per level 1, 2."""

    codes: npt.NDArray[np.str_]
    code_lookup: IntArray  # int(code) -> code index, -1 if not a code (codes are 4-digit numbers)
    levels: dict[int, LevelIndex]
    source: str

    def encode(self, values: npt.NDArray[np.int64]) -> IntArray:
        """Integer code values → code indices (−1 where not in the code list; values must be in 0..9999)."""
        return self.code_lookup[values]


def _csr(code_idx: IntArray, iter_idx: IntArray, n_codes: int) -> tuple[IntArray, IntArray]:
    order = np.lexsort((iter_idx, code_idx))
    ptr = np.zeros(n_codes + 1, dtype=np.int64)
    np.cumsum(np.bincount(code_idx, minlength=n_codes), out=ptr[1:])
    return ptr, iter_idx[order].astype(np.int64)


def load_iterations(directory: str | Path) -> IterationIndex:
    """Read and validate the four iteration files in ``directory`` (InputError with file/row/column)."""
    d = Path(directory)
    codes = _read(d / CODES_FILE, ["RACE_ETH_CODE", "RACE_ETH_NAME"])
    race = _read(d / RACE_ITER_FILE,
                 ["ITERATION_CODE", "ITERATION_NAME", "LEVEL", "ALONE", "DETAILED_ONLY", "COARSE_ONLY"])
    eth = _read(d / ETH_ITER_FILE,
                ["ITERATION_CODE", "ITERATION_NAME", "LEVEL", "DETAILED_ONLY", "COARSE_ONLY"])
    mapping = _read(d / CODE_TO_ITER_FILE, ["ITERATION_CODE", "RACE_ETH_CODE"])

    p = d / CODES_FILE
    _bad(codes, ~codes.RACE_ETH_CODE.str.fullmatch(r"\d{4}"), p, "RACE_ETH_CODE", "not a 4-digit code")
    _bad(codes, codes.RACE_ETH_CODE.duplicated(), p, "RACE_ETH_CODE", "duplicate code")
    for df, path in ((race, d / RACE_ITER_FILE), (eth, d / ETH_ITER_FILE)):
        _bad(df, ~df.ITERATION_CODE.str.fullmatch(r"\d+"), path, "ITERATION_CODE", "not an iteration code")
        _bad(df, df.ITERATION_CODE.duplicated(), path, "ITERATION_CODE", "duplicate iteration code")
        _bad(df, ~df.LEVEL.isin(["0", "1", "2"]), path, "LEVEL", "LEVEL must be 0, 1 or 2")
        used = df.LEVEL != "0"
        cols = ["DETAILED_ONLY", "COARSE_ONLY"] + (["ALONE"] if "ALONE" in df.columns else [])
        for col in cols:
            _bad(df, used & ~df[col].isin(["True", "False"]), path, col, "must be True or False")
        if "ALONE" in df.columns:
            _bad(df, ~df.ALONE.isin(["True", "False"]), path, "ALONE", "must be True or False")
    _bad(eth, eth.ITERATION_CODE.isin(race.ITERATION_CODE), d / ETH_ITER_FILE, "ITERATION_CODE",
         "iteration code also used by a race iteration")
    mp = d / CODE_TO_ITER_FILE
    known_iter = pd.concat([race.ITERATION_CODE, eth.ITERATION_CODE])
    _bad(mapping, ~mapping.ITERATION_CODE.isin(known_iter), mp, "ITERATION_CODE", "unknown iteration code")
    _bad(mapping, ~mapping.RACE_ETH_CODE.isin(codes.RACE_ETH_CODE), mp, "RACE_ETH_CODE", "unknown code")
    _bad(mapping, mapping.duplicated(), mp, "RACE_ETH_CODE", "duplicate row")

    code_values = codes.RACE_ETH_CODE.to_numpy(dtype=str)
    lookup = np.full(10000, -1, dtype=np.int64)
    lookup[code_values.astype(np.int64)] = np.arange(len(code_values))
    n_codes = len(code_values)
    code_pos = pd.Series(np.arange(n_codes), index=code_values)

    levels: dict[int, LevelIndex] = {}
    for lv in (1, 2):
        r = race[str(lv) == race.LEVEL]
        e = eth[str(lv) == eth.LEVEL]
        it_codes = np.concatenate([r.ITERATION_CODE.to_numpy(dtype=str),
                                   e.ITERATION_CODE.to_numpy(dtype=str)])
        names = np.concatenate([r.ITERATION_NAME.to_numpy(dtype=str), e.ITERATION_NAME.to_numpy(dtype=str)])
        total_only = np.concatenate([(r.DETAILED_ONLY == "True").to_numpy(),
                                     (e.DETAILED_ONLY == "True").to_numpy()])
        coarse_only = np.concatenate([(r.COARSE_ONLY == "True").to_numpy(), (e.COARSE_ONLY == "True").to_numpy()])
        is_race = np.concatenate([np.ones(len(r), bool), np.zeros(len(e), bool)])
        alone = np.concatenate([(r.ALONE == "True").to_numpy(), np.zeros(len(e), bool)])
        it_pos = pd.Series(np.arange(len(it_codes)), index=it_codes)
        m = mapping[mapping.ITERATION_CODE.isin(it_codes)]
        ci = code_pos[m.RACE_ETH_CODE.to_numpy()].to_numpy().astype(np.int64)
        ii = it_pos[m.ITERATION_CODE.to_numpy()].to_numpy().astype(np.int64)
        sel_alone = is_race[ii] & alone[ii]
        sel_aoic = is_race[ii] & ~alone[ii]
        sel_eth = ~is_race[ii]
        a_ptr, a_idx = _csr(ci[sel_alone], ii[sel_alone], n_codes)
        o_ptr, o_idx = _csr(ci[sel_aoic], ii[sel_aoic], n_codes)
        e_ptr, e_idx = _csr(ci[sel_eth], ii[sel_eth], n_codes)
        levels[lv] = LevelIndex(lv, it_codes, names, total_only, is_race, a_ptr, a_idx, o_ptr, o_idx,
                                e_ptr, e_idx, coarse_only)
    return IterationIndex(code_values, lookup, levels, str(d))


def packaged_iterations() -> IterationIndex:
    """The real 2020 iteration files shipped with dasflow."""
    return load_iterations(PACKAGED_DIR)


def _explode(ptr: IntArray, idx: IntArray, rows: IntArray, code: IntArray) -> tuple[IntArray, IntArray]:
    """For (row, code) pairs, all (row, iteration) pairs of the code's CSR list (vectorised)."""
    start = ptr[code]
    n = ptr[code + 1] - start
    rep = np.repeat(np.arange(len(code)), n)
    offs = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return rows[rep], idx[start[rep] + offs]


def race_iterations(level: LevelIndex, combos: IntArray) -> tuple[IntArray, IntArray]:
    """Flat map of race-code combinations to race iterations, as CSR (ptr over combos, iteration indices).

    ``combos`` is (n, k) of code indices, each row's distinct codes first and −1 after them (no duplicates).
    Alone = ∩ (an iteration kept iff every one of the row's codes maps to it), in-combination = ∪.
    """
    n, k = combos.shape
    n_it = level.n_iterations
    valid = combos >= 0
    n_codes = valid.sum(axis=1)
    rows_all = np.repeat(np.arange(n, dtype=np.int64)[:, None], k, axis=1)[valid]
    codes_all = combos[valid].astype(np.int64)
    r_o, i_o = _explode(level.aoic_ptr, level.aoic_idx, rows_all, codes_all)
    aoic_keys = unique(r_o * n_it + i_o)
    r_a, i_a = _explode(level.alone_ptr, level.alone_idx, rows_all, codes_all)
    akeys, counts = np.unique(r_a * n_it + i_a, return_counts=True)
    alone_keys = akeys[counts == n_codes[akeys // n_it]]
    keys = np.sort(np.concatenate([alone_keys, aoic_keys]))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // n_it, minlength=n), out=ptr[1:])
    return ptr, keys % n_it


def stability_bound(level: LevelIndex, max_race_codes: int) -> int:
    """max over all records r of |g_L(r)| (an upper bound, exact for ≤ 1 alone and ≤ 1 AOIC iteration per
    code).

    Records are (≤ R distinct race codes, one QSPAN code). Cases:
    one race code c: |A(c)| + |B(c)|; k ≥ 2 codes with ∩A = ∅: |∪B| ≤ min(top-R Σ|B|, #distinct B iterations);
    k ≥ 2 codes sharing alone iteration α: |∩A| ≤ max_{c∈C_α}|A(c)| and |∪B| ≤ the same cover bound restricted
    to C_α = codes whose alone set contains α. Plus h_e = max_c |E(c)| for the QSPAN code.
    """
    R = max_race_codes
    n_codes = len(level.alone_ptr) - 1
    a = np.diff(level.alone_ptr)
    b = np.diff(level.aoic_ptr)
    h_e = int(np.diff(level.eth_ptr).max(initial=0))
    best = int((a + b).max(initial=0))

    def cover(code_ids: IntArray) -> int:
        if len(code_ids) == 0:
            return 0
        top = int(np.sort(b[code_ids])[::-1][:R].sum())
        _, its = _explode(level.aoic_ptr, level.aoic_idx, np.zeros(len(code_ids), np.int64), code_ids)
        return min(top, len(unique(its)))

    if R >= 2 and n_codes >= 2:
        best = max(best, cover(np.arange(n_codes, dtype=np.int64)))
        owner = np.repeat(np.arange(n_codes, dtype=np.int64), a)
        for alpha in unique(level.alone_idx):
            members = owner[level.alone_idx == alpha]
            if len(members) >= 2:
                best = max(best, int(a[members].max()) + cover(members))
    return best + h_e


def spec_formula_stability(level: LevelIndex, max_race_codes: int) -> int:
    """The production formula h_r · max(2, R) + h_e (h_r = max per-code count of alone or of AOIC
    iterations)."""
    h_r = int(max(np.diff(level.alone_ptr).max(initial=0), np.diff(level.aoic_ptr).max(initial=0)))
    h_e = int(np.diff(level.eth_ptr).max(initial=0))
    return h_r * max(2, max_race_codes) + h_e
