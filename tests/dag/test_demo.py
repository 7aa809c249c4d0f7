"""``dasflow demo`` is the whole system: every registered product, an exact cap and account charge, and a seeded
demo is deterministic (same seed, same bytes) through the stage functions."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from dasflow import demo, registry
from dasflow.errors import LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import candidate_context, freeze_config
from dasflow.privacy import account
from dasflow.release.stage import release_stage
from tests.dag.helpers import release_files


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


def _seeded_release(root: Path, seed: int) -> dict[str, bytes]:
    cfg = demo.prepare_demo(root, 1000, seed)
    ctx = freeze_config(cfg)
    for p in cfg.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    for p in cfg.products:
        stages.preprocess_stage(ctx, p.name)
        stages.measure_stage(ctx, p.name)
        stages.postprocess_stage(ctx, p.name)
    release_stage(ctx)
    return release_files(root, cfg.release_id)


@pytest.mark.slow
def test_seeded_demo_is_deterministic_over_every_product(tmp_path: Path) -> None:
    first = _seeded_release(tmp_path / "a", 5)
    products = {p.name for p, _ in demo.demo_plugins()}
    assert products <= {rel.split("/", 1)[0] for rel in first if "/" in rel}  # every product released files
    assert first == _seeded_release(tmp_path / "b", 5)


def test_a_third_demo_release_is_refused_by_the_account(tmp_path: Path) -> None:
    cfg = demo.prepare_demo(tmp_path / "store", 1000, None)
    specs = [s for p in cfg.products for s in stages.product_specs(candidate_context(cfg), p.name)]
    store = LocalStore(tmp_path / "store")
    acct = account.load_account(store, demo.DEMO_ACCOUNT)
    charge, _ = account.plan_charge(acct, specs)
    with pytest.raises(LedgerRefusal):
        account.require_fits(acct, 2 * charge, charge, "a third demo release")
