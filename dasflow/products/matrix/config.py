"""The workload file of the ``matrix`` product (JSON), parsed with exact budgets.

```json
{"schema": {"hhgq": 8, "votingage": 2, "hispanic": 2, "cenrace": 63},
 "workload": {"total": [], "va_hisp": ["votingage", "hispanic"], "detailed": "detailed"},
 "workload_weights": {"total": 2},
 "candidates": {"total": [], "va_hisp": ["votingage", "hispanic"], "detailed": "detailed"},
 "rho": "1/2", "denominator": 10000, "level": "nation"}
```

``candidates`` defaults to the workload tables plus the detailed histogram. ``rho`` is any exact budget
:func:`dasflow.privacy.accounting.parse_budget` accepts (a decimal string, an integer, "a/b"); it must be finite
and positive. Neighbours are add/remove-one (every marginal has L2 sensitivity 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from dasflow.errors import InputError
from dasflow.privacy import accounting

__all__ = ["MatrixConfig", "load_config", "parse_config"]

Marginal = tuple[str, ...]


@dataclass(frozen=True)
class MatrixConfig:
    """A validated workload file."""

    schema: dict[str, int]
    workload: dict[str, Marginal]
    candidates: dict[str, Marginal]
    rho: Fraction
    workload_weights: dict[str, Fraction]
    denominator: int = 10_000
    level: str = "all"
    source: str = "<config>"


def _marginal(value: Any, schema: dict[str, int], source: str, column: str) -> Marginal:
    if isinstance(value, str):
        if value in ("", "total"):
            return ()
        if value == "detailed":
            return tuple(schema)
        value = value.split("*")
    if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
        raise InputError(f"a marginal is a list of attribute names, got {value!r}", file=source, column=column)
    for a in value:
        if a not in schema:
            raise InputError(f"unknown attribute {a!r}; the schema has {list(schema)}", file=source,
                             column=column)
    if len(set(value)) != len(value):
        raise InputError(f"attribute repeated in {value!r}", file=source, column=column)
    return tuple(a for a in schema if a in value)  # schema order


def _tables(raw: Any, schema: dict[str, int], source: str, column: str) -> dict[str, Marginal]:
    if not isinstance(raw, Mapping) or not raw:
        raise InputError("must be a non-empty object {name: [attributes]}", file=source, column=column)
    out = {str(k): _marginal(v, schema, source, f"{column}.{k}") for k, v in raw.items()}
    seen: dict[Marginal, str] = {}
    for k, m in out.items():
        if m in seen:
            raise InputError(f"{k!r} and {seen[m]!r} are the same marginal", file=source, column=column)
        seen[m] = k
    return out


def parse_config(raw: Any, source: str = "<config>") -> MatrixConfig:
    """Validate a parsed workload file (decimals as ``Decimal``, see ``accounting.load_json_exact``)."""
    if not isinstance(raw, Mapping):
        raise InputError("the workload file must be a JSON object", file=source)
    known = {"schema", "workload", "workload_weights", "candidates", "rho", "denominator", "level"}
    for key in raw:
        if key not in known:
            raise InputError(f"unknown key {key!r} (known: {sorted(known)})", file=source, column=str(key))
    for key in ("schema", "workload", "rho"):
        if key not in raw:
            raise InputError(f"missing required key {key!r}", file=source, column=key)
    schema_raw = raw["schema"]
    if not isinstance(schema_raw, Mapping) or not schema_raw:
        raise InputError("must be a non-empty object {attribute: size}", file=source, column="schema")
    schema: dict[str, int] = {}
    for a, d in schema_raw.items():
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise InputError(f"attribute {a!r} needs an integer size >= 1, got {d!r}", file=source,
                             column=f"schema.{a}")
        schema[str(a)] = d
    workload = _tables(raw["workload"], schema, source, "workload")
    candidates = (_tables(raw["candidates"], schema, source, "candidates") if "candidates" in raw
                  else {**workload, **({} if tuple(schema) in workload.values() else {"detailed": tuple(schema)})})
    try:
        rho = accounting.parse_budget(raw["rho"], "rho")
    except ValueError as exc:
        raise InputError(str(exc), file=source, column="rho") from exc
    if rho is None or rho <= 0:
        raise InputError("rho must be a finite positive budget", file=source, column="rho")
    weights: dict[str, Fraction] = {}
    for k, v in dict(raw.get("workload_weights", {})).items():
        if k not in workload:
            raise InputError(f"{k!r} is not a workload table", file=source, column="workload_weights")
        try:
            weights[str(k)] = Fraction(str(v))
        except (ValueError, ZeroDivisionError) as exc:
            raise InputError(f"bad weight {v!r}", file=source, column=f"workload_weights.{k}") from exc
        if weights[str(k)] <= 0:
            raise InputError("weights must be > 0", file=source, column=f"workload_weights.{k}")
    denominator = raw.get("denominator", 10_000)
    if isinstance(denominator, bool) or not isinstance(denominator, int) or denominator < 1:
        raise InputError("denominator must be a positive integer", file=source, column="denominator")
    return MatrixConfig(schema=schema, workload=workload, candidates=candidates, rho=rho,
                        workload_weights=weights, denominator=denominator, level=str(raw.get("level", "all")),
                        source=source)


def load_config(path: str | Path) -> MatrixConfig:
    """Read and validate a workload file."""
    p = Path(path)
    try:
        raw = accounting.load_json_exact(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", file=str(p)) from exc
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", file=str(p)) from exc
    return parse_config(raw, source=str(p))
