"""The fast paths are the reference semantics, only faster: the readers accept exactly the files the
value-by-value regex reader accepts (same integers; otherwise the same InputError), and the shared
truncation order / one-pass join / per-unit counting give the reference ``truncate_and_join`` counts."""

from __future__ import annotations

import mmap
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dasflow.errors import InputError
from dasflow.products.phsafe import inputs as rd
from dasflow.products.phsafe import parse_config, run_non_private
from dasflow.products.phsafe import preprocess as pp
from dasflow.products.phsafe.tabulate import build_universe, join_records, tabulate
from dasflow.products.phsafe.truncate import grouped_content_order, truncate_and_join
from tests.phsafe.builders import Person, Unit, config_with, write_csv

PERSONS = "RTYPE|MAFID|QAGE|CENHISP|CENRACE|RELSHIP\n"
UNITS = "RTYPE|MAFID|FINAL_POP|NPF|HHSPAN|HHRACE|TEN|HHT|HHT2|CPLT\n"
GEO = "RTYPE|MAFID|TABBLKST|TABBLKCOU|TABTRACTCE|TABBLK|TABBLKGRPCE|REGIONCE|DIVISIONCE|PLACEFP|AIANNHCE\n"
P_OK = ["3|100000001|47|1|09|20", "3|100000001|5|2|01|25", "5|100000002|115|1|63|38"]
U_OK = ["2|100000001|2|2|1|09|1|1|02|1", "4|100000002|00012|0|0|00|0|0|00|0"]
G_OK = ["2|100000001|01|001|000100|1001|1|3|6|99999|9999", "4|100000002|02|013|123456|2000|2|3|5|00000|0001"]


def _outcome(path: Path, name: str, reader: str) -> object:
    delim = rd._delimiter(path)
    try:
        cols = rd._read_exact(path, name, delim) if reader == "exact" else rd.read_table(path, name)
    except InputError as exc:
        return ("error", str(exc), exc.row, exc.column)
    return {k: (v.dtype.str, v.tolist()) for k, v in cols.items()}


def _same(tmp_path: Path, name: str, text: str | bytes) -> object:
    path = tmp_path / f"{name}.csv"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    fast, exact = _outcome(path, name, "fast"), _outcome(path, name, "exact")
    assert fast == exact
    return fast


@pytest.mark.parametrize(("name", "header", "good"), [("persons", PERSONS, P_OK), ("units", UNITS, U_OK),
                                                       ("geo", GEO, G_OK)])
def test_fast_reader_equals_exact_reader_on_valid_files(tmp_path: Path, name: str, header: str,
                                                        good: list[str]) -> None:
    out = _same(tmp_path, name, header + "\n".join(good) + "\n")
    assert isinstance(out, dict) and len(out["MAFID"][1]) == len(good)
    _same(tmp_path, name, header + "\n".join(good))  # no final newline
    _same(tmp_path, name, header.replace("\n", "\r\n") + "\r\n".join(good) + "\r\n")  # CRLF
    _same(tmp_path, name, header + "\n".join(good) + "\n\n")  # trailing blank line
    _same(tmp_path, name, header)  # header only
    _same(tmp_path, name, (header + "\n".join(good) + "\n").replace("|", ","))  # comma-delimited
    quoted = good[0].split("|")
    quoted[1] = f'"{quoted[1]}"'
    _same(tmp_path, name, header + "|".join(quoted) + "\n" + "\n".join(good[1:]) + "\n")


@pytest.mark.parametrize(("name", "header", "good", "column", "values"), [
    ("persons", PERSONS, P_OK, 1, ["0100000001", "10000001", "+10000001", " 10000001", "900000001", "099999999",
                                   "0x5F5E100", "1000000O1", "", "NA", "１00000001", "900000000"]),
    ("persons", PERSONS, P_OK, 2, ["07", "116", "1000", "-1", "", "1 ", "٣", "0", "99", "109", "110"]),
    ("persons", PERSONS, P_OK, 4, ["00", "64", "6", "001", "1e", "/1", ":0", "10"]),
    ("persons", PERSONS, P_OK, 0, ["4", "33", "", "é", "5"]),
    ("units", UNITS, U_OK, 2, ["123456", "-1", "1.0", "", "00000", "99999"]),
    ("units", UNITS, U_OK, 3, ["1", "98", "02", "", "97", "0"]),
    ("units", UNITS, U_OK, 8, ["13", "1", "012", "12"]),
    ("geo", GEO, G_OK, 4, ["12345", "12345a", "1234567", "000000"]),
    ("geo", GEO, G_OK, 9, ["1234", "123456", "0000/", "00000"]),
    ("geo", GEO, G_OK, 10, ["12345", "123", "0000"]),
])
def test_fast_reader_reports_the_exact_readers_error(tmp_path: Path, name: str, header: str, good: list[str],
                                                     column: int, values: list[str]) -> None:
    for value in values:
        for row in range(len(good)):
            lines = list(good)
            cells = lines[row].split("|")
            cells[column] = value
            lines[row] = "|".join(cells)
            _same(tmp_path, name, header + "\n".join(lines) + "\n")


def test_fast_reader_on_mangled_lines(tmp_path: Path) -> None:
    body = "\n".join(G_OK) + "\n"
    for bad in (body.replace("|", "||", 1), body[:-5] + "\n", body.replace("|", ";", 3), '"' + body,
                body + "2|100000003|01|001|000100|1001|1|3|6|99999\n", "\ufeff" + body):
        _same(tmp_path, "geo", GEO + bad)
    _same(tmp_path, "persons", PERSONS.encode() + b"3|100000001|4\xff|1|09|20\n")


@pytest.mark.parametrize("name", ["persons", "units", "geo"])
def test_decoding_tables_are_the_regexes(name: str) -> None:
    """Widths 1-4: the tables enumerate the regex; wider: the value range equals the regex on its boundary
    values and a seeded random sample; and no string of another length matches a fixed-width pattern."""
    rng = np.random.default_rng(11)
    for col, width in rd.WIDTHS[name].items():
        rx = re.compile(f"(?:{rd.SCHEMAS[name][col]})")
        if width <= 4:
            allowed = rd.allowed_values(rd.SCHEMAS[name][col], width)
            assert [v for v in range(10 ** width) if rx.fullmatch(f"{v:0{width}d}")] == np.flatnonzero(allowed).tolist()
        else:
            lo, hi = rd._WIDE_RANGES[rd.SCHEMAS[name][col]]
            probe = {0, 10 ** width - 1, lo, hi, lo - 1, hi + 1, *rng.integers(0, 10 ** width, 20000).tolist()}
            for v in probe:
                if 0 <= v < 10 ** width:
                    assert bool(rx.fullmatch(f"{v:0{width}d}")) == (lo <= v <= hi), (col, v)
        for other in range(1, 11):
            if other != width:
                for v in {0, 1, 5, 9, 10 ** other - 1, *rng.integers(0, 10 ** other, 300).tolist()}:
                    assert not rx.fullmatch(f"{v:0{other}d}"), (col, other, v)


def test_decode_digits_byte_tables_reject_every_non_digit_byte() -> None:
    for pattern in ("[0-4]", "0[1-9]|[1-5][0-9]|6[0-3]"):
        width = 1 if pattern == "[0-4]" else 2
        raw = np.array([[b] * width for b in range(256)], dtype=np.uint8)
        got = rd.decode_digits(raw, pattern)
        assert got is None  # non-digit rows are present
        for b in range(256):
            one = rd.decode_digits(np.array([[b] * width], dtype=np.uint8), pattern)
            text = bytes([b] * width).decode("latin-1")
            expect = int(text) if re.fullmatch(f"(?:{pattern})", text) else None
            assert (None if one is None else int(one[0])) == expect


def _random_census(seed: int, n: int = 3000, h: int = 400, shuffle: bool = True,
                   dup_units: int = 0) -> tuple[dict[str, np.ndarray], ...]:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 3, 4, 7, 12, 20], size=h, p=[.25, .25, .15, .15, .1, .06, .04])
    mafid = np.repeat(np.arange(1, h + 1), sizes)[:n].astype(np.int64)
    n = mafid.size
    persons: dict[str, np.ndarray] = {"RTYPE": np.where(rng.random(n) < 0.03, 5, 3).astype(np.int16), "MAFID": mafid,
               "QAGE": rng.integers(0, 30, n).astype(np.int16), "CENHISP": rng.integers(1, 3, n).astype(np.int16),
               "CENRACE": rng.integers(1, 4, n).astype(np.int16), "RELSHIP": rng.integers(20, 37, n).astype(np.int16)}
    dup = np.flatnonzero(rng.random(n) < 0.05)  # identical copies of some records
    persons = {k: np.concatenate([v, v[dup]]) for k, v in persons.items()}
    if shuffle:
        perm = rng.permutation(persons["MAFID"].size)
        persons = {k: v[perm] for k, v in persons.items()}
    umafid = np.concatenate([np.arange(1, h + 1), rng.integers(1, h + 1, dup_units)]).astype(np.int64)
    if shuffle:
        rng.shuffle(umafid)
    m = umafid.size
    units: dict[str, np.ndarray] = {
        "RTYPE": np.full(m, 2, np.int16), "MAFID": umafid, "HHSPAN": rng.integers(1, 3, m).astype(np.int16),
        "HHRACE": rng.integers(1, 64, m).astype(np.int16), "TEN": rng.integers(1, 5, m).astype(np.int16),
        "HHT": rng.integers(1, 8, m).astype(np.int16), "HHT2": rng.integers(1, 13, m).astype(np.int16),
        "CPLT": rng.integers(1, 6, m).astype(np.int16)}
    geo: dict[str, np.ndarray] = {"RTYPE": np.full(h, 2, np.int16), "MAFID": np.arange(1, h + 1, dtype=np.int64),
                                  "TABBLKST": rng.choice(np.array([1, 2], np.int16), h)}
    return persons, units, geo


@pytest.mark.parametrize(("seed", "shuffle", "dup_units"), [(1, True, 0), (2, False, 0), (3, True, 25)])
@pytest.mark.parametrize(("min_tau", "tau"), [(1, 3), (3, 3), (3, 5), (6, 10)])
def test_grouped_order_join_equals_reference_truncate_and_join(seed: int, shuffle: bool, dup_units: int,
                                                              min_tau: int, tau: int) -> None:
    persons, units, geo = _random_census(seed, shuffle=shuffle, dup_units=dup_units)
    uni = build_universe(persons, units, geo, ("01", "02"), min_tau=min_tau)
    assert (uni.person_unit is None) == (dup_units > 0)
    base = np.flatnonzero(pp.person_universe(persons))
    p = {k: v[base] for k, v in persons.items()}
    occ = np.flatnonzero(pp.occupied_units(units))
    for table in ("PH1_num", "PH4", "PH7"):
        rule = pp.JOIN_RULES[table]
        prow = np.flatnonzero(rule.person_filter(p))
        urow = occ[np.flatnonzero(rule.unit_filter({k: v[occ] for k, v in units.items()}))]
        pr, ur = truncate_and_join(p["MAFID"][prow], [p[c][prow] for c in ("RTYPE", "QAGE", "CENHISP", "CENRACE",
                                                                            "RELSHIP")], units["MAFID"][urow], tau)
        pj = {k: v[prow][pr] for k, v in p.items()}
        uj = {k: v[urow][ur] for k, v in units.items()}
        state = geo["TABBLKST"][uj["MAFID"] - 1] - 1
        ref = Counter(zip(rule.cell(pj, uj).tolist(), state.tolist(), strict=True))
        rec = join_records(uni, table, tau)
        weight = np.ones(rec.cell.size, np.int64) if rec.weight is None else rec.weight
        got: Counter[tuple[int, int]] = Counter()
        for c, s, w in zip(rec.cell.tolist(), rec.state.tolist(), weight.tolist(), strict=True):
            got[(c, s)] += w
        assert got == ref and sum(ref.values()) > 100, table
    if tau > min_tau > 1:
        with pytest.raises(ValueError, match="min_tau"):
            join_records(uni, "PH7", min_tau - 1)


def test_grouped_content_order_groups_and_orders_only_large_households() -> None:
    mafid = np.array([5, 1, 5, 5, 1, 9], dtype=np.int64)
    age = np.array([30, 8, 10, 20, 9, 1], dtype=np.int16)
    order, big = grouped_content_order(mafid, [age], min_tau=2)
    assert mafid[order].tolist() == [1, 1, 5, 5, 5, 9]
    assert big.tolist() == [2, 3, 4]
    from dasflow.products.phsafe.truncate import content_order
    full = content_order(mafid, [age])
    assert age[order][2:5].tolist() == age[full][2:5].tolist()


def test_per_unit_weighted_tables_equal_per_person_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    persons, units, geo = _random_census(4)
    cfg = parse_config(config_with(states=["01", "02"]))
    levels = {"PH2": ["usa_*", "state_*"], "PH7": ["usa_*", "usa_A-G", "usa_H,I", "state_*", "state_A-G",
                                                   "state_H,I"]}
    uni = build_universe(persons, units, geo, cfg.state_filter, min_tau=3)
    weighted = tabulate(uni, levels, {"PH2": 3, "PH7": 4}, cfg.state_filter)
    for t in ("PH2", "PH7"):
        monkeypatch.setitem(pp.JOIN_RULES, t, pp.JoinRule(pp.JOIN_RULES[t].person_filter,
                                                          pp.JOIN_RULES[t].unit_filter, pp.JOIN_RULES[t].cell))
    plain = tabulate(uni, levels, {"PH2": 3, "PH7": 4}, cfg.state_filter)
    assert weighted.keys() == plain.keys()
    for k in weighted:
        assert weighted[k].equals(plain[k]), k
    assert int(weighted["PH7/usa_*"]["COUNT"].sum()) > 300


def test_file_order_does_not_change_any_count(tmp_path: Path) -> None:
    """Same records, households written in reverse and persons shuffled: identical truncated counts."""
    big = [Unit([Person(40 + i % 7, rel=20 if i == 0 else 25 + i % 3) for i in range(14)], hht2=1),
           Unit([Person(30), Person(3, rel=25), Person(3, rel=25)], hht2=1, state="02"),
           *[Unit([Person(20 + k), Person(50, rel=29)], hht=2, hht2=11, cplt=5) for k in range(5)]]
    cfg = parse_config(config_with(states=["01", "02"]))
    a = write_csv(big, tmp_path / "a")
    b = write_csv(big, tmp_path / "b")
    lines = (b / "persons.csv").read_text().splitlines()
    rng = np.random.default_rng(2)
    (b / "persons.csv").write_text("\n".join([lines[0], *[lines[i + 1] for i in rng.permutation(len(lines) - 1)]])
                                   + "\n")
    ia, ib = rd.read_inputs(a), rd.read_inputs(b)
    fa = run_non_private(ia.persons, ia.units, ia.geo, cfg, truncate=True)
    fb = run_non_private(ib.persons, ib.units, ib.geo, cfg, truncate=True)
    for t in fa:
        assert fa[t].equals(fb[t]), t


def test_household_counting_with_a_person_filter_equals_per_person(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-household path with a person filter (min(filtered persons, τ) per unit) against the per-person
    truncated join, on shuffled records with large households."""
    persons, units, geo = _random_census(6)
    cfg = parse_config(config_with(states=["01", "02"]))
    levels = {"PH7": ["usa_*", "state_A-G", "state_H,I"]}
    base = pp.JOIN_RULES["PH7"]
    out = {}
    for unit_cell in (True, False):
        monkeypatch.setitem(pp.JOIN_RULES, "PH7", pp.JoinRule(lambda p: np.asarray(p["QAGE"] < 15), base.unit_filter,
                                                              base.cell, unit_cell=unit_cell))
        uni = build_universe(persons, units, geo, cfg.state_filter, min_tau=2)
        rec = join_records(uni, "PH7", 2)
        assert (rec.weight is not None) == unit_cell
        out[unit_cell] = tabulate(uni, levels, {"PH7": 2}, cfg.state_filter)
    for k in out[True]:
        assert out[True][k].equals(out[False][k]), k
    assert 100 < int(out[True]["PH7/usa_*"]["COUNT"].sum()) < int((persons["QAGE"] < 15).sum())


@pytest.mark.parametrize("spread", [1, 3, 10_000])
def test_lookup_sorted_by_runs_equals_binary_search(spread: int) -> None:
    rng = np.random.default_rng(spread)
    blocks = [np.arange(s, s + rng.integers(1, 400 // spread + 2)) for s in
              np.sort(rng.choice(10 ** 6, 40, replace=False)) * 1000 + 100_000_000]
    keys = np.unique(np.concatenate([*blocks, rng.integers(100_000_000, 100_000_000 + 3000 * spread, 3000)]))
    queries = np.concatenate([keys, rng.integers(99_999_000, 100_001_000 + 3000 * spread, 5000), [0, 2 ** 40]])
    got = pp.lookup_sorted(keys, queries)
    pos = np.searchsorted(keys, queries)
    expect = np.where((pos < keys.size) & (keys[np.minimum(pos, keys.size - 1)] == queries), pos, -1)
    assert got.tolist() == expect.tolist() and (got >= 0).sum() >= keys.size
    assert pp.lookup_sorted(keys[:0], queries).tolist() == [-1] * queries.size


def _mapped_rss_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_read_pages_leave_the_resident_set(tmp_path: Path) -> None:
    """The fixed-width reader drops the mapped pages it has read (a national geo.csv is GBs): after
    ``_release_pages`` the mapping holds no resident page below the released offset, and the offset returned
    is page-aligned; ``read_table`` still reads every row of a file many blocks long."""
    path = tmp_path / "geo.csv"
    rows = [f"2|{100000000 + i:09d}|01|001|000100|1001|1|3|6|99999|9999" for i in range(3 * rd._BLOCK + 5)]
    path.write_text(GEO + "\n".join(rows) + "\n")
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    assert int(buf.sum(dtype=np.int64)) > 0  # every page touched
    before = _mapped_rss_kb(path)
    assert before * 1024 >= path.stat().st_size - 4096
    end = rd._release_pages(buf, 0, path.stat().st_size)
    assert end % mmap.PAGESIZE == 0 and path.stat().st_size - end < mmap.PAGESIZE
    assert _mapped_rss_kb(path) <= mmap.PAGESIZE // 1024  # the last partial page at most
    del buf
    cols = rd.read_table(path, "geo")
    assert cols["MAFID"].tolist() == [100000000 + i for i in range(len(rows))]


def test_a_malformed_row_is_named_without_its_content(tmp_path: Path) -> None:
    """pyarrow appends the offending row's text to a column-count error; PHSafe's reader keeps the reason and
    drops the row (confidential: the message reaches logs and the terminal)."""
    path = tmp_path / "persons.csv"
    path.write_text(PERSONS + P_OK[0] + "\n" + "3|100000777|47|1" + "\n")
    with pytest.raises(InputError) as err:
        rd._read_exact(path, "persons", "|")
    assert "100000777" not in str(err.value) and "Expected 6 columns, got 4" in str(err.value)
    assert err.value.__cause__ is None
