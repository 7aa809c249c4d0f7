"""``dasflow demo`` is the whole system: every registered product, an exact cap and account charge. That a seeded
demo is deterministic over every product (same seed, same bytes) is tested by
``tests/dag/test_product_lanes.py``: two independent runs of it, through the stage functions and through the flow
with two product lanes, give the same release bytes."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from dasflow import demo, registry
from dasflow.errors import LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import candidate_context
from dasflow.privacy import account


def test_the_demo_runs_every_registered_product() -> None:
    names = [p.name for p, _ in demo.demo_plugins()]
    assert names == ["phsafe", "safetab-p", "groupsize", "topdown", "matrix"]  # the tests' plugins have no demo
    assert set(names) <= {p.name for p in registry.plugins()}


def test_cap_is_the_plan_and_the_account_holds_two_demo_releases(tmp_path: Path) -> None:
    cfg = demo.prepare_demo(tmp_path / "store", 1000, None)
    assert {p.name for p in cfg.products} == {p.name for p, _ in demo.demo_plugins()}
    specs = [s for p in cfg.products for s in stages.product_specs(candidate_context(cfg), p.name)]
    total = sum((s.budget or Fraction(0) for s in specs), Fraction(0))
    assert total == Fraction(demo.DEMO_CAP_RHO) == Fraction("8.201281")
    store = LocalStore(tmp_path / "store")
    acct = account.load_account(store, demo.DEMO_ACCOUNT)
    charge, _ = account.plan_charge(acct, specs)
    assert charge == Fraction("10.701281")
    cap = Fraction(demo.DEMO_ACCOUNT_CAP_RHO)
    assert 2 * charge <= cap < 3 * charge


def test_a_third_demo_release_is_refused_by_the_account(tmp_path: Path) -> None:
    cfg = demo.prepare_demo(tmp_path / "store", 1000, None)
    specs = [s for p in cfg.products for s in stages.product_specs(candidate_context(cfg), p.name)]
    store = LocalStore(tmp_path / "store")
    acct = account.load_account(store, demo.DEMO_ACCOUNT)
    charge, _ = account.plan_charge(acct, specs)
    with pytest.raises(LedgerRefusal):
        account.require_fits(acct, 2 * charge, charge, "a third demo release")
