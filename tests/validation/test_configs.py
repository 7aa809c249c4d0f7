"""Issue 11 item 2 and the bad-config half of item 5: every config format (native release config, Census PHSafe
and SafeTab-P configs, group sizes) — unknown/missing keys, bad types, negative/NaN/misplaced-Infinity budgets,
thresholds, state filters, PR mixed with states — rejected with the file and key, exit 2, nothing spent."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from dasflow.errors import InputError
from dasflow.registry import get_plugin
from dasflow.validation.configs import validate_product_config, validate_release_config
from tests.validation.helpers import CONFIG_FILES, CORPUS, _config_text, corpus_store, release_raw, run_release

CONFIG_CASES: dict[str, dict[str, str | None]] = json.loads((CORPUS / "configs.json").read_text())


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_product_config_rejected_exit_2_nothing_spent(tmp_path: Path, case: str) -> None:
    spec = CONFIG_CASES[case]
    product = str(spec["product"])
    text = (CORPUS / "configs" / f"{case}.json").read_text()
    with pytest.raises(InputError) as info:
        validate_product_config(get_plugin(product), text, "US", source=f"{case}.json")
    assert info.value.file == f"{case}.json"
    if spec["column"] is not None:
        assert info.value.column == spec["column"], str(info.value)
    # end to end: the release refuses before planning anything
    store = corpus_store(tmp_path / "store")
    errors: list[BaseException] = []
    assert run_release(store, release_raw(store, [product], config_texts={product: text}), errors=errors) == 2
    assert isinstance(errors[0], InputError)
    assert not (tmp_path / "store/runs/v1/ledger/plan.json").exists()
    assert not (tmp_path / "store/runs/v1/ledger/entries").exists()


@pytest.mark.parametrize("product", sorted(CONFIG_FILES))
def test_shipped_configs_are_accepted_with_exact_budgets(product: str) -> None:
    cfg = validate_product_config(get_plugin(product), _config_text(CONFIG_FILES[product]), "US")
    if product == "groupsize":
        assert cfg.budget == Fraction(1, 2)
    elif product == "phsafe":
        assert cfg.budgets["PH2"]["usa_*"] == Fraction("0.002619")  # decimal text kept exact, no float
    else:
        assert cfg.budgets[("STATE", 1)] is not None


def test_infinity_is_an_allowed_budget_only_where_budgets_live() -> None:
    raw = json.loads(_config_text(CONFIG_FILES["phsafe"]))
    text = json.dumps(raw).replace('"usa_*": 0.002619', '"usa_*": Infinity', 1)
    cfg = validate_product_config(get_plugin("phsafe"), text, "US")
    assert cfg.budgets["PH1_num"]["usa_*"] is None  # infinite budget = no noise (test releases only)
    bad = json.dumps(raw).replace('"usa_*": 0.002619', '"usa_*": -Infinity', 1)
    with pytest.raises(InputError, match="Infinity"):
        validate_product_config(get_plugin("phsafe"), bad, "US")


def test_pr_universe_rules() -> None:
    """PR is its own execution: a US PHSafe config in a PR release, and a PR config with usa_* budgets, fail."""
    with pytest.raises(InputError, match="universe"):
        validate_product_config(get_plugin("phsafe"), _config_text(CONFIG_FILES["phsafe"]), "PR")
    raw = json.loads(_config_text(CONFIG_FILES["phsafe"]))
    raw["state_filter"] = ["72"]
    with pytest.raises(InputError, match="Puerto Rico has no Nation level") as info:
        validate_product_config(get_plugin("phsafe"), json.dumps(raw), "PR")
    assert info.value.column is not None and info.value.column.startswith("privacy_budget.")
    st = json.loads(_config_text(CONFIG_FILES["safetab-p"]))
    st["run_pr"] = False
    with pytest.raises(InputError, match="does not run the release universe PR"):
        validate_product_config(get_plugin("safetab-p"), json.dumps(st), "PR")


@pytest.mark.parametrize(("change", "column"), [
    (lambda r: r.update(extra=1), "extra"),
    (lambda r: r.pop("cap"), "cap"),
    (lambda r: r["cap"].update(rho="NaN"), "cap.rho"),
    (lambda r: r["cap"].update(rho="-1"), "cap.rho"),
    (lambda r: r["cap"].update(rho=0.5), "cap.rho"),  # a float cap is not exact
    (lambda r: r.update(universe="USA"), "universe"),
    (lambda r: r["rng"].update(seed=None), "rng"),
])
def test_release_config_rejections_name_the_key(tmp_path: Path, change, column: str) -> None:  # type: ignore[no-untyped-def]
    store = corpus_store(tmp_path / "store")
    raw = release_raw(store, ["groupsize"])
    change(raw)
    with pytest.raises(InputError) as info:
        validate_release_config(raw, source="release.json")
    assert info.value.file == "release.json"
    assert info.value.column == column, str(info.value)
    assert run_release(store, raw) == 2


def test_release_config_validates_every_product_config(tmp_path: Path) -> None:
    store = corpus_store(tmp_path / "store")
    text = (CORPUS / "configs" / "safetab_unknown_key.json").read_text()
    raw = release_raw(store, ["groupsize", "safetab-p"], config_texts={"safetab-p": text})
    with pytest.raises(InputError, match="unknown key"):
        validate_release_config(json.dumps(raw), source="release.json")
    ok = validate_release_config(release_raw(store, ["groupsize", "phsafe"]), source="release.json")
    assert [p.name for p in ok.products] == ["groupsize", "phsafe"]
