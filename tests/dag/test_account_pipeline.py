"""Releases reserve their whole plan from the account of their dataset before any noise (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dasflow.cli import main
from dasflow.errors import LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, freeze_config
from dasflow.privacy import account, relations
from tests.dag.helpers import ACCOUNT, open_test_account, release_config, release_dict, seed_inputs


def _plan(store: LocalStore, tmp: Path, rid: str) -> RunContext:
    ctx = freeze_config(release_config(str(tmp / "store"), release_id=rid, seed=None), store)
    for p in ctx.config.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    return ctx


def test_a_second_release_id_does_not_get_a_fresh_cap(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    open_test_account(store, ACCOUNT, cap_rho="1")  # each release plans rho = 1/2 + 1/4
    ctx = _plan(store, tmp_path, "r1")
    stages.preprocess_stage(ctx, "counts")
    assert stages.measure_stage(ctx, "counts")["drawn_now"] == 2
    with pytest.raises(LedgerRefusal, match="only 1/4 of the lifetime cap 1 remains; nothing drawn"):
        _plan(store, tmp_path, "r2")
    assert store.list("runs/r2/measurements/") == [] and store.list("runs/r2/ledger/entries/") == []
    ctx2 = freeze_config(release_config(str(tmp_path / "store"), release_id="r2", seed=None), store)
    with pytest.raises(LedgerRefusal, match="no live reservation"):
        stages.measure_stage(ctx2, "counts")  # measuring without a reservation is refused too
    # the release that drew stays charged; abandon refuses (exit 3) and the account shows it
    assert main(["account", "abandon", ACCOUNT, "r1", "--store", str(tmp_path / "store")]) == 3


def test_an_abandoned_release_returns_its_reservation_and_never_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                       ) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    open_test_account(store, ACCOUNT, cap_rho="1")
    ctx = _plan(store, tmp_path, "r1")
    assert main(["account", "abandon", ACCOUNT, "r1", "--store", str(tmp_path / "store")]) == 0
    stages.preprocess_stage(ctx, "counts")
    with pytest.raises(LedgerRefusal):
        stages.measure_stage(ctx, "counts")
    assert store.list("runs/r1/measurements/") == []
    _plan(store, tmp_path, "r2")  # the returned budget is available again
    capsys.readouterr()
    assert main(["account", "show", ACCOUNT, "--store", str(tmp_path / "store"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(r["release_id"], r["state"]) for r in shown["releases"]] == [("r1", "returned"), ("r2", "charged")]
    assert shown["spent"] == "3/4" and shown["remaining"] == "1/4"
    assert shown["releases"][1]["products"]["counts"]["relation"] == "add_remove_person"
    assert shown["releases"][0]["drawn"] == shown["releases"][1]["drawn"] == "0"


def test_validate_says_whether_the_plan_fits_the_account(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    open_test_account(store, ACCOUNT, cap_rho="1")
    path = tmp_path / "release.json"
    path.write_text(json.dumps(release_dict(str(tmp_path / "store"), seed=None)))
    assert main(["validate", str(path)]) == 0
    _plan(store, tmp_path, "r0")  # 1/4 remains
    assert main(["validate", str(path)]) == 3
    path.write_text(json.dumps(release_dict(str(tmp_path / "store"), release_id="r0", seed=None)))
    assert main(["validate", str(path)]) == 0  # r0 holds its reservation


def test_the_frozen_plan_records_the_whole_vector_sensitivity(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    open_test_account(store, ACCOUNT)
    ctx = _plan(store, tmp_path, "r1")
    audit = ctx.ledger.plan_record()["audit"]
    assert audit["counts/state"] == {
        "relation": "add_remove_person", "sensitivity_l2sq": "1", "noise": "1", "budget": "1/2",
        "conversions": {"add_remove_person": {"budget": "1/2", "argument": "same relation"},
                        "change_one_person": {"budget": "2", "argument": relations.GENERIC_CHANGE[2]}}}
    assert account.summary(store, ACCOUNT)["spent"] == "3/4"
    capsys.readouterr()
    assert main(["ledger", "r1", "--store", str(tmp_path / "store"), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["audit"] == audit and shown["account"] == ACCOUNT


def test_the_certificate_adds_up_per_product_and_over_the_account(tmp_path: Path) -> None:
    from dasflow.release.certificate import certificate
    from tests.release.helpers import released_context

    ctx = released_context(tmp_path / "prod", seed=None)
    md, _ = certificate(ctx)
    assert "Neighbouring relation and privacy-loss account (add_remove_person)" in md
    assert "| counts | add_remove_person | ρ = 3/4 | same relation | ρ = 3/4 | none |" in md
    assert f"account `{ACCOUNT}` (universe US): lifetime cap rho = 100" in md
    assert "account lifetime spend including this release (at its slot): rho = 3/4, remaining 397/4" in md
    test_md, _ = certificate(released_context(tmp_path / "test", seed=5))
    assert "account: none (a test release spends from no account)" in test_md
