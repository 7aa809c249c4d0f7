"""The ``dasflow phsafe`` command: fail-closed validation (R3), release files, output validator (R16)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dasflow.cli import main
from dasflow.errors import DasflowError, InputError
from dasflow.products.phsafe import load_config, validate_output
from dasflow.products.phsafe.inputs import check_cross_file, read_inputs
from dasflow.products.phsafe.tables import OUTPUT_TABLES
from tests.account_helpers import account_args
from tests.phsafe.builders import US_CONFIG, Person, Unit, config_with, write_csv

UNITS = [Unit([Person(40), Person(38, rel=21), Person(10, rel=25)], state="01"),
         Unit([Person(70, race=2, hisp=2)], state="02", ten=3, hht=4, hht2=9, cplt=5),
         Unit([Person(80, rel=37, rtype=5)], state="02", rtype=4, ten=0, hht=0, hht2=0, cplt=0),
         Unit([], state="06", ten=0, hht=0, hht2=0, cplt=0)]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_csv(UNITS, tmp_path / "in")


def _edit(path: Path, row: int, column: str, value: str) -> None:
    lines = path.read_text().splitlines()
    header = lines[0].split("|")
    cells = lines[row - 1].split("|")
    cells[header.index(column)] = value
    lines[row - 1] = "|".join(cells)
    path.write_text("\n".join(lines) + "\n")


def test_validate_mode_accepts_good_inputs(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["phsafe", "validate", str(US_CONFIG), str(data)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize(("file", "row", "column", "value"), [
    ("persons.csv", 3, "QAGE", "116"),
    ("persons.csv", 2, "CENRACE", "64"),
    ("persons.csv", 4, "RELSHIP", "19"),
    ("units.csv", 2, "TEN", "5"),
    ("units.csv", 3, "HHT2", "13"),
    ("geo.csv", 2, "TABBLKST", "1"),
])
def test_r3_phase2_domain_errors_name_file_row_column(data: Path, file: str, row: int, column: str,
                                                      value: str, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(data / file, row, column, value)
    out = data.parent / "out"
    assert main(["phsafe", "private", str(US_CONFIG), str(data), str(out), "--validate"]) == 2
    err = capsys.readouterr().err
    assert f"file {data / file}, row {row}, column {column}" in err
    assert not out.exists()  # failed closed: nothing written, no noise drawn


def test_r3_phase1_schema_order(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = data / "units.csv"
    lines = p.read_text().splitlines()
    h = lines[0].split("|")
    h[6], h[7] = h[7], h[6]
    lines[0] = "|".join(h)
    p.write_text("\n".join(lines) + "\n")
    assert main(["phsafe", "validate", str(US_CONFIG), str(data)]) == 2
    assert "row 1, column TEN" in capsys.readouterr().err


def test_r3_phase3_cross_file_checks(data: Path) -> None:
    cfg = load_config(US_CONFIG)
    check_cross_file(read_inputs(data), cfg.state_filter)
    bad = [("persons.csv", 2, "MAFID", "100000099", "not in units", "MAFID"),
           ("units.csv", 3, "MAFID", "100000001", "duplicate MAFID", "MAFID"),
           ("geo.csv", 2, "TABBLKST", "72", "not in state_filter", "TABBLKST"),
           ("units.csv", 2, "HHRACE", "00", "NIU", "HHRACE"),
           ("persons.csv", 6, "RTYPE", "3", "RTYPE and RELSHIP", "RELSHIP")]
    for file, row, column, value, needle, named in bad:
        copy = data.parent / f"bad-{file}-{column}"
        write_csv(UNITS, copy)
        _edit(copy / file, row, column, value)
        with pytest.raises(InputError) as info:
            check_cross_file(read_inputs(copy), cfg.state_filter)
        assert needle in str(info.value) and f"column {named}" in str(info.value), str(info.value)
        assert file in str(info.value)


def test_comma_delimited_inputs_are_accepted(tmp_path: Path) -> None:
    d = write_csv(UNITS, tmp_path / "comma", delimiter=",")
    inputs = read_inputs(d)
    assert len(inputs.persons["MAFID"]) == 5 and inputs.units["HHRACE"].tolist() == [1, 2, 0, 0]


def test_bad_config_exits_2_naming_the_key(data: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    raw = config_with()
    raw["privacy_budget"]["PH4"]["state_H,I"] = -1
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(raw))
    assert main(["phsafe", "private", str(cfg), str(data), str(tmp_path / "o")]) == 2
    assert "privacy_budget.PH4.state_H,I" in capsys.readouterr().err


def test_private_run_writes_release_files_and_validates_them(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "private"
    assert main(["phsafe", "private", str(US_CONFIG), str(data), str(out), "--validate",
                 "--validate-private-output"]) == 3  # a private run spends: without an account it is refused
    assert not out.exists()
    assert main(["phsafe", "private", str(US_CONFIG), str(data), str(out), "--validate",
                 "--validate-private-output", *account_args(tmp_path)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.csv" for t in OUTPUT_TABLES)
    ph1 = (out / "PH1_num.csv").read_text().splitlines()
    assert ph1[0] == ("REGION_ID|REGION_TYPE|ITERATION_CODE|PH1_NUM_DATA_CELL|NOISE_DISTRIBUTION|VARIANCE|"
                      "COUNT")
    assert len(ph1) == 1 + 1040
    assert (out / "PH2.csv").read_text().splitlines()[0] == \
        "REGION_ID|REGION_TYPE|PH2_DATA_CELL|NOISE_DISTRIBUTION|VARIANCE|COUNT"
    df = pd.read_csv(out / "PH1_num.csv", sep="|", dtype={"REGION_ID": str})
    assert set(df["REGION_ID"]) >= {"1", "01", "56"}
    validate_output(out, load_config(US_CONFIG))


def test_r16_output_validator_catches_tampering(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "private"
    assert main(["phsafe", "private", str(US_CONFIG), str(data), str(out), *account_args(tmp_path)]) == 0
    cfg = load_config(US_CONFIG)
    p = out / "PH3.csv"
    original = p.read_text()
    _edit(p, 2, "VARIANCE", "92365.0")
    with pytest.raises(DasflowError, match="VARIANCE"):
        validate_output(out, cfg)
    p.write_text(original)
    p.write_text("\n".join(original.splitlines()[:-1]) + "\n")
    with pytest.raises(DasflowError, match="rows"):
        validate_output(out, cfg)
    p.write_text(original)
    _edit(p, 5, "COUNT", "1.5")
    with pytest.raises(DasflowError, match="COUNT"):
        validate_output(out, cfg)
    p.write_text(original)
    _edit(p, 5, "PH3_DATA_CELL", "3")
    with pytest.raises(DasflowError):
        validate_output(out, cfg)
    p.write_text(original)
    ph8 = out / "PH8_num.csv"  # its owner cell (2) sums two PH7 cells: twice the level's variance, not once
    ph8_original = ph8.read_text()
    frame = pd.read_csv(ph8, sep="|", dtype=str, keep_default_na=False)
    for cell, factor in (("2", 0.5), ("3", 2.0)):
        row = int(frame.index[frame["PH8_NUM_DATA_CELL"] == cell][0]) + 2
        _edit(ph8, row, "VARIANCE", repr(float(frame["VARIANCE"].iloc[row - 2]) * factor))
        with pytest.raises(DasflowError, match=f"row {row}, column VARIANCE"):
            validate_output(out, cfg)
        ph8.write_text(ph8_original)
    validate_output(out, cfg)
    ph8.unlink()
    with pytest.raises(DasflowError, match="missing"):
        validate_output(out, cfg)


def test_non_private_ground_truth(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "truth"
    assert main(["phsafe", "non-private", str(US_CONFIG), str(data), str(out)]) == 0
    df = pd.read_csv(out / "PH1_num.csv", sep="|", dtype={"REGION_ID": str})
    assert list(df.columns) == ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "PH1_NUM_DATA_CELL", "COUNT"]
    usa = df[(df["REGION_ID"] == "1") & (df["ITERATION_CODE"] == "*")]
    # Census non-private format: total cell 1 too, cells sorted as text; the GQ person is excluded
    assert usa["PH1_NUM_DATA_CELL"].tolist() == [1, 2, 3] and usa["COUNT"].tolist() == [4, 1, 3]
    assert not list(out.glob(".*.tmp"))


def test_output_path_required(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["phsafe", "private", str(US_CONFIG), str(data)]) == 2
    assert "OUTPUT_PATH" in capsys.readouterr().err


def test_r2_all_zero_table_writes_no_file_and_zero_level_no_rows(data: Path, tmp_path: Path) -> None:
    raw = config_with()
    for k in raw["privacy_budget"]["PH6"]:
        raw["privacy_budget"]["PH6"][k] = 0
    raw["privacy_budget"]["PH7"]["state_A-G"] = 0
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(raw))
    out = tmp_path / "o"
    assert main(["phsafe", "private", str(cfg), str(data), str(out), "--validate-private-output",
                 *account_args(tmp_path)]) == 0
    assert not (out / "PH6.csv").exists()
    ph7 = pd.read_csv(out / "PH7.csv", sep="|", dtype=str)
    assert len(ph7) == 1560 - 51 * 7 * 3
    assert not ((ph7["REGION_TYPE"] == "STATE") & ph7["ITERATION_CODE"].isin(list("ABCDEFG"))).any()
    assert len(pd.read_csv(out / "PH8_num.csv", sep="|", dtype=str)) == 1040 - 51 * 7 * 2
