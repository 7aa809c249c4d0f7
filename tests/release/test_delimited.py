"""Pipe-delimited release text through Arrow: the same bytes as pandas' writer (``dasflow.io.delimited``); the
release stage's table check (pandas) still names the row of a bad count."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from dasflow.io.delimited import _arrow_writable, pipe_text
from dasflow.release.publish import OutputInvalid, _check_table


def _pandas(frame: pd.DataFrame, header: bool = True) -> bytes:
    return str(frame.to_csv(index=False, sep="|", lineterminator="\n", header=header)).encode()


def _frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(20)
    n = 5_000
    geoid = pd.array([f"{i:015d}" for i in rng.integers(0, 10**15, n)], dtype="string")
    codes = {"HHGQ": rng.integers(0, 8, n), "CENRACE": rng.integers(0, 63, n).astype(np.int16),
             "COUNT": rng.integers(-3, 10**12, n), "BIG": rng.integers(0, 2**63, n, dtype=np.uint64)}
    base = pd.DataFrame({"GEOID": geoid, **codes})
    odd = base.head(6).copy()
    odd["GEOID"] = pd.array(["a|b", 'say "x"', "line\nbreak", "cr\rhere", "", None], dtype="string")
    commas = base.head(4).assign(NAME=pd.array(["a,b", " lead", "tab\there", "semi;colon"], dtype="string"))
    floats = base.head(50).assign(MOE=rng.random(50) * 1e-5)
    return {
        "integers and digit strings": base,
        "values pandas quotes": odd,
        "commas, blanks and tabs (not quoted)": commas,
        "missing and unicode strings": base.head(4).assign(NAME=pd.array(["Añasco", None, "", "Łódź"],
                                                                         dtype="string")),
        "no rows": base.head(0),
        "one text column with empty and missing values": pd.DataFrame(
            {"NAME": pd.array(["", "x", None], dtype="string")}),
        "one integer column": base[["COUNT"]],
        "floats (pandas only)": floats,
        "booleans (pandas only)": base.head(5).assign(FLAG=[True, False, True, True, False]),
        "objects (pandas only)": base.head(5).assign(GEOID=base["GEOID"].head(5).astype(object)),
        "header pandas quotes": base.head(5).rename(columns={"COUNT": "CO|UNT"}),
        "non-default index": base.iloc[[7, 3, 11]],
    }


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("name", list(_frames()))
def test_pipe_text_is_byte_identical_to_pandas(name: str, header: bool) -> None:
    frame = _frames()[name]
    assert pipe_text(frame, header=header) == _pandas(frame, header=header)


def test_arrow_writes_only_integer_and_string_columns_with_plain_headers() -> None:
    frames = _frames()
    assert _arrow_writable(frames["integers and digit strings"])
    assert _arrow_writable(frames["values pandas quotes"])  # eligible: Arrow refuses the values, pandas writes
    for name in ("floats (pandas only)", "booleans (pandas only)", "objects (pandas only)", "header pandas quotes"):
        assert not _arrow_writable(frames[name]), name


def _table(text: str) -> io.BytesIO:
    return io.BytesIO(text.encode())


def test_check_table_names_the_row_of_a_bad_count() -> None:
    lines = [f"{i:02d}|{i}\n" for i in range(40)]
    rows = "".join(lines)
    with pytest.raises(OutputInvalid, match=r"row 32, column COUNT: not an integer: 'x'"):
        _check_table("t/a.csv", _table("GEOID|COUNT\n" + "".join(lines[:30]) + "30|x\n" + "".join(lines[30:])))
    _check_table("t/b.csv", _table("GEOID|COUNT\n01|1.0\n"))  # integral, as before: passes through pandas
    _check_table("t/c.csv", _table("GEOID|COUNT\n" + rows))
    with pytest.raises(OutputInvalid, match="unreadable table"):
        _check_table("t/d.csv", _table("GEOID|COUNT\n01|5\n02|5|9\n"))
