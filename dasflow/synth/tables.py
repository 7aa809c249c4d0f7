"""Arrow tables of a chunk in the generator's canonical (integer-coded) schema, and the census text
formatting.

Canonical schema (what the Parquet datasets hold; codes are the Census codes stored as integers):

* persons: MAFID, RTYPE (3/5), QAGE, QSEX (1 M, 2 F), RELSHIP (20-38), CENHISP (1/2), QSPAN, CENRACE (1-63),
  QRACE1..QRACE8 (null after the last code), HOUSEHOLDER (bool)
* units: MAFID, RTYPE (2 HU / 4 GQ), GQTYPE (3-digit, 0 for HU), HHGQ (0 HU, 1-7 GQ major type), FINAL_POP,
  NPF, HHSPAN, HHRACE (0 = "00"), TEN, HHT, HHT2, CPLT
* geo (one row per unit): MAFID, RTYPE, TABBLKST (str), TABBLKCOU, TABTRACTCE, TABBLK, TABBLKGRPCE, REGIONCE,
  DIVISIONCE, PLACEFP, COUSUBFP, AIANNHCE
* grfc (one row per block): TABBLKST (str), TABBLKCOU, TABTRACTCE, TABBLK, PLACEFP, AIANNHCE, TABBLKGRPCE,
  COUSUBFP
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from dasflow.synth.geography import StateGeography
from dasflow.synth.population import Chunk
from dasflow.synth.reference import states


def _const_str(value: str, n: int) -> pa.Array:
    """A string column holding ``value`` n times, built from its buffers (no per-row work beyond two fills)."""
    raw = value.encode("utf-8")
    offsets = np.arange(0, len(raw) * (n + 1), len(raw), dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def persons_table(c: Chunk) -> pa.Table:
    cols: dict[str, pa.Array] = {
        "MAFID": pa.array(c.unit_mafid[c.person_unit]),
        "RTYPE": pa.array(c.rtype),
        "QAGE": pa.array(c.qage),
        "QSEX": pa.array(c.qsex),
        "RELSHIP": pa.array(c.relship),
        "CENHISP": pa.array(c.cenhisp),
        "QSPAN": pa.array(c.qspan),
        "CENRACE": pa.array(c.cenrace),
    }
    for j in range(8):
        q = c.qrace[j]
        cols[f"QRACE{j + 1}"] = pa.array(q, mask=q == 0)
    cols["HOUSEHOLDER"] = pa.array(c.householder)
    return pa.table(cols)


def units_table(c: Chunk) -> pa.Table:
    return pa.table(
        {
            "MAFID": c.unit_mafid,
            "RTYPE": c.unit_rtype,
            "GQTYPE": c.unit_gqtype,
            "HHGQ": c.unit_hhgq,
            "FINAL_POP": c.unit_final_pop,
            "NPF": c.unit_npf,
            "HHSPAN": c.unit_hhspan,
            "HHRACE": c.unit_hhrace,
            "TEN": c.unit_ten,
            "HHT": c.unit_hht,
            "HHT2": c.unit_hht2,
            "CPLT": c.unit_cplt,
        }
    )


def block_columns(geo: StateGeography, block: npt.NDArray[np.int64]) -> dict[str, npt.NDArray[np.integer[Any]]]:
    """Integer geography columns for the given block indices."""
    t = geo.block_tract[block]
    return {
        "TABBLKCOU": geo.county_fips[geo.tract_county[t]].astype(np.int16),
        "TABTRACTCE": geo.tract_code[t],
        "TABBLK": geo.block_code[block],
        "TABBLKGRPCE": geo.block_group[block],
        "PLACEFP": geo.block_place[block],
        "COUSUBFP": geo.block_cousub[block],
        "AIANNHCE": geo.block_aiannh[block],
    }


def geo_table(c: Chunk, geo: StateGeography) -> pa.Table:
    st = states()[geo.state]
    n = c.n_units
    b = block_columns(geo, c.unit_block)
    return pa.table(
        {
            "MAFID": c.unit_mafid,
            "RTYPE": c.unit_rtype,
            "TABBLKST": _const_str(geo.state, n),
            "TABBLKCOU": b["TABBLKCOU"],
            "TABTRACTCE": b["TABTRACTCE"],
            "TABBLK": b["TABBLK"],
            "TABBLKGRPCE": b["TABBLKGRPCE"],
            "REGIONCE": np.full(n, st.region, np.int8),
            "DIVISIONCE": np.full(n, st.division, np.int8),
            "PLACEFP": b["PLACEFP"],
            "COUSUBFP": b["COUSUBFP"],
            "AIANNHCE": b["AIANNHCE"],
        }
    )


def grfc_table(geo: StateGeography) -> pa.Table:
    b = block_columns(geo, np.arange(geo.n_blocks, dtype=np.int64))
    return pa.table(
        {
            "TABBLKST": _const_str(geo.state, geo.n_blocks),
            "TABBLKCOU": b["TABBLKCOU"],
            "TABTRACTCE": b["TABTRACTCE"],
            "TABBLK": b["TABBLK"],
            "PLACEFP": b["PLACEFP"],
            "AIANNHCE": b["AIANNHCE"],
            "TABBLKGRPCE": b["TABBLKGRPCE"],
            "COUSUBFP": b["COUSUBFP"],
        }
    )


# ---- census text formatting ------------------------------------------------------------------------------


@cache
def _labels(width: int, size: int, null_label: str | None = None) -> pa.Array:
    """``f"{i:0{width}d}"`` for ``i < size`` (``null_label`` for 0), built by numpy's string functions."""
    lab = np.char.zfill(np.arange(size).astype(str), width)
    if null_label is not None:
        lab = lab.astype(np.result_type(lab.dtype, np.array([null_label]).dtype))
        lab[0] = null_label
    return pa.array(lab, type=pa.string())


def zfill(values: npt.NDArray[np.integer[Any]], width: int, null_label: str | None = None) -> pa.Array:
    """Zero-padded strings of small non-negative integers (a table lookup, no per-row Python; the table's
    size is a power of two, so a few cached tables serve every state)."""
    v = np.asarray(values)
    if v.size == 0:
        return pa.array([], type=pa.string())
    top = int(v.max()) + 1
    if top <= 1 << 17:
        size = 1 << max(10, (top - 1).bit_length())
        return _labels(width, size, null_label).take(pa.array(v.astype(np.int32)))
    uniq, inv = np.unique(v, return_inverse=True)
    lab = pa.array([f"{int(x):0{width}d}" if (null_label is None or x != 0) else null_label for x in uniq])
    return lab.take(pa.array(inv.astype(np.int32)))


def plain(values: npt.NDArray[np.integer[Any]]) -> pa.Array:
    """Unpadded integers as strings (what a CSV writer would print)."""
    return pa.array(np.asarray(values)).cast(pa.string())


@cache
def _bool_labels() -> pa.Array:
    return pa.array(["False", "True"])


def bool_str(values: npt.NDArray[np.bool_]) -> pa.Array:
    return _bool_labels().take(pa.array(np.asarray(values).astype(np.int8)))
