"""The SafeTab-P plugin in the DAG with a split person-records input (``<prefix>/person-records/<state>.txt``):
listed, not read, by ``confidential_inputs``; validated file by file (errors name the file); prepared counts equal
those of the single-file input; both inputs at once refused. (The release DAG's validation gate in
``validation/`` still preflights only ``person-records.txt``; see docs/safetab_p.md.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.products.safetab_p.plugin import PLUGIN
from dasflow.products.safetab_p.tabulate import merged
from tests.safetab_p.helpers import TOY, TOY_ZCDP

INPUTS = {"safetab-p": "confidential/safetab-p/", "safetab-p_public": "public/safetab-p/"}


def _store(root: Path, split: bool, bad_row: bool = False) -> LocalStore:
    store = LocalStore(root)
    lines = (TOY / "person-records.txt").read_text().splitlines()
    if split:
        for st in sorted({r.split("|")[3] for r in lines[1:]}):
            part = [r for r in lines[1:] if r.split("|")[3] == st]
            if bad_row and st == "02":
                part[1] = "1" + part[1]  # QAGE '1xxx': 4 digits, row 3 of 02.txt
            store.put(f"confidential/safetab-p/person-records/{st}.txt", ("\n".join([lines[0], *part]) + "\n").encode())
    else:
        store.put("confidential/safetab-p/person-records.txt", (TOY / "person-records.txt").read_bytes())
    store.put("public/safetab-p/GRF-C.txt", (TOY / "GRF-C.txt").read_bytes())
    for it in TOY_ZCDP.glob("*.txt"):
        store.put(f"public/safetab-p/{it.name}", it.read_bytes())
    return store


def _prepared(store: LocalStore) -> tuple[dict, dict]:  # type: ignore[type-arg]
    cfg = PLUGIN.load_config((TOY_ZCDP / "config.json").read_text(), "US")
    public = PLUGIN.public_inputs(store, INPUTS, cfg)
    conf = PLUGIN.confidential_inputs(store, INPUTS, cfg)
    summary = PLUGIN.validate(conf, public, cfg)
    return conf | {"summary": summary}, PLUGIN.product(cfg).prepare(conf, public)


def test_split_input_prepares_the_same_counts(tmp_path: Path) -> None:
    conf_a, prep_a = _prepared(_store(tmp_path / "a", split=False))
    conf_b, prep_b = _prepared(_store(tmp_path / "b", split=True))
    assert "persons" in conf_a and len(conf_b["person_files"]) == 4
    assert conf_a["summary"]["persons"] == conf_b["summary"]["persons"] == 10
    assert set(prep_a) == set(prep_b)
    for key in prep_a:
        if key.startswith("counts/"):
            assert merged(prep_a[key]).equals(merged(prep_b[key])), key
        else:
            assert prep_a[key].equals(prep_b[key]), key


def test_split_input_bad_row_names_file(tmp_path: Path) -> None:
    store = _store(tmp_path, split=True, bad_row=True)
    cfg = PLUGIN.load_config((TOY_ZCDP / "config.json").read_text(), "US")
    conf = PLUGIN.confidential_inputs(store, INPUTS, cfg)
    with pytest.raises(InputError, match="QAGE") as exc:
        PLUGIN.validate(conf, PLUGIN.public_inputs(store, INPUTS, cfg), cfg)
    assert exc.value.file == "person-records/02.txt" and exc.value.row == 3


def test_both_person_inputs_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, split=True)
    store.put("confidential/safetab-p/person-records.txt", (TOY / "person-records.txt").read_bytes())
    cfg = PLUGIN.load_config((TOY_ZCDP / "config.json").read_text(), "US")
    with pytest.raises(InputError, match="both"):
        PLUGIN.confidential_inputs(store, INPUTS, cfg)
