"""Real products through the release pipeline: SafeTab-P on the Census toy inputs (both mechanisms)."""

from __future__ import annotations

import io
import json
from fractions import Fraction
from pathlib import Path

import pytest

from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline.run import freeze_config
from dasflow.privacy import accounting
from dasflow.products.safetab_p import parse_config
from tests.dag.helpers import release_files, topdown_release
from tests.dag.test_pipeline import run_all
from tests.synthetic import mark_inputs

TOY = Path(__file__).resolve().parents[1] / "data" / "safetab_p_toy"


def us_persons() -> bytes:
    """The toy's person records of the US universe (the Census toy file mixes US and Puerto Rico persons; a
    release runs one universe and refuses records of the other)."""
    header, *rows = (TOY / "person-records.txt").read_text().splitlines()
    return "\n".join([header, *(r for r in rows if r.split("|")[3] != "72")]).encode() + b"\n"


def safetab_release(tmp: Path, mechanism: str, seed: int = 5) -> tuple[LocalStore, dict]:  # type: ignore[type-arg]
    store = LocalStore(tmp / "store")
    store.put("confidential/safetab-p/person-records.txt", us_persons())
    store.put("public/safetab-p/GRF-C.txt", (TOY / "GRF-C.txt").read_bytes())
    for it in (TOY / "input_dir_zcdp").glob("*.txt"):  # the toy's own iteration files (public)
        store.put(f"public/safetab-p/{it.name}", it.read_bytes())
    text = (TOY / f"input_dir_{mechanism}" / "config.json").read_text()
    raw = {"release_id": f"toy-{mechanism}", "universe": "US", "store": str(tmp / "store"),
           "inputs": {"safetab-p": "confidential/safetab-p/", "safetab-p_public": "public/safetab-p/"},
           "products": [{"name": "safetab-p", "config_text": text}],
           "cap": {"rho": "100"}, "rng": {"mode": "test", "seed": seed}}
    mark_inputs(store, raw, "the SafeTab-P toy inputs")
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


def test_matrix_product_through_the_dag_on_synthetic_persons(tmp_path: Path) -> None:
    """The PL94-like marginal workload on the 2,016-cell histogram of synthetic persons (TopDown format)."""
    from dasflow import synth

    store = LocalStore(tmp_path / "store")
    synth.generate(store.local_path("confidential/synth"), persons=3000, seed=4, states=["44", "11"],
                   formats=("topdown",))
    workload = {"schema": {"HHGQ": 8, "VOTINGAGE": 2, "HISPANIC": 2, "CENRACE": 63},
                "workload": {"total": "total", "va_hisp": ["VOTINGAGE", "HISPANIC"], "detailed": "detailed"},
                "rho": "1/2", "level": "nation"}
    raw = {"release_id": "mx", "universe": "US", "store": str(tmp_path / "store"),
           "inputs": {"matrix": "confidential/synth/topdown/persons/"},
           "products": [{"name": "matrix", "config_text": json.dumps(workload)}],
           "cap": {"rho": "1/2"}, "rng": {"mode": "test", "seed": 2}}
    ctx = freeze_config(parse_release_config(raw), store)
    summary = run_all(ctx)["matrix"]
    assert summary["drawn_now"] == summary["keys"] >= 1
    assert ctx.ledger.spent().rho == Fraction(1, 2)
    files = release_files(tmp_path / "store", "mx")
    assert {"matrix/nation_total.csv", "matrix/nation_va_hisp.csv", "matrix/nation_detailed.csv"} <= set(files)
    total = files["matrix/nation_total.csv"].decode().splitlines()
    assert total[0] == "ESTIMATE|VARIANCE" and abs(float(total[1].split("|")[0]) - 3000) < 200


def test_topdown_through_the_dag_on_a_synthetic_state(tmp_path: Path) -> None:
    """A one-state TopDown release: consistent non-negative integer tables, population invariant exact."""
    import numpy as np
    import pandas as pd

    raw = topdown_release(tmp_path, "td", states=["44"], persons=4000, synth_seed=6)
    store = LocalStore(tmp_path / "store")
    total = json.loads(store.get("public/topdown/invariants.json"))["total"]
    assert total == 4000
    facts = pd.read_csv(io.BytesIO(store.get("public/topdown/block_facts.csv")), sep="|", dtype={"GEOID": str})
    ctx = freeze_config(parse_release_config(raw), store)
    run_all(ctx)
    assert ctx.ledger.spent().rho == 1
    state = pd.read_csv(tmp_path / "store/runs/td/release/topdown/topdown_state.csv", sep="|")
    block = pd.read_csv(tmp_path / "store/runs/td/release/topdown/topdown_block.csv", sep="|",
                        dtype={"GEOID": str})
    count = "COUNT"
    assert int(state[count].sum()) == int(block[count].sum()) == total
    assert (block[count] >= 0).all()
    # structural zeros: no released person in a household cell of a block without housing units, nor in a GQ
    # type the block has no facility of
    f = facts.set_index("GEOID")
    has = f.reindex(block["GEOID"].str.zfill(15).tolist())[["HU", *(f"GQ{t}" for t in range(1, 8))]].to_numpy()
    held = block[count].to_numpy() > 0
    assert (has[np.arange(len(block)), block["HHGQ"].to_numpy()][held] > 0).all()
