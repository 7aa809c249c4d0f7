"""``dasflow safetab-p execute --ground-truth``: the non-private twin in the release formats — exact counts
(checked against an independent count of the toy file), no noise (two runs are byte-identical), the same
t1/t2 layout, ``ground_truth: true`` in the manifest, its own default output folder, and the same tables from
a split (per-state) person-records input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dasflow.cli import main
from dasflow.products.safetab_p.product import PERSON_DIR
from tests.account_helpers import account_args
from tests.safetab_p.helpers import TOY, TOY_ZCDP, toy_config_dict, write_dir

T1_HEADER = "REGION_ID|REGION_TYPE|ITERATION_CODE|COUNT"
T2_HEADER = "REGION_ID|REGION_TYPE|ITERATION_CODE|AGESTART|AGEEND|SEX|COUNT"


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)


@pytest.fixture()
def params(tmp_path: Path) -> Path:
    raw = toy_config_dict("zcdp")
    raw["thresholds_p"] = {k: [1, 2, 3] for k in raw["thresholds_p"]}  # toy groups are tiny: get T2 cells
    return write_dir(tmp_path / "params", raw, iteration_dir=TOY_ZCDP)


def _expected_usa_ethnicity(params: Path) -> pd.Series:
    """Independent count: US persons per ethnicity iteration (QSPAN code → iterations), levels 1 and 2, of the
    iterations USA tabulates (detailed region type: COARSE_ONLY = False)."""
    persons = _read(TOY / "person-records.txt")
    cfg = json.loads((params / "config.json").read_text())
    us = persons[(persons.TABBLKST != "72")
                 & (persons.TABBLKST.isin(cfg["state_filter_us"]) if cfg.get("state_filter_us") else True)]
    eth = _read(TOY_ZCDP / "ethnicity-characteristic-iterations.txt")
    eth = eth[eth.LEVEL.isin(["1", "2"]) & (eth.COARSE_ONLY == "False")]
    mapping = _read(TOY_ZCDP / "race-and-ethnicity-code-to-iteration.txt")
    mapping = mapping[mapping.ITERATION_CODE.isin(eth.ITERATION_CODE)]
    hits = us.merge(mapping, left_on="QSPAN", right_on="RACE_ETH_CODE")
    return hits.groupby("ITERATION_CODE").size()


def _flags(column: str, value: str) -> list[str]:
    """Level-1/2 iteration codes of the toy files with ``column == value``."""
    out: list[str] = []
    for name in ("race-characteristic-iterations.txt", "ethnicity-characteristic-iterations.txt"):
        df = _read(TOY_ZCDP / name)
        out += list(df.ITERATION_CODE[df.LEVEL.isin(["1", "2"]) & (df[column] == value)])
    return out


def test_ground_truth_twin_exact_and_noiseless(params: Path, tmp_path: Path) -> None:
    outs = []
    for k in range(2):
        out = tmp_path / f"gt{k}"
        assert main(["safetab-p", "execute", "--ground-truth", str(params), str(TOY), str(out)]) == 0
        outs.append(out)
    for rel in ("t1/t1_US.csv", "t2/t2_US.csv"):
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel  # nothing random
    t1 = _read(outs[0] / "t1" / "t1_US.csv")
    t2 = _read(outs[0] / "t2" / "t2_US.csv")
    assert (outs[0] / "t1" / "t1_US.csv").read_text().splitlines()[0] == T1_HEADER
    assert (outs[0] / "t2" / "t2_US.csv").read_text().splitlines()[0] == T2_HEADER
    usa = t1[t1.REGION_TYPE == "USA"].set_index("ITERATION_CODE")["COUNT"].astype(int)
    expected = _expected_usa_ethnicity(params)
    assert len(expected) > 0
    for it, n in expected.items():
        assert usa[it] == n, it
    assert set(usa.index) <= set(_flags("COARSE_ONLY", "False"))  # USA is detailed: no COARSE_ONLY iteration
    coarse = t1[~t1.REGION_TYPE.isin(["USA", "STATE"])]
    assert len(coarse) > 0 and not set(coarse.ITERATION_CODE) & set(_flags("DETAILED_ONLY", "True"))
    assert (t1.COUNT.astype(int) >= 0).all()
    assert int(usa.sum()) > 0
    # T2: per (group, sex) the '*' row is the sum of the age cells; both '*' rows sum to the T1 count
    assert len(t2) > 0
    cells = t2[t2.AGESTART != "*"].assign(COUNT=lambda d: d.COUNT.astype(int))
    stars = t2[t2.AGESTART == "*"].assign(COUNT=lambda d: d.COUNT.astype(int))
    keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
    by_sex = cells.groupby([*keys, "SEX"]).COUNT.sum()
    assert (stars.set_index([*keys, "SEX"]).COUNT.sort_index() == by_sex.sort_index()).all()
    tot = stars.groupby(keys).COUNT.sum()
    t1i = t1.assign(COUNT=t1.COUNT.astype(int)).set_index(keys).COUNT
    assert (t1i.loc[tot.index] == tot).all()
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    assert manifest["ground_truth"] is True
    assert manifest["runs"]["US"]["total_budget"] is None
    assert {s["mechanism"] for s in manifest["runs"]["US"]["plan"]} == {"none"}


def test_ground_truth_default_folder_and_private_run_untouched(params: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["safetab-p", "execute", "--ground-truth", str(params), str(TOY)]) == 0
    assert (tmp_path / "safetab-p-ground-truth" / "t1" / "t1_US.csv").is_file()
    assert not (tmp_path / "safetab-p-output").exists()
    assert main(["safetab-p", "execute", str(params), str(TOY), str(tmp_path / "private"),
                 *account_args(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "private" / "manifest.json").read_text())
    assert manifest["ground_truth"] is False
    assert manifest["runs"]["US"]["total_budget"] == "627/100"
    assert main(["safetab-p", "validate", "--ground-truth", str(params), str(TOY)]) == 0


def test_ground_truth_split_input_same_tables(params: Path, tmp_path: Path) -> None:
    data = tmp_path / "split"
    (data / PERSON_DIR).mkdir(parents=True)
    (data / "GRF-C.txt").write_bytes((TOY / "GRF-C.txt").read_bytes())
    lines = (TOY / "person-records.txt").read_text().splitlines()
    header, rows = lines[0], lines[1:]
    for st in sorted({r.split("|")[3] for r in rows}):
        part = [r for r in rows if r.split("|")[3] == st]
        (data / PERSON_DIR / f"{st}.txt").write_text("\n".join([header, *part]) + "\n")
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["safetab-p", "execute", "--ground-truth", str(params), str(TOY), str(a)]) == 0
    assert main(["safetab-p", "execute", "--ground-truth", str(params), str(data), str(b)]) == 0
    for rel in ("t1/t1_US.csv", "t2/t2_US.csv"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
