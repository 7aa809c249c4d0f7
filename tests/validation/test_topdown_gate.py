"""TopDown inputs through the DAG with the validation gate: a valid one-state synthetic census passes the
validate stage with the GX suite; a person in a block outside the GRF-C and a wrong population invariant are
rejected (exit 2, file/row/column or file/key) with nothing measured."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.pipeline.adapters import REGISTRY
from tests.validation.helpers import run_release
from validation.adapters import MODULES

CONFIG = {"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1", "privacy_defn": "zcdp", "strategy": "pl94"}


@pytest.fixture(autouse=True)
def validated_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, module in MODULES.items():
        monkeypatch.setitem(REGISTRY, name, module)


def _store(tmp: Path) -> tuple[LocalStore, dict[str, Any], int]:
    from dasflow import synth

    store = LocalStore(tmp / "store")
    root = store.local_path("confidential/synth")
    manifest = synth.generate(root, persons=1500, seed=4, states=["10"], formats=("topdown", "safetab_p"))
    store.put("public/topdown/GRF-C.txt", (root / "safetab_p" / "GRF-C.txt").read_bytes())
    total = int(manifest.data["totals"]["persons"])
    store.put("public/topdown/invariants.json", json.dumps({"total": total}).encode())
    raw = {"release_id": "td", "universe": "US", "store": str(tmp / "store"),
           "inputs": {"topdown": "confidential/synth/topdown/persons/", "topdown_public": "public/topdown/"},
           "products": [{"name": "topdown", "config_text": json.dumps(CONFIG)}],
           "cap": {"rho": "1"}, "rng": {"mode": "test", "seed": 8}}
    return store, raw, total


def _nothing_spent(tmp: Path) -> None:
    run = tmp / "store/runs/td"
    for sub in ("ledger/entries", "measurements", "prepared"):
        assert not (run / sub).exists() or not any(p.is_file() for p in (run / sub).rglob("*"))


def test_topdown_gate(tmp_path: Path) -> None:
    store, raw, total = _store(tmp_path)
    errors: list[BaseException] = []
    assert run_release(store, raw, errors=errors) == 0, errors
    summary = json.loads((tmp_path / "store/runs/td/validation/topdown.json").read_text())
    assert summary["gx"]["failed"] == 0 and summary["persons_per_state"] == {"10": total}
    _nothing_spent(tmp_path)  # validate only: still nothing measured

    # a person moved to a block that is not in the GRF-C
    key = next(k for k in store.list("confidential/synth/topdown/persons/") if k.endswith(".parquet"))
    frame = pd.read_parquet(io.BytesIO(store.get(key)))
    frame.loc[5, "TABBLK"] = 9999 if frame["TABBLK"].dtype.kind in "iu" else "9999"
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    bad = LocalStore(tmp_path / "bad" / "store")
    for k in store.list(""):
        if not k.startswith("runs/"):
            bad.put(k, store.get(k) if k != key else buf.getvalue())
    raw_bad = {**raw, "store": str(tmp_path / "bad" / "store")}
    errors = []
    assert run_release(bad, raw_bad, errors=errors) == 2
    exc = errors[0]
    assert isinstance(exc, InputError) and exc.row == 7 and exc.column == "GEOID", str(exc)
    _nothing_spent(tmp_path / "bad")

    # the public population invariant disagrees with the person records
    wrong = LocalStore(tmp_path / "inv" / "store")
    for k in store.list(""):
        if not k.startswith("runs/"):
            wrong.put(k, store.get(k))
    wrong.put("public/topdown/invariants.json", json.dumps({"total": total + 1}).encode())
    errors = []
    assert run_release(wrong, {**raw, "store": str(tmp_path / "inv" / "store")}, errors=errors) == 2
    exc = errors[0]
    assert isinstance(exc, InputError) and (exc.file, exc.column) == ("invariants.json", "total"), str(exc)
    _nothing_spent(tmp_path / "inv")
