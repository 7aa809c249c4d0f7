"""TopDown inputs through the DAG with the validation gate: a valid one-state synthetic census passes the
validate stage with the GX suite; a person in a block outside the GRF-C, a wrong population invariant (total or
state), a state missing from the invariants and a person in a structural-zero cell (public block facts) are
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
from tests.dag.helpers import topdown_release
from tests.validation.helpers import run_release

CONFIG = {"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1", "privacy_defn": "zcdp", "strategy": "pl94"}


def _store(tmp: Path) -> tuple[LocalStore, dict[str, Any], int]:
    raw = topdown_release(tmp, "td", states=["10"], persons=1500, synth_seed=4)
    store = LocalStore(tmp / "store")
    return store, raw, int(json.loads(store.get("public/topdown/invariants.json"))["total"])


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
    wrong.put("public/topdown/invariants.json", json.dumps({"total": total + 1, "state": {"10": total}}).encode())
    errors = []
    assert run_release(wrong, {**raw, "store": str(tmp_path / "inv" / "store")}, errors=errors) == 2
    exc = errors[0]
    assert isinstance(exc, InputError) and (exc.file, exc.column) == ("invariants.json", "total"), str(exc)
    _nothing_spent(tmp_path / "inv")


def _copy(store: LocalStore, tmp: Path, name: str, replace: dict[str, bytes]) -> tuple[LocalStore, str]:
    out = LocalStore(tmp / name / "store")
    for k in store.list(""):
        if not k.startswith("runs/"):
            out.put(k, replace.get(k, store.get(k)))
    return out, str(tmp / name / "store")


@pytest.mark.parametrize("case", ["state_total", "state_extra", "state_missing"])
def test_topdown_gate_state_invariants(tmp_path: Path, case: str) -> None:
    """A state population invariant that disagrees with the records, a state not in the geography, and a
    geography state without an invariant: exit 2 naming invariants.json and the key, nothing measured."""
    store, raw, total = _store(tmp_path)
    inv = {"state_total": {"total": total, "state": {"10": total - 1}},
           "state_extra": {"total": total, "state": {"10": total, "11": 0}},
           "state_missing": {"total": total, "state": {}}}[case]
    bad, root = _copy(store, tmp_path, case, {"public/topdown/invariants.json": json.dumps(inv).encode()})
    errors: list[BaseException] = []
    assert run_release(bad, {**raw, "store": root}, errors=errors) == 2
    exc = errors[0]
    want = {"state_total": "state.10", "state_extra": "state.11", "state_missing": "state.10"}[case]
    assert isinstance(exc, InputError) and exc.file == "invariants.json", str(exc)
    assert exc.column in (want, "state"), str(exc)
    _nothing_spent(tmp_path / case)


def test_topdown_gate_structural_zero_person(tmp_path: Path) -> None:
    """A person whose HHGQ its block's public facts rule out (e.g. a GQ type the block has no facility of):
    exit 2 with the person file, row and column HHGQ, nothing measured."""
    store, raw, _ = _store(tmp_path)
    facts = pd.read_csv(io.BytesIO(store.get("public/topdown/block_facts.csv")), sep="|", dtype={"GEOID": str})
    key = next(k for k in store.list("confidential/synth/topdown/persons/") if k.endswith(".parquet"))
    frame = pd.read_parquet(io.BytesIO(store.get(key)))
    geoid = (frame["TABBLKST"].astype(str).str.zfill(2) + frame["TABBLKCOU"].astype(str).str.zfill(3)
             + frame["TABTRACTCE"].astype(str).str.zfill(6) + frame["TABBLK"].astype(str).str.zfill(4))
    no_gq2 = set(facts.loc[facts["GQ2"] == 0, "GEOID"])
    row = int(next(i for i, g in enumerate(geoid) if g in no_gq2 and i >= 3))
    frame.loc[row, "HHGQ"] = 2
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    bad, root = _copy(store, tmp_path, "zero", {key: buf.getvalue()})
    errors: list[BaseException] = []
    assert run_release(bad, {**raw, "store": root}, errors=errors) == 2
    exc = errors[0]
    assert isinstance(exc, InputError) and (exc.row, exc.column) == (row + 2, "HHGQ"), str(exc)
    assert exc.file is not None and "topdown" in exc.file
    _nothing_spent(tmp_path / "zero")
