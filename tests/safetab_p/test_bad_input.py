"""Bad input is rejected before any noise is drawn, with file, row and column named (InputError, exit 2;
ST1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dasflow.cli import main
from dasflow.products.safetab_p import measure as measure_mod
from tests.safetab_p.helpers import PACKAGE_DATA, person, toy_config_dict, write_data_dir, write_dir

BLOCKS = [("010010000010001", "22800", "0001"), ("020010000010001", "99999", "9999")]
GOOD = [person("010010000010001", ["1340"], "9950"), person("020010000010001", ["1010", "3105"], "2020")]


@pytest.fixture(autouse=True)
def no_noise(monkeypatch):
    """Any sampler call during these tests fails the test: validation must come first."""
    def boom(*a, **k):
        raise AssertionError("noise drawn on invalid input")
    monkeypatch.setattr(measure_mod.samplers, "discrete_gaussian", boom)
    monkeypatch.setattr(measure_mod.samplers, "two_sided_geometric", boom)


def _run(tmp_path: Path, persons, raw=None, blocks=BLOCKS) -> int:
    params = write_dir(tmp_path / "params", raw or toy_config_dict("zcdp"), iteration_dir=PACKAGE_DATA)
    data = write_data_dir(tmp_path / "data", persons, blocks)
    return main(["safetab-p", "execute", str(params), str(data), str(tmp_path / "out")])


def _bad(row: list[str], column: str, value: str) -> list[str]:
    from dasflow.products.safetab_p.records import PERSON_COLUMNS
    r = list(row)
    r[PERSON_COLUMNS.index(column)] = value
    return r


CASES = [
    ("race code not in the code list", _bad(GOOD[1], "QRACE2", "0042"), "QRACE2",
     "not in race-and-ethnicity"),
    ("code after a Null", _bad(_bad(GOOD[0], "QRACE2", "Null"), "QRACE3", "1010"), "QRACE3", "after a Null"),
    ("unknown QSPAN", _bad(GOOD[0], "QSPAN", "0001"), "QSPAN", "not in race-and-ethnicity"),
    ("QSPAN Null", _bad(GOOD[0], "QSPAN", "Null"), "QSPAN", "QSPAN"),
    ("age above 115", _bad(GOOD[0], "QAGE", "116"), "QAGE", "outside 0..115"),
    ("age not a number", _bad(GOOD[0], "QAGE", "-01"), "QAGE", "integer"),
    ("sex", _bad(GOOD[0], "QSEX", "3"), "QSEX", "QSEX"),
    ("no race code", _bad(GOOD[0], "QRACE1", "Null"), "QRACE1", "at least one"),
    ("block missing from GRF-C", _bad(GOOD[0], "TABBLK", "0002"), "TABBLK", "GRF-C"),
]


@pytest.mark.parametrize(("what", "row", "column", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_person_rows(tmp_path: Path, capsys, what, row, column, text):
    assert _run(tmp_path, [*GOOD, row]) == 2
    err = capsys.readouterr().err
    assert "person-records.txt" in err and "row 4" in err and f"column {column}" in err and text in err
    assert not (tmp_path / "out").exists()


def test_more_than_max_race_codes(tmp_path: Path, capsys):
    raw = toy_config_dict("zcdp")
    raw["max_race_codes"] = 2
    row = person("010010000010001", ["1340", "1010", "3105"], "9950")
    assert _run(tmp_path, [*GOOD, row], raw) == 2
    err = capsys.readouterr().err
    assert "row 4" in err and "column QRACE3" in err and "max_race_codes=2" in err


def test_threshold_key_missing(tmp_path: Path, capsys):
    raw = toy_config_dict("zcdp")
    del raw["thresholds_p"]["(COUNTY, 2)"]
    assert _run(tmp_path, GOOD, raw) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "column thresholds_p" in err and "(COUNTY, 2)" in err


def test_untabulated_level_needs_no_threshold(tmp_path: Path):
    raw = toy_config_dict("zcdp")
    del raw["thresholds_p"]["(TRACT, 1)"]   # budget 0 in the toy config: not tabulated
    raw["zero_suppression_chance"] = 0
    from dasflow.products.safetab_p.config import parse_config
    assert parse_config(raw).thresholds.get(("TRACT", 1)) is None


@pytest.mark.parametrize(("key", "value", "column"), [
    ("privacy_defn", "approxdp", "privacy_defn"),
    ("privacy_budget_p_stage_1_fraction", 1, "privacy_budget_p_stage_1_fraction"),
    ("privacy_budget_p_level_1_usa", -1, "privacy_budget_p_level_1_usa"),
    ("max_race_codes", 9, "max_race_codes"),
    ("zero_suppression_chance", 1, "zero_suppression_chance"),
])
def test_bad_config_values(tmp_path: Path, capsys, key, value, column):
    raw = toy_config_dict("zcdp")
    raw[key] = value
    assert _run(tmp_path, GOOD, raw) == 2
    assert f"column {column}" in capsys.readouterr().err


def test_grfc_duplicate_block(tmp_path: Path, capsys):
    assert _run(tmp_path, GOOD, blocks=[*BLOCKS, BLOCKS[0]]) == 2
    err = capsys.readouterr().err
    assert "GRF-C.txt" in err and "duplicate block" in err and "row 4" in err


def test_a_malformed_row_is_named_without_its_content(tmp_path: Path) -> None:
    """pyarrow appends the offending row's text to a column-count error; the message keeps the reason and drops
    the row (confidential: the message reaches logs and the terminal)."""
    from dasflow.errors import InputError
    from dasflow.products.safetab_p.records import PERSON_COLUMNS, pipe_chunks, read_pipe_file

    path = tmp_path / "persons.txt"
    secret = "|".join(["SECRET-VALUE"] * (len(PERSON_COLUMNS) - 1))
    path.write_text("|".join(PERSON_COLUMNS) + "\n" + secret + "\n")
    for read in (lambda: read_pipe_file(path, PERSON_COLUMNS), lambda: list(pipe_chunks(path, "p", 10))):
        with pytest.raises(InputError) as err:
            read()
        assert "SECRET" not in str(err.value)
        assert f"Expected {len(PERSON_COLUMNS)} columns, got {len(PERSON_COLUMNS) - 1}" in str(err.value)
