"""Membership and position of GEOIDs in a fixed list (a census's blocks), record batch after record batch.

``pyarrow.compute.index_in`` / ``is_in`` build a hash table of the whole value set on every call: against the
2.44 M blocks of a 100 M-person census that is ≈ 0.7 CPU-s per call, so a check made once per batch of a million
records grew with persons × blocks. :class:`GeoidIndex` sorts the list once and answers each batch by binary
search on integer keys (public geography only: no record value is kept or reported).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

#: a GEOID as :class:`GeoidIndex` searches it numerically: state, county, tract and block codes, 15 digits
GEOID_DIGITS = 15


def geoid_keys(geoid: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """Block GEOIDs as int64 keys: a string of exactly ``GEOID_DIGITS`` ASCII digits is its integer (equal
    strings, equal keys, and only those), anything else (other text, null) −1."""
    if len(geoid) == 0:
        return np.zeros(0, dtype=np.int64)
    ok = pc.fill_null(pc.match_substring_regex(geoid, f"^[0-9]{{{GEOID_DIGITS}}}$"), False)
    text = pc.if_else(ok, geoid, pa.scalar("-1", type=geoid.type))
    out: npt.NDArray[np.int64] = np.asarray(pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False),
                                            dtype=np.int64)
    return out


class GeoidIndex:
    """Where record GEOIDs lie in a fixed list of GEOIDs (the spine's blocks, the public block list), batch after
    batch: 15-digit GEOIDs as int64 keys searched in one sorted copy built once, any other text looked up as text
    (``pyarrow.compute.index_in``). ``index_in`` alone rebuilds its hash table of the whole list on every call:
    0.71 CPU-s per million records against the 2.44 M blocks of a 100 M-person census, so per-batch calls grew
    with persons × blocks. Same answers: the position of the first equal GEOID in the list, −1 if none."""

    def __init__(self, values: pa.Array) -> None:
        self.values = values
        keys = geoid_keys(values)
        self._order = np.argsort(keys, kind="stable")
        self._keys = keys[self._order]

    def positions(self, geoid: pa.Array | pa.ChunkedArray,
                  keys: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
        """Each GEOID's position in the list (−1: absent); ``keys``: ``geoid_keys(geoid)`` when computed."""
        keys = geoid_keys(geoid) if keys is None else keys
        out = np.full(keys.size, -1, dtype=np.int64)
        if self._keys.size and keys.size:
            at = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
            hit = (self._keys[at] == keys) & (keys >= 0)
            out[hit] = self._order[at[hit]]
        odd = np.flatnonzero(keys < 0)
        if odd.size and len(self.values):
            found = pc.index_in(pc.take(geoid, pa.array(odd)), value_set=self.values)
            out[odd] = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        return out
