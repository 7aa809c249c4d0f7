"""Pipe-delimited release text through Arrow: the same bytes as pandas' writer, the same verdict as the pandas
check of a COUNT column (``dasflow.io.delimited``); the release stage's table check still names the row of a bad
count."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from dasflow.io.delimited import _arrow_writable, integer_counts, pipe_text, read_text_table
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


VERDICTS = [
    ("GEOID|COUNT\n01|5\n02|-7\n03|0\n", True),
    ("GEOID|COUNT\n01|5\n02|-7\n03|0", True),            # no line end after the last row
    ("GEOID|COUNT\n01|5\n02|x", False),                  # a bad last row with no line end
    ("GEOID|COUNT\r\n01|5\r\n02|6\r\n", True),
    ("GEOID|COUNT\n", True),                              # header only: pandas passes it too
    ("GEOID|COUNT\n01|5\n02|\n", False),                  # empty count
    ("GEOID|COUNT\n01|5\n02|1.5\n", False),               # not an integer
    ("GEOID|COUNT\n01|5\n02|1.0\n", False),               # not shown by Arrow: pandas decides (it passes)
    ("GEOID|COUNT\n01|5|9\n", False),                     # ragged row
    ("GEOID|COUNT\n01|5\n02\n", False),                   # short row (pandas reads an empty count)
    ("GEOID|N\n01|5\n", False),                           # no COUNT column
    ("COUNT|COUNT\n1|2\n", False),                        # two: pandas decides
    ("GEOID|COUNT\n01|5\n02|x\n", False),
    ("GEOID|COUNT\n1|5\nUS|7\n", True),                  # a later GEOID that is not a number: never typed
    ('GEOID|COUNT\n"a\nb"|5\n', None),                   # a quoted line break: either (pandas passes it)
    ("", False),
]


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
@pytest.mark.parametrize(("text", "verdict"), VERDICTS)
def test_integer_counts_is_true_only_where_the_pandas_check_passes(text: str, verdict: bool | None,
                                                                  block: int) -> None:
    """The verdict whatever the block size (a block cut inside a row, a row longer than a block); ``True``
    only where the pandas check passes (``None``: either verdict is right)."""
    got = integer_counts(_table(text), block=block)
    assert got is verdict or verdict is None
    if got:
        _check_table("t/passes.csv", _table(text))


def test_integer_counts_refuses_bytes_pandas_cannot_decode_in_any_column() -> None:
    data = b"GEOID|NAME|COUNT\n01|ok|5\n02|\xff\xfe|6\n"
    assert integer_counts(io.BytesIO(data), block=8) is False
    with pytest.raises(OutputInvalid, match="unreadable table"):
        _check_table("t/bad.csv", io.BytesIO(data))


def test_the_pandas_check_reads_the_same_handle_after_the_arrow_pass() -> None:
    """The Arrow pass reads the handle itself, synchronously: when it defers, the pandas parse of the same
    handle sees the whole file (an Arrow reader left reading ahead on it once made that parse see nothing)."""
    for _ in range(50):
        rows = "".join(f"{i:05d}|{i}\n" for i in range(20_000))
        fh = _table("GEOID|COUNT\n" + rows + "20000|x\n")
        with pytest.raises(OutputInvalid, match=r"row 20002, column COUNT: not an integer: 'x'"):
            _check_table("t/late.csv", fh)


def test_check_table_names_the_row_of_a_bad_count() -> None:
    lines = [f"{i:02d}|{i}\n" for i in range(40)]
    rows = "".join(lines)
    with pytest.raises(OutputInvalid, match=r"row 32, column COUNT: not an integer: 'x'"):
        _check_table("t/a.csv", _table("GEOID|COUNT\n" + "".join(lines[:30]) + "30|x\n" + "".join(lines[30:])))
    _check_table("t/b.csv", _table("GEOID|COUNT\n01|1.0\n"))  # integral, as before: passes through pandas
    _check_table("t/c.csv", _table("GEOID|COUNT\n" + rows))
    with pytest.raises(OutputInvalid, match="unreadable table"):
        _check_table("t/d.csv", _table("GEOID|COUNT\n01|5\n02|5|9\n"))


READ_CASES = {
    "GRF-C rows": "TABBLKST|TABBLKCOU|TABTRACTCE|TABBLK|PLACEFP\n01|001|020100|1000|99999\n06|037|101110|2001|44000\n",
    "no line end at the end": "A|B\n01|x\n02|y",
    "CRLF": "A|B\r\n01|x\r\n02|y\r\n",
    "blank lines": "A|B\n01|x\n\n02|y\n",
    "unicode": "A|B\n01|Peñasco\n02|ü\n",
    "missing-looking values": "A|B\n01|NA\n02|x\n",
    "empty field": "A|B\n01|\n02|x\n",
    "None and <NA>": "A|B\nNone|<NA>\n02|x\n",
    "quoted": 'A|B\n"0|1"|x\n02|y\n',
    "ragged (short)": "A|B\n01\n02|y\n",
    "duplicate header": "A|A\n01|x\n",
    "BOM": "\ufeffA|B\n01|x\n",
    "header only": "A|B\n",
    "spaces": "A|B\n 01| x \n",
}


@pytest.mark.parametrize("text", READ_CASES.values(), ids=READ_CASES.keys())
def test_read_text_table_is_pandas_read_csv(text: str) -> None:
    """Through Arrow or through pandas, ``read_text_table`` gives ``pd.read_csv(…, sep="|", dtype=str)``'s frame."""
    data = text.encode()
    want = pd.read_csv(io.BytesIO(data), sep="|", dtype=str)
    pd.testing.assert_frame_equal(read_text_table(data), want, check_exact=True)


def test_read_text_table_refuses_what_pandas_refuses() -> None:
    data = b"A|B\n01|x\n02|y|z\n"
    with pytest.raises(pd.errors.ParserError):
        pd.read_csv(io.BytesIO(data), sep="|", dtype=str)
    with pytest.raises(pd.errors.ParserError):
        read_text_table(data)


@pytest.mark.parametrize("name", ["GRF-C rows", "no line end at the end", "CRLF", "blank lines", "unicode", "spaces"])
def test_read_text_table_parses_plain_tables_through_arrow(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain tables never reach pandas' parser (the fast path is the one taken), and still give its frame."""
    data = READ_CASES[name].encode()
    want = pd.read_csv(io.BytesIO(data), sep="|", dtype=str)

    def refuse(*args: object, **kwargs: object) -> pd.DataFrame:
        raise AssertionError("pandas parsed a plain table")

    monkeypatch.setattr("dasflow.io.delimited.pd.read_csv", refuse)
    pd.testing.assert_frame_equal(read_text_table(data), want, check_exact=True)
