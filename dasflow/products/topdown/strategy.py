"""TopDown strategy: a Cartesian histogram schema, marginal query groups, exact shares α and β.

A *query group* (topdown-spine.md §1, S1) over the schema ``d_1 × … × d_k`` keeps a subset of the attributes
and sums out the others: its matrix is the Kronecker product ``⊗_i (I_{d_i} if i kept else 1ᵀ_{d_i})``, so
every column has exactly one 1 (the groups partition the cells). Cells are numbered row-major in schema order.

Privacy argument (Lemma 4 / Theorems 1 and 3): under the TDA change-one-record neighbours a moved record
changes at most two cells by ±1, so every query group has L2² sensitivity 2 (L1 sensitivity 2). A group with
share ``α`` at a geounit with share ``γ`` of a budget ρ is measured with the discrete Gaussian of variance
``σ² = Δ₂²/(2ργα) = 1/(ργα)`` (ε-DP: Laplace scale ``2/(εγα)``). Never the add/remove ``1/(2ρ)``. Shares are
exact rationals: floats are refused (S4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from dasflow.errors import InputError
from dasflow.strategy.topdown_weights import topdown_query_weights

IntArray = npt.NDArray[np.int64]

#: L2² (and L1) sensitivity of one query group under change-one-record neighbours (Lemma 4).
CHANGE_ONE_SENSITIVITY = Fraction(2)

#: PL 94-171 persons schema [EXT: Abowd et al. 2022; DAS PL94 config]: 8 × 2 × 2 × 63 = 2,016 cells.
PL94_SCHEMA: tuple[tuple[str, int], ...] = (("HHGQ", 8), ("VOTINGAGE", 2), ("HISPANIC", 2), ("CENRACE", 63))

#: PL94 US persons geolevel shares US, state, county, tract, block group, block [EXT: production
#: DAS_2020_Redistricting_Production_Code, pl94 person_US.ini, geolevel_budget_prop /4099].
PL94_GEOLEVEL_SHARES: tuple[Fraction, ...] = tuple(
    Fraction(v, 4099) for v in (104, 1440, 447, 687, 1256, 165)
)


def exact_share(value: Any, name: str) -> Fraction:
    """Parse a budget share as an exact rational: int, Fraction, Decimal or a decimal/fraction string.

    Floats are refused (S4: no float drift may enter a privacy-relevant number).
    """
    if isinstance(value, (bool, float)):
        raise InputError(f"{name}: share {value!r} must be an exact rational (int, Fraction, Decimal or "
                         "string such as '1/3' or '0.25'), not a float")
    if isinstance(value, Fraction | int):
        return Fraction(value)
    if isinstance(value, Decimal):
        return Fraction(value)
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError) as exc:
            raise InputError(f"{name}: cannot parse share {value!r} as a rational") from exc
    raise InputError(f"{name}: unsupported share type {type(value).__name__}")


def check_shares(shares: Sequence[Fraction], name: str) -> None:
    """S4: every share > 0 and the shares sum to exactly 1."""
    if not shares:
        raise InputError(f"{name}: no shares given")
    for i, s in enumerate(shares):
        if s <= 0:
            raise InputError(f"{name}: share #{i} = {s} must be > 0")
    total = sum(shares, Fraction(0))
    if total != 1:
        raise InputError(f"{name}: shares sum to {total}, not exactly 1")


@dataclass(frozen=True)
class Schema:
    """An ordered Cartesian histogram schema ``(name, size)``; cells are numbered row-major."""

    attributes: tuple[tuple[str, int], ...] = PL94_SCHEMA

    def __post_init__(self) -> None:
        names = [a for a, _ in self.attributes]
        if not names or len(set(names)) != len(names):
            raise InputError(f"schema: attribute names must be non-empty and distinct, got {names}")
        for a, d in self.attributes:
            if int(d) < 1:
                raise InputError(f"schema: attribute {a} has size {d} < 1")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.attributes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for _, d in self.attributes)

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape))

    def cell_index(self, codes: Mapping[str, npt.ArrayLike], source: str | None = None) -> IntArray:
        """Row-major cell number of records given one integer code array per attribute (validated; an error
        names ``source`` and the 1-based file row, header = row 1)."""
        cell: IntArray | None = None
        for a, d in self.attributes:  # row-major (np.ravel_multi_index's C order), one int64 array in all
            if a not in codes:
                raise InputError(f"schema: column {a} missing", file=source, column=a)
            try:
                v = np.asarray(codes[a], dtype=np.int64)
            except (TypeError, ValueError) as exc:
                raise InputError(f"non-integer codes in {a}", file=source, column=a) from exc
            bad = np.flatnonzero((v < 0) | (v >= d))
            if bad.size:
                raise InputError(f"schema: value {v[bad[0]]} outside 0..{d - 1}", file=source,
                                 row=int(bad[0]) + 2, column=a)
            if cell is None:
                cell = v.copy() if v is codes[a] else v
            else:
                cell *= d
                cell += v
        return cell if cell is not None else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class QueryGroup:
    """A marginal query group: the attributes it keeps (all others are summed out) and its share α."""

    name: str
    keep: tuple[str, ...]
    alpha: Fraction

    def row_index(self, schema: Schema) -> IntArray:
        """For every cell, the row of this group it falls into (exactly one: S1)."""
        unknown = set(self.keep) - set(schema.names)
        if unknown:
            raise InputError(f"query group {self.name}: unknown attributes {sorted(unknown)}")
        grids = np.indices(schema.shape).reshape(len(schema.shape), -1)
        kept = [i for i, a in enumerate(schema.names) if a in self.keep]
        if not kept:
            return np.zeros(schema.n_cells, dtype=np.int64)
        dims = tuple(schema.shape[i] for i in kept)
        out: IntArray = np.ravel_multi_index(tuple(grids[i] for i in kept), dims).astype(np.int64)
        return out

    def n_rows(self, schema: Schema) -> int:
        return int(np.prod([d for a, d in schema.attributes if a in self.keep], dtype=np.int64))

    def matrix(self, schema: Schema) -> npt.NDArray[np.int8]:
        """The dense 0/1 matrix ``⊗ (I or 1ᵀ)`` (for tests and small schemas)."""
        m: npt.NDArray[np.int8] = np.ones((1, 1), dtype=np.int8)
        for a, d in schema.attributes:
            f = np.eye(d, dtype=np.int8) if a in self.keep else np.ones((1, d), dtype=np.int8)
            m = np.kron(m, f)
        return m


def kron_query(factors: Sequence[tuple[str, int]]) -> npt.NDArray[np.int8]:
    """Kronecker product of ``("I", d)`` and ``("1", d)`` factors (S1/S2 builder)."""
    m: npt.NDArray[np.int8] = np.ones((1, 1), dtype=np.int8)
    for kind, d in factors:
        if kind not in ("I", "1"):
            raise InputError(f"kron_query: factor kind {kind!r} is not 'I' or '1'")
        m = np.kron(m, np.eye(d, dtype=np.int8) if kind == "I" else np.ones((1, d), dtype=np.int8))
    return m


@dataclass(frozen=True)
class LevelStrategy:
    """The query groups of one geolevel with their shares α (Σα = 1 exactly)."""

    groups: tuple[QueryGroup, ...]

    def __post_init__(self) -> None:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise InputError(f"level strategy: duplicate query group names {names}")
        check_shares([g.alpha for g in self.groups], "query shares α")

    def is_detailed_only(self, schema: Schema) -> bool:
        return len(self.groups) == 1 and set(self.groups[0].keep) == set(schema.names)

    def has_detailed(self, schema: Schema) -> bool:
        return any(set(g.keep) == set(schema.names) for g in self.groups)


def pl94_level_strategy(schema: Schema = Schema()) -> LevelStrategy:
    """Default per-level marginal strategy (exact shares; a configured choice, documented in docs/topdown.md).

    Total, HHGQ, CENRACE, VOTINGAGE×HISPANIC×CENRACE and the detailed histogram with α = 1/10, 1/10, 1/10,
    3/10, 2/5. With another schema it falls back to total (1/5) + detailed (4/5).
    """
    if schema.attributes == PL94_SCHEMA:
        return LevelStrategy((
            QueryGroup("total", (), Fraction(1, 10)),
            QueryGroup("hhgq", ("HHGQ",), Fraction(1, 10)),
            QueryGroup("cenrace", ("CENRACE",), Fraction(1, 10)),
            QueryGroup("votingage_hispanic_cenrace", ("VOTINGAGE", "HISPANIC", "CENRACE"), Fraction(3, 10)),
            QueryGroup("detailed", schema.names, Fraction(2, 5)),
        ))
    return LevelStrategy((QueryGroup("total", (), Fraction(1, 5)),
                          QueryGroup("detailed", schema.names, Fraction(4, 5))))


def detailed_only_strategy(schema: Schema) -> LevelStrategy:
    """The detailed histogram alone (α = 1): estimation is then exactly separable per cell."""
    return LevelStrategy((QueryGroup("detailed", schema.names, Fraction(1)),))


@dataclass(frozen=True)
class Strategy:
    """Schema + geolevel shares β (Σβ = 1) + one :class:`LevelStrategy` per geolevel + the budget.

    ``privacy_defn`` is ``"zcdp"`` (discrete Gaussian; ``budget`` = ρ) or ``"puredp"`` (two-sided geometric;
    ``budget`` = ε).
    """

    schema: Schema
    levels: tuple[str, ...]
    beta: tuple[Fraction, ...]
    per_level: tuple[LevelStrategy, ...]
    budget: Fraction
    privacy_defn: str = "zcdp"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.levels) != len(self.beta) or len(self.levels) != len(self.per_level):
            raise InputError("strategy: levels, β and per-level strategies must have the same length")
        check_shares(list(self.beta), "geolevel shares β")
        if self.budget <= 0:
            raise InputError(f"strategy: budget {self.budget} must be > 0")
        if self.privacy_defn not in ("zcdp", "puredp"):
            raise InputError(f"strategy: privacy_defn {self.privacy_defn!r} is not 'zcdp' or 'puredp'")
        for lv in self.per_level:
            for g in lv.groups:
                g.row_index(self.schema)  # validates attribute names

    @cached_property
    def level_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.levels)}

    def noise_parameter(self, gamma: Fraction, alpha: Fraction) -> Fraction:
        """σ² = 1/(ρ·γ·α) (zCDP) or Laplace scale 2/(ε·γ·α) (pure DP) (S3); γ = 0 is an error (no release)."""
        if gamma <= 0 or alpha <= 0:
            raise ValueError("a geounit with γ = 0 emits no measurement; its noise is undefined")
        if self.privacy_defn == "zcdp":
            return 1 / (self.budget * gamma * alpha)
        return 2 / (self.budget * gamma * alpha)


def make_strategy(levels: Sequence[str], beta: Sequence[Any], budget: Any, *,
                  schema: Schema | None = None,
                  per_level: Sequence[LevelStrategy] | LevelStrategy | None = None,
                  privacy_defn: str = "zcdp") -> Strategy:
    """Build a validated :class:`Strategy` (shares parsed exactly; floats refused)."""
    sch = schema or Schema()
    b = tuple(exact_share(v, f"β[{levels[i] if i < len(levels) else i}]") for i, v in enumerate(beta))
    if per_level is None:
        pl: tuple[LevelStrategy, ...] = tuple(pl94_level_strategy(sch) for _ in levels)
    elif isinstance(per_level, LevelStrategy):
        pl = tuple(per_level for _ in levels)
    else:
        pl = tuple(per_level)
    return Strategy(schema=sch, levels=tuple(levels), beta=b, per_level=pl,
                    budget=exact_share(budget, "budget"), privacy_defn=privacy_defn)


def eigen_level_strategy(schema: Schema, workload: Mapping[str, Sequence[str]],
                         candidates: Mapping[str, Sequence[str]], *, denominator: int = 1000) -> LevelStrategy:
    """A level strategy whose shares α are the optimal exact-rational weights of
    :func:`dasflow.strategy.topdown_weights.topdown_query_weights` (Eigen-Design weighting over marginal
    queries) for the given workload tables; candidates with α = 0 are dropped. Data-independent."""
    shares = topdown_query_weights(schema.attributes, {k: list(v) for k, v in workload.items()},
                                   {k: list(v) for k, v in candidates.items()}, denominator=denominator)
    return LevelStrategy(tuple(QueryGroup(name, tuple(candidates[name]), Fraction(alpha))
                               for name, alpha in shares.items()))
