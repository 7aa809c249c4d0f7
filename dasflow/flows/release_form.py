"""The typed form of a release started from the Prefect UI or a schedule, and the gated deployment flows.

The Run form renders :class:`ReleaseParameters` field by field (release id, universe, account, store, inputs,
products with their configs, cap, RNG mode) with defaults that describe the synthetic-census release of the local
stack (``infra/local/stack seed``). Every run these flows start pauses after planning for an operator's approval
(``flows/approval.py``) and holds the release's single concurrency slot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dasflow import demo, registry
from dasflow.config import RELEASE_ID, ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.flows.approval import end_stale_release_runs, exit_with_worker, release_slot
from dasflow.flows.release import run_release
from dasflow.pipeline.run import open_run

#: the form's data defaults (the demo's synthetic census layout, the products and their packaged configs): data
#: beside the demo configs, so no code here names a product
FORM_DEFAULTS: dict[str, Any] = json.loads((Path(demo.__file__).with_name("demo_data") / "release-form.json")
                                           .read_text(encoding="utf-8"))
#: the registered products (the form's product menu, a JSON-schema enum)
PRODUCT_MENU: list[Any] = list(registry.names())


class ProductChoice(BaseModel):
    """One product of the release and where its config file is (read on the worker, kept verbatim)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the product", json_schema_extra={"enum": PRODUCT_MENU})
    config_file: str = Field(description="its config (Census production format as-is): a path on the worker, "
                                         "relative to the dasflow checkout ($DASFLOW_HOME) or absolute")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in registry.names():
            raise ValueError(f"unknown product {name!r}; known: {registry.names()}")
        return name


class ReleaseParameters(BaseModel):
    """A release, as the operator fills it in (see README "Operating a release")."""

    model_config = ConfigDict(extra="forbid")
    release_id: str = Field(default="synth-us-v1", pattern=RELEASE_ID.pattern,
                            description="the release's id; an existing id resumes that release (same config only)")
    universe: Literal["US", "PR"] = Field(default="US", description="US or PR: separate ledgers and accounts")
    account: str | None = Field(default="synth-us", description="the privacy-loss account the plan is reserved "
                                "from (dasflow account open); required in production RNG mode")
    store: str = Field(default="s3://das-runs/prod", description="the release store (s3://bucket/prefix)")
    inputs: dict[str, str] = Field(default_factory=lambda: dict(FORM_DEFAULTS["inputs"]),
                                   description="input name -> key prefix in the store")
    products: list[ProductChoice] = Field(
        default_factory=lambda: [ProductChoice(**p) for p in FORM_DEFAULTS["products"]],
        min_length=1, description="the products and their configs")
    cap_rho: str = Field(default="7", pattern=r"^[0-9]+(\.[0-9]+)?(/[0-9]+)?$",
                         description="the release's privacy cap, zCDP rho, exact (e.g. 7 or 6.2 or 31/5)")
    rng_mode: Literal["production", "test"] = Field(default="production",
                                                    description="production: CSPRNG; test: seeded (never "
                                                                "publishable as production)")
    seed: int | None = Field(default=None, description="test mode only: the seed")

    def release_config(self, home: Path | None = None) -> ReleaseConfig:
        """The release config: product configs read verbatim from their files (relative to ``home``)."""
        base = Path.cwd() if home is None else home
        products = []
        for i, p in enumerate(self.products):
            path = Path(p.config_file) if Path(p.config_file).is_absolute() else base / p.config_file
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot read the product config: {exc.strerror}", file=str(path),
                                 column=f"products[{i}].config_file") from None
            products.append({"name": p.name, "config_text": text, "source": p.config_file})
        raw: dict[str, Any] = {
            "release_id": self.release_id, "universe": self.universe, "store": self.store, "inputs": self.inputs,
            "products": products, "cap": {"rho": self.cap_rho},
            "rng": {"mode": self.rng_mode, **({"seed": self.seed} if self.seed is not None else {})}}
        if self.account:
            raw["account"] = self.account
        return parse_release_config(raw, source="the release form")


#: the form's defaults (the Run form starts from them)
DEFAULTS = ReleaseParameters()


@flow(name="dasflow-release-gated", log_prints=True)
def release_from_form(parameters: ReleaseParameters = DEFAULTS) -> dict[str, Any]:
    """Prepare a release from the form, pause for an operator's approval of its plan, then run it (a release id
    that exists resumes with its frozen config). One run per release at a time."""
    exit_with_worker()
    cfg = parameters.release_config()
    with release_slot(cfg.release_id):
        end_stale_release_runs(cfg.release_id)
        return run_release(cfg, require_approval=True)


@flow(name="dasflow-resume-gated", flow_run_name="resume-{release_id}", log_prints=True)
def resume_gated(release_id: str, store: str = "s3://das-runs/prod") -> dict[str, Any]:
    """Resume a stopped release from its frozen config (committed measurements are reused, never redrawn). An
    approved release goes on at once; one never approved pauses for approval first."""
    exit_with_worker()
    with release_slot(release_id):
        end_stale_release_runs(release_id)
        return run_release(open_run(release_id, store).config, require_approval=True)
