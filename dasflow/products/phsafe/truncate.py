"""``truncate_and_join`` (phsafe.md Algorithm 3, R7): keep ≤ τ persons per MAFID, drop duplicated units, join.

Privacy argument (Lemma 6). Person truncation keeps, for each MAFID, the first τ person records under a FIXED
total order on the universe of records; adding or removing one person record can then change the kept set by
at most 2 records (the record itself and the one it displaces), so the truncation is 2-stable and leaves a MAFID
multiplicity ≤ τ. ``DropNonUnique`` removes every unit record whose MAFID occurs more than once: 1-stable on
unit records, multiplicity ≤ 1; since one person's change re-derives their unit record (old out, new in) the
unit side is 2-stable in base persons. The inner join is therefore (τ·2 + 1·2) = (2τ+2)-stable.

The order is content-based, never positional: records are sorted by (MAFID, h(record), record fields), where h is
a fixed, unsalted 64-bit mixing hash (splitmix64 finaliser, fixed key) of the record's fields. The kept set
therefore depends only on the multiset of records: it is invariant to row order and partitioning, and identical
records are interchangeable, so which copy is kept cannot be observed. Python's per-process salted ``hash()``
is not used anywhere. Hashing (rather than sorting by, e.g., age) makes the truncated persons a pseudo-random
subset of a large household, so truncation bias is not systematically concentrated on one age or relationship.
Production computes the order only where it can matter (:func:`grouped_content_order`: households larger than
the smallest τ); the kept multiset is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Fixed (public, data-independent) key of the truncation order. Changing it changes which persons of a
#: household larger than τ are kept, never the privacy guarantee.
TRUNCATION_KEY = np.uint64(0x5048_5361_6665_3230)  # "PHSafe20"

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _fmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijection on uint64 with good avalanche."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return np.asarray(x ^ (x >> np.uint64(31)))


def record_hash(fields: Sequence[np.ndarray], key: np.uint64 = TRUNCATION_KEY) -> np.ndarray:
    """A vectorised, unsalted 64-bit hash of each record (row) of ``fields`` (integer columns)."""
    if not fields:
        raise ValueError("record_hash needs at least one field")
    n = len(fields[0])
    h = np.full(n, key, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for f in fields:
            h = _fmix64(h ^ (np.asarray(f).astype(np.int64).view(np.uint64) + _GOLDEN))
    return h


def content_order(mafid: np.ndarray, fields: Sequence[np.ndarray]) -> np.ndarray:
    """Row indices sorted by (MAFID, hash(record), record fields): a total order on distinct records.

    Sorts by (MAFID, hash) first; only if two DIFFERENT records of one MAFID share a 64-bit hash (a collision,
    practically never) does it fall back to the full lexicographic sort, so the result is always the exact
    (MAFID, hash, fields) order up to permutations of identical records.
    """
    h = record_hash([mafid, *fields])
    order = np.lexsort((h, mafid))
    m, hs = mafid[order], h[order]
    tie = np.flatnonzero((m[1:] == m[:-1]) & (hs[1:] == hs[:-1]))
    if tie.size:
        a, b = order[tie], order[tie + 1]
        if any(bool(np.any(np.asarray(f)[a] != np.asarray(f)[b])) for f in fields):
            keys = [*reversed([np.asarray(f) for f in fields]), h, mafid]  # np.lexsort: last key is primary
            order = np.lexsort(keys)
    return np.asarray(order)


def group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Start positions of the runs of equal values in a sorted array."""
    n = sorted_keys.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    start = np.empty(n, dtype=bool)
    start[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=start[1:])
    return np.flatnonzero(start)


def grouped_content_order(mafid: np.ndarray, fields: Sequence[np.ndarray],
                          min_tau: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Row indices grouped by ascending MAFID, in the content order of :func:`content_order` inside every MAFID
    with more than ``min_tau`` rows; also returns the positions (in that order) of those rows.

    For truncation at any τ ≥ ``min_tau`` this is the content order: a MAFID with at most ``min_tau`` (≤ τ)
    rows keeps all of them whatever their order, so only the larger households are hashed and sorted (the
    kept multiset, hence every count, is the one :func:`content_order` gives). Rows already grouped by
    MAFID are not re-sorted; otherwise the grouping sort's order among equal MAFIDs is immaterial for the
    same reason.
    """
    if min_tau < 1:
        raise ValueError("min_tau must be >= 1")
    n = mafid.size
    if n > 1 and bool(np.any(mafid[1:] < mafid[:-1])):
        order = np.argsort(mafid).astype(np.int64, copy=False)
    else:
        order = np.arange(n, dtype=np.int64)
    m = mafid[order]
    starts = group_starts(m)
    sizes = np.diff(np.append(starts, n))
    big = np.flatnonzero(np.repeat(sizes > min_tau, sizes))
    if big.size:
        rows = order[big]
        order[big] = rows[content_order(mafid[rows], [np.asarray(f)[rows] for f in fields])]
    return order, big


def rank_within_group(sorted_keys: np.ndarray) -> np.ndarray:
    """For an array sorted by group key, each element's 0-based position within its run of equal keys."""
    n = sorted_keys.size
    starts = group_starts(sorted_keys)
    sizes = np.diff(np.append(starts, n))
    rank: np.ndarray = np.arange(n, dtype=np.int64) - np.repeat(starts, sizes)
    return rank


def truncate_persons(mafid: np.ndarray, tau: int, order: np.ndarray) -> np.ndarray:
    """Indices of the persons kept: the first ``tau`` of each MAFID under ``order`` (a content order)."""
    if tau <= 0:
        raise ValueError("tau must be > 0")
    m = mafid[order]
    return order[rank_within_group(m) < tau]


def drop_non_unique(mafid: np.ndarray) -> np.ndarray:
    """Indices of the units whose MAFID occurs exactly once (every copy of a duplicated MAFID is dropped)."""
    uniq, inverse, counts = np.unique(mafid, return_inverse=True, return_counts=True)
    del uniq
    return np.flatnonzero(counts[inverse] == 1)


def inner_join(p_mafid: np.ndarray, p_rows: np.ndarray, u_mafid: np.ndarray,
               u_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inner join of persons ``p_rows`` with units ``u_rows`` (unique MAFIDs) on MAFID -> (person, unit)
    rows."""
    um = u_mafid[u_rows]
    srt = np.argsort(um, kind="stable")
    um_sorted = um[srt]
    pm = p_mafid[p_rows]
    pos = np.searchsorted(um_sorted, pm)
    pos_c = np.minimum(pos, max(um_sorted.size - 1, 0))
    hit = (pos < um_sorted.size) & (um_sorted[pos_c] == pm) if um_sorted.size else np.zeros(pm.size, bool)
    return p_rows[hit], u_rows[srt[pos_c[hit]]]


def truncate_and_join(p_mafid: np.ndarray, p_fields: Sequence[np.ndarray], u_mafid: np.ndarray, tau: int,
                      order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3: returns matching (person row, unit row) index arrays of the (2τ+2)-stable join.

    ``p_fields`` are the person record's fields (besides MAFID) that define its content order; ``order`` may be
    passed precomputed (``content_order`` restricted to these rows, in order) to share one sort across tables.
    """
    if order is None:
        order = content_order(p_mafid, p_fields)
    kept = truncate_persons(p_mafid, tau, order)
    units = drop_non_unique(u_mafid)
    return inner_join(p_mafid, kept, u_mafid, units)
