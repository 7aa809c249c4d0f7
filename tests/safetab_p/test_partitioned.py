"""The partitioned person path (``DATA_DIR/person-records/*.txt``): byte-identical outputs to the in-memory
path with a seeded generator, whatever the split (per state, or arbitrary interleaved rows); USA counted once
per population group (one noisy count, not a sum of per-file noisy counts); bad rows reported with the file's
own name and row before any noise; and the fixed-width fast parsers agree with the regular-expression ones."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dasflow import synth
from dasflow.cli import main
from dasflow.errors import InputError
from dasflow.privacy import rng
from dasflow.products.safetab_p import product
from dasflow.products.safetab_p.config import load_config, parse_config
from dasflow.products.safetab_p.iterations import PACKAGED_DIR
from dasflow.products.safetab_p.product import PERSON_DIR, load_inputs, load_public, run_universe
from dasflow.products.safetab_p.records import (
    PERSON_COLUMNS,
    PERSON_FILE,
    encode_persons,
    parse_digits,
    read_pipe_file,
)
from dasflow.products.safetab_p.tabulate import PersonCounts, merged, tabulate_level
from tests.safetab_p.helpers import person, persons_table, toy_config_dict, toy_iterations
from tests.safetab_p.helpers import public as make_public

STATES = ["02", "11", "44", "72"]  # small states incl. AIANNH areas (AK) and Puerto Rico (a separate run)


def _write(path: Path, table: pa.Table) -> None:
    lines = ["|".join(PERSON_COLUMNS)]
    cols = [table.column(c).to_pylist() for c in PERSON_COLUMNS]
    lines += ["|".join(r) for r in zip(*cols, strict=True)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 12,000-person synthetic census (dasflow.synth) as one file, split per state, and split into 3
    interleaved files (every 3rd row), plus a params dir with a lowered-threshold production config."""
    root = tmp_path_factory.mktemp("stp")
    synth.generate(root / "gen", persons=12_000, seed=11, states=STATES, formats=("safetab_p",))
    single = root / "single"
    shutil.copytree(root / "gen" / "safetab_p", single)
    table = read_pipe_file(single / PERSON_FILE, PERSON_COLUMNS)
    per_state = root / "per_state"
    interleaved = root / "interleaved"
    for d in (per_state, interleaved):
        (d / PERSON_DIR).mkdir(parents=True)
        shutil.copy(single / "GRF-C.txt", d / "GRF-C.txt")
    for st in STATES:
        _write(per_state / PERSON_DIR / f"{st}.txt", table.filter(pc.equal(table.column("TABBLKST"), st)))
    rows = np.arange(table.num_rows)
    for k in range(3):
        _write(interleaved / PERSON_DIR / f"part-{k}.txt", table.take(pa.array(rows[rows % 3 == k])))
    raw = json.loads((PACKAGED_DIR / "production-config.json").read_text())
    # low thresholds so that stage 2 produces Sex × Age cells at this size (adaptivity exercised)
    raw["thresholds_p"] = {k: [5, 20, 60] for k in raw["thresholds_p"]}
    for rt in ("county", "tract", "place", "pr_county", "pr_tract", "pr_place"):  # keep the test fast: their
        raw[f"privacy_budget_p_level_2_{rt}"] = 0  # level-2 domains are 2,944 groups per region
    params = root / "params"
    params.mkdir()
    (params / "config.json").write_text(json.dumps(raw))
    return {"single": single, "per_state": per_state, "interleaved": interleaved, "params": params}


def _digest(result: Any) -> dict[str, str]:
    out = {k: hashlib.sha256(v.to_csv(sep="|", index=False).encode()).hexdigest()
           for k, v in result.tables.items()}
    for k, m in result.measurements.items():
        out[k] = hashlib.sha256(pd.util.hash_pandas_object(m.table, index=False).to_numpy().tobytes()
                                + ",".join(m.table.columns).encode()).hexdigest()
    return out


@pytest.mark.parametrize("universe", ["US", "PR"])
def test_split_inputs_are_byte_identical_to_single_file(census: dict[str, Path], universe: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(census["params"])
    digests = {}
    for name in ("single", "per_state", "interleaved", "single-sliced"):
        if name == "single-sliced":  # the same file encoded and counted in slices of 1,000 rows, then merged
            monkeypatch.setattr(product, "SLICE_ROWS", 1000)
            name = "single"
        public = load_public(census["params"], census[name], universe, cfg)  # type: ignore[arg-type]
        inputs = load_inputs(census[name])
        assert ("person_files" in inputs) == (name != "single")
        result = run_universe(public, inputs, rng.seeded(2024))
        digests[name if product.SLICE_ROWS != 1000 else "sliced"] = _digest(result)
        if name == "single":
            t2 = result.tables["t2"]
            assert len(t2) > 0, "thresholds too high: stage 2 never asked for Sex x Age cells"
    assert digests["per_state"] == digests["single"]
    assert digests["interleaved"] == digests["single"]
    assert digests["sliced"] == digests["single"]


def test_usa_is_one_noisy_count_per_group(census: dict[str, Path]) -> None:
    """Per-state files, one USA stage-1 row per (non-TotalOnly) iteration: the states' counts were summed
    before noise (a sum of per-state noisy counts would need one draw per state and group)."""
    cfg = load_config(census["params"])
    public = load_public(census["params"], census["per_state"], "US", cfg)
    result = run_universe(public, load_inputs(census["per_state"]), rng.seeded(1))
    level = public["iterations"].levels[1]
    s1 = result.measurements["safetab-p/US/USA/1/stage1"].table
    assert len(s1) == int((~level.total_only).sum())
    assert s1["REGION_ID"].astype(str).unique().tolist() == ["1"]


def test_merged_counts_equal_counts_of_all_persons(census: dict[str, Path]) -> None:
    cfg = load_config(census["params"])
    public = load_public(census["params"], census["single"], "US", cfg)
    geo, index = public["geography"], public["iterations"]
    table = read_pipe_file(census["single"] / PERSON_FILE, PERSON_COLUMNS)
    whole = encode_persons(table, geo, index, 8, cfg.state_filter_us, "x")
    parts = [encode_persons(table.slice(a, b - a), geo, index, 8, cfg.state_filter_us, "x")
             for a, b in ((0, 1000), (1000, 7000), (7000, table.num_rows))]
    for rt in ("USA", "STATE", "TRACT", "AIANNH"):
        m = PersonCounts.merge([PersonCounts(p, rt) for p in parts])
        for lv in (1, 2):
            a = merged(tabulate_level(PersonCounts(whole, rt), index.levels[lv]))
            b = merged(tabulate_level(m, index.levels[lv]))
            assert a.equals(b), (rt, lv)
        assert int(m.race_count.sum()) == int(PersonCounts(whole, rt).race_count.sum())


def test_cli_split_bad_row_names_the_file_and_draws_nothing(census: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    shutil.copytree(census["per_state"], data)
    bad = data / PERSON_DIR / "44.txt"
    lines = bad.read_text().splitlines()
    lines[3] = "116" + lines[3][3:]  # row 4 of that file (header = row 1)
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["safetab-p", "execute", str(census["params"]), str(data), str(out)]) == 2
    err = capsys.readouterr().err
    assert "44.txt" in err and "row 4" in err and "QAGE" in err
    assert not out.exists()


def test_bad_row_in_a_later_slice_names_the_files_own_row(census: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(product, "SLICE_ROWS", 1000)
    data = tmp_path / "data"
    shutil.copytree(census["single"], data)
    path = data / PERSON_FILE
    lines = path.read_text().splitlines()
    fields = lines[2499].split("|")  # file row 2500 (header = row 1): in the third slice
    fields[16] = "99x9"
    lines[2499] = "|".join(fields)
    path.write_text("\n".join(lines) + "\n")
    cfg = load_config(census["params"])
    public = load_public(census["params"], data, "US", cfg)
    with pytest.raises(InputError, match="QSPAN") as exc:
        product.SafeTabP().prepare(load_inputs(data), public)
    assert exc.value.row == 2500 and exc.value.column == "QSPAN"


def test_both_inputs_or_an_empty_split_are_refused(census: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "both"
    shutil.copytree(census["per_state"], data)
    shutil.copy(census["single"] / PERSON_FILE, data / PERSON_FILE)
    with pytest.raises(InputError, match="both"):
        load_inputs(data)
    empty = tmp_path / "empty"
    (empty / PERSON_DIR).mkdir(parents=True)
    with pytest.raises(InputError, match="no person-records files"):
        load_inputs(empty)


@pytest.mark.parametrize("values", [
    ["005", "115", "000", "999"],            # fixed width 3: fast path
    ["5", "05", "115", "1234", "a1", "", " 5", "٣"],  # variable width: regex path, with failures
    ["12a", "115", "0x1", "+12", "-01"],     # fixed width with non-digits
])
def test_fast_digit_parser_agrees_with_regex(values: list[str]) -> None:
    col = pa.chunked_array([pa.array(values[:2]), pa.array(values[2:])])
    ok, val = parse_digits(col, 1, 3)
    want_ok = np.array([v.isascii() and v.isdigit() and 1 <= len(v) <= 3 for v in values])
    assert (ok == want_ok).all()
    assert (val[ok] == np.array([int(v) for v, g in zip(values, want_ok, strict=True) if g])).all()
    assert (val[~ok] == 0).all()


def test_fast_code_column_matches_rules(tmp_path: Path) -> None:
    """Fixed-width (4-byte) race columns: 'Null', real codes, and near-misses ('null', '10a0', '0000')."""
    raw = toy_config_dict("zcdp")
    cfg = parse_config(raw, source="config.json")
    pub = make_public(cfg, toy_iterations())
    good = persons_table([person(races=("1000",), qspan="1010"), person(races=("1011", "1012"), qspan="1010")])
    p = encode_persons(good, pub["geography"], pub["iterations"], 8, (), "f")
    assert p.n == 2 and p.combo_codes[p.combo[1]][1] >= 0
    for bad_code, msg in (("null", "not a race/ethnicity code"), ("10a0", "not a race/ethnicity code"),
                          ("0000", "code not in")):
        t = persons_table([person(races=("1000",), qspan="1010"), person(races=("1000", bad_code), qspan="1010")])
        with pytest.raises(InputError, match=msg) as exc:
            encode_persons(t, pub["geography"], pub["iterations"], 8, (), "f")
        assert exc.value.row == 3 and exc.value.column == "QRACE2"
