"""One cap check (issue #19): ``dasflow validate``, ``dasflow budget`` on a release config and freezing refuse the
same over-cap plan through ``ledger.check_plan``, with the same message, and nothing is frozen. The plan here is
pure DP (SafeTab-P's toy ``puredp`` config) under an ε cap below its total: the case a ρ-only check let through."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from dasflow.cli import main
from dasflow.config import parse_release_config
from dasflow.errors import LedgerRefusal
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config
from dasflow.privacy import accounting
from dasflow.products.safetab_p import parse_config
from tests.dag.test_products_in_dag import safetab_release


def test_an_over_cap_pure_dp_plan_is_refused_identically(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store, raw = safetab_release(tmp_path, "puredp")
    total = parse_config(accounting.load_json_exact(raw["products"][0]["config_text"])).total_budget("US")
    assert total is not None
    cap = total - Fraction(1, 100)  # just below the plan's ε (ρ cap generous: only the ε cap binds)
    raw["cap"] = {"rho": "100", "epsilon": str(cap)}
    path = tmp_path / "release.json"
    path.write_text(json.dumps(raw))
    expected = f"plan total epsilon = {total} exceeds the release cap epsilon = {cap}"

    capsys.readouterr()
    assert main(["validate", str(path)]) == 3
    validate_err = capsys.readouterr().err
    assert main(["budget", str(path), "--json"]) == 3
    budget_err = capsys.readouterr().err

    ctx = freeze_config(parse_release_config(raw), store)
    stages.validate_stage(ctx, "safetab-p")
    with pytest.raises(LedgerRefusal) as refused:
        stages.plan_stage(ctx)
    assert str(refused.value) == expected
    assert validate_err == f"dasflow validate: refused by the privacy ledger: {expected}\n"
    assert budget_err == f"dasflow budget: refused by the privacy ledger: {expected}\n"
    assert store.list(f"runs/{raw['release_id']}/ledger/") == []  # nothing frozen, nothing reserved

    # at the cap exactly, all three accept the same plan
    raw["cap"] = {"rho": "100", "epsilon": str(total)}
    path.write_text(json.dumps(raw))
    assert main(["budget", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["US"]["epsilon_pure"] == str(total)
