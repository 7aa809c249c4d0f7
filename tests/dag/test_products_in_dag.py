"""Real products through the release pipeline: SafeTab-P on the Census toy inputs (both mechanisms)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline.run import freeze_config
from dasflow.privacy import accounting
from dasflow.products.safetab_p import parse_config
from tests.dag.helpers import release_files
from tests.dag.test_pipeline import run_all

TOY = Path(__file__).resolve().parents[1] / "data" / "safetab_p_toy"


def safetab_release(tmp: Path, mechanism: str, seed: int = 5) -> tuple[LocalStore, dict]:  # type: ignore[type-arg]
    store = LocalStore(tmp / "store")
    store.put("confidential/safetab-p/person-records.txt", (TOY / "person-records.txt").read_bytes())
    store.put("public/safetab-p/GRF-C.txt", (TOY / "GRF-C.txt").read_bytes())
    for it in (TOY / "input_dir_zcdp").glob("*.txt"):  # the toy's own iteration files (public)
        store.put(f"public/safetab-p/{it.name}", it.read_bytes())
    text = (TOY / f"input_dir_{mechanism}" / "config.json").read_text()
    raw = {"release_id": f"toy-{mechanism}", "universe": "US", "store": str(tmp / "store"),
           "inputs": {"safetab-p": "confidential/safetab-p/", "safetab-p_public": "public/safetab-p/"},
           "products": [{"name": "safetab-p", "config_text": text}],
           "cap": {"rho": "100"}, "rng": {"mode": "test", "seed": seed}}
    return store, raw


@pytest.mark.parametrize("mechanism", ["zcdp", "puredp"])
def test_safetab_p_toy_release_through_the_dag(tmp_path: Path, mechanism: str) -> None:
    store, raw = safetab_release(tmp_path, mechanism)
    ctx = freeze_config(parse_release_config(raw), store)
    summary = run_all(ctx)["safetab-p"]
    files = release_files(tmp_path / "store", raw["release_id"])
    assert any(name.startswith("safetab-p/") for name in files)
    # the ledger's total is the config's own total over the US levels, exactly
    cfg = parse_config(accounting.load_json_exact(raw["products"][0]["config_text"]))
    planned = ctx.ledger.plan_record()["total"]
    spent = ctx.ledger.spent()
    if mechanism == "zcdp":
        assert spent.rho == cfg.total_budget("US")
    else:
        assert planned["epsilon_pure"] == str(cfg.total_budget("US"))
    assert summary["drawn_now"] == summary["keys"] == len(ctx.ledger.plan())
    # a second run is a resume: nothing drawn, same bytes
    again = run_all(freeze_config(parse_release_config(raw), store))["safetab-p"]
    assert again["drawn_now"] == 0
    assert release_files(tmp_path / "store", raw["release_id"]) == files
    assert json.loads(files["MANIFEST.json"])["test_release"] is True
