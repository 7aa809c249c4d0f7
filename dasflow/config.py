"""Release configuration: what one production run is (DESIGN.md §2).

A release config names the release, its universe (US or PR: separate ledgers, never one execution), the store,
the inputs, the products with their own configs (native, or the Census production formats carried verbatim as
text), the privacy cap and the RNG mode. It is frozen into ``runs/{release_id}/config.json`` with its SHA-256; a
different config under an existing release id is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dasflow.errors import InputError

EXECUTION_FIELDS = ("store", "task_runner", "dask_address", "measure_on_workers", "validation_chunk_rows")
RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RngConfig(BaseModel):
    """``production``: the CSPRNG (OpenSSL's DRBG, seeded by the OS). ``test``: the seeded generator (the release
    is marked as a test release and can never be published as production)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["production", "test"] = "production"
    seed: int | None = None

    @model_validator(mode="after")
    def _seed_matches_mode(self) -> RngConfig:
        if self.mode == "test" and self.seed is None:
            raise ValueError("rng.mode 'test' needs rng.seed")
        if self.mode == "production" and self.seed is not None:
            raise ValueError("rng.seed is only allowed with rng.mode 'test' (production never seeds)")
        return self


class CapConfig(BaseModel):
    """The privacy cap of the release: total ρ (zCDP; pure-DP entries count ε²/2) and optionally ε for
    all-pure plans. Exact decimal strings or integers; "Infinity" only for test releases."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rho: str
    epsilon: str | None = None

    @field_validator("rho", "epsilon", mode="before")
    @classmethod
    def _exact(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool | float):
            raise ValueError(f"cap must be an exact decimal string or integer, not {v!r}")
        text = str(v)
        if text != "Infinity":
            try:
                value = Fraction(text)
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"cap {text!r} is not an exact number") from None
            if value < 0:
                raise ValueError(f"cap {text!r} is negative")
        return text

    def fraction(self, which: Literal["rho", "epsilon"]) -> Fraction | None:
        text = getattr(self, which)
        return None if text in (None, "Infinity") else Fraction(text)


class ProductConfig(BaseModel):
    """One product of the release and its own config, kept verbatim as text (the Census formats as-is)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    config_text: str = Field(description="the product's config file content, verbatim")
    source: str | None = Field(default=None, description="where config_text was read from (audit only)")


class ReleaseConfig(BaseModel):
    """One release (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    release_id: str
    universe: Literal["US", "PR"]
    store: str = "dasflow-store"
    inputs: dict[str, str] = Field(default_factory=dict,
                                   description="input name -> store key prefix (under confidential/) or public path")
    products: list[ProductConfig]
    cap: CapConfig
    rng: RngConfig = RngConfig()
    account: str | None = Field(default=None, description="the privacy-loss account the plan is reserved from "
                                "(dasflow.privacy.account); required in production RNG mode")
    task_runner: Literal["thread", "dask"] = "thread"
    dask_address: str | None = None
    measure_on_workers: bool | None = Field(
        default=None, description="draw a segmented product's measurements on the Dask workers (they then read "
        "the prepared counts and draw noise); default: yes on the local cluster dasflow starts, no on a cluster at "
        "dask_address (docs/scale-out.md)")
    validation_chunk_rows: int | None = Field(default=None, ge=1, description="rows per chunk when the validate "
                                              "stage streams an input file (default 1,000,000; docs/validation.md)")

    @field_validator("release_id")
    @classmethod
    def _rid(cls, v: str) -> str:
        if not RELEASE_ID.match(v):
            raise ValueError(f"release_id {v!r} must match {RELEASE_ID.pattern}")
        return v

    @model_validator(mode="after")
    def _unique_products(self) -> ReleaseConfig:
        names = [p.name for p in self.products]
        if not names:
            raise ValueError("a release needs at least one product")
        if len(set(names)) != len(names):
            raise ValueError(f"products listed twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        if self.rng.mode == "production" and self.account is None:
            raise ValueError("a production release must name its privacy-loss account (\"account\": NAME; "
                             "dasflow account open)")
        return self

    def canonical_json(self) -> str:
        """The frozen form: canonical JSON (sorted keys), whose SHA-256 keys the release.

        Where the release is stored and how it is executed (``store``, ``task_runner``, ``dask_address``) are not
        part of what the release *is*: a release copied to another store, or run on a Dask cluster instead of
        threads, keeps its identity and produces the same bytes."""
        exclude = set(EXECUTION_FIELDS) | ({"account"} if self.account is None else set())  # old ids unchanged
        return json.dumps(self.model_dump(mode="json", exclude=exclude), sort_keys=True,
                          indent=1) + "\n"

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def is_test(self) -> bool:
        return self.rng.mode == "test"


def load_release_config(path: str | Path) -> ReleaseConfig:
    """Read a release config file (JSON). Product configs may be inline objects or ``config_file`` paths
    (relative to the release config); both end up verbatim text in ``config_text``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read release config: {exc.strerror}", file=str(path)) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                         file=str(path), row=exc.lineno) from None
    if not isinstance(raw, dict):
        raise InputError("a release config is a JSON object", file=str(path))
    products = []
    for i, entry in enumerate(raw.get("products", [])):
        if not isinstance(entry, dict) or "name" not in entry:
            raise InputError(f"products[{i}] needs a 'name'", file=str(path), column=f"products[{i}]")
        entry = dict(entry)
        if "config_file" in entry:
            src = (path.parent / entry.pop("config_file")).resolve()
            try:
                entry["config_text"] = src.read_text(encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot read product config: {exc.strerror}", file=str(src)) from None
            entry["source"] = str(src)
        elif "config" in entry:
            entry["config_text"] = json.dumps(entry.pop("config"), sort_keys=True, indent=1)
        products.append(entry)
    raw["products"] = products
    return parse_release_config(raw, source=str(path))


def parse_release_config(raw: dict[str, Any], source: str = "<config>") -> ReleaseConfig:
    """Validate a release config object; errors name the file and the offending key."""
    try:
        return ReleaseConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{err['msg']}", file=source, column=loc or None) from None
