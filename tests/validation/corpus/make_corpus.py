"""Regenerate the bad-input corpus: ``python -m tests.validation.corpus.make_corpus`` (deterministic).

``base/`` is a small valid synthetic census (300 persons in Delaware, seed 1) laid out as store keys; each case
under ``cases/<name>/`` replaces one store object with a broken copy, and ``cases.json`` records the product,
the replaced key and where the rejection must point (file, row: 1-based with the header as row 1, column).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

HERE = Path(__file__).resolve().parent
BASE = HERE / "base"
CASES = HERE / "cases"

PH_P, PH_U, PH_G = "confidential/phsafe/persons.csv", "confidential/phsafe/units.csv", "public/phsafe/geo.csv"
ST_P, ST_G = "confidential/safetab-p/person-records.txt", "public/safetab-p/GRF-C.txt"
ST_MAP = "public/safetab-p/race-and-ethnicity-code-to-iteration.txt"
GS_U = "confidential/groupsize/10/part-00000.parquet"
GS_INV = "public/groupsize/invariants.json"
GS_DIR = "confidential/groupsize/"


def make_base() -> None:
    from dasflow import synth
    from dasflow.products.safetab_p.iterations import ITERATION_FILES, PACKAGED_DIR

    if BASE.exists():
        shutil.rmtree(BASE)
    with tempfile.TemporaryDirectory() as tmp:
        synth.generate(tmp, persons=300, seed=1, states=["10"], formats=("phsafe", "safetab_p", "groupsize"))
        t = Path(tmp)
        moves = {PH_P: "phsafe/persons.csv", PH_U: "phsafe/units.csv", PH_G: "phsafe/geo.csv",
                 ST_P: "safetab_p/person-records.txt", ST_G: "safetab_p/GRF-C.txt",
                 GS_U: "groupsize/units/10/part-00000.parquet"}
        for key, src in moves.items():
            (BASE / key).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(t / src, BASE / key)
    for name in ITERATION_FILES:
        shutil.copyfile(PACKAGED_DIR / name, BASE / "public/safetab-p" / name)
    units = pd.read_parquet(BASE / GS_U)
    occupied = int(((units.HHGQ == 0) & (units.SIZE >= 1)).sum())
    (BASE / GS_INV).parent.mkdir(parents=True, exist_ok=True)
    (BASE / GS_INV).write_text(json.dumps({"occupied_units": occupied}) + "\n")
    counties = sorted({f"{c:03d}" for c in units.TABBLKCOU})
    (BASE / "public/groupsize/geography.csv").write_text("STATE,COUNTY\n" + "".join(f"10,{c}\n" for c in counties))


def _lines(key: str) -> list[str]:
    return (BASE / key).read_text().splitlines()


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _set(key: str, line: int, column: str, value: str) -> bytes:
    lines = _lines(key)
    cols = lines[0].split("|")
    fields = lines[line].split("|")
    fields[cols.index(column)] = value
    lines[line] = "|".join(fields)
    return _text(lines)


def _field(key: str, line: int, column: str) -> str:
    lines = _lines(key)
    return lines[line].split("|")[lines[0].split("|").index(column)]


def _row_where(key: str, column: str, value: str) -> int:
    lines = _lines(key)
    j = lines[0].split("|").index(column)
    return next(i for i, ln in enumerate(lines) if i and ln.split("|")[j] == value) + 1


def _occupied_line() -> int:
    lines = _lines(PH_U)
    cols = lines[0].split("|")
    return next(i for i, ln in enumerate(lines) if i and ln.split("|")[0] == "2"
                and ln.split("|")[cols.index("HHT")] != "0")


def _parquet(change: Callable[[pd.DataFrame], pd.DataFrame]) -> bytes:
    buf = io.BytesIO()
    change(pd.read_parquet(BASE / GS_U)).to_parquet(buf, index=False)
    return buf.getvalue()


def _household_row(units: pd.DataFrame, index: int) -> int:
    """1-based row (header = 1) of parquet row ``index`` in the households table the plugin builds."""
    occupied = ((units.HHGQ == 0) & (units.SIZE >= 1)).to_numpy()
    return int(occupied[:index].sum()) + 2


def _bad_county(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df.loc[3, "TABBLKCOU"] = 999
    return df


def cases() -> dict[str, dict[str, object]]:
    """name -> {product, key, data (bytes), file, row, column, what}."""
    units = pd.read_parquet(BASE / GS_U)
    geo_mafid = _field(PH_G, 4, "MAFID")
    occ = _occupied_line()
    persons = (BASE / PH_P).read_bytes()
    out: dict[str, dict[str, object]] = {
        # PHSafe: wrong types, domains, MAFIDs, geography, FIPS, malformed files
        "phsafe_wrong_type": dict(key=PH_P, data=_set(PH_P, 5, "QAGE", "4x"), row=6, column="QAGE"),
        "phsafe_out_of_domain_cenrace": dict(key=PH_P, data=_set(PH_P, 7, "CENRACE", "64"), row=8,
                                             column="CENRACE"),
        "phsafe_duplicate_mafid": dict(key=PH_U, data=_set(PH_U, 10, "MAFID", _field(PH_U, 9, "MAFID")), row=11,
                                       column="MAFID"),
        "phsafe_orphan_person_mafid": dict(key=PH_P, data=_set(PH_P, 3, "MAFID", "899999999"), row=4,
                                           column="MAFID"),
        "phsafe_geo_mismatch": dict(key=PH_G, data=_set(PH_G, 4, "MAFID", "899999998"),
                                    file_key=PH_U, row=_row_where(PH_U, "MAFID", geo_mafid), column="MAFID"),
        "phsafe_bad_fips": dict(key=PH_G, data=_set(PH_G, 2, "TABBLKST", "03"), row=3, column="TABBLKST"),
        "phsafe_occupied_unit_without_race": dict(key=PH_U, data=_set(PH_U, occ, "HHRACE", "00"), row=occ + 1,
                                                  column="HHRACE"),
        "phsafe_truncated_line": dict(key=PH_P, data=_text([*_lines(PH_P)[:8], "|".join(
            _lines(PH_P)[8].split("|")[:-1]), *_lines(PH_P)[9:]]), row=9, column="RELSHIP"),
        "phsafe_wrong_delimiter": dict(key=PH_P, data=persons.replace(b"|", b";"), row=1, column="RTYPE"),
        "phsafe_latin1_byte": dict(key=PH_U, data=_set(PH_U, 6, "CPLT", "\x00").replace(b"\x00", b"\xe9"), row=7,
                                   column="CPLT"),
        "phsafe_empty_file": dict(key=PH_P, data=b"", row=1, column=None),
        "phsafe_bom": dict(key=PH_P, data=b"\xef\xbb\xbf" + persons, row=1, column=None),
        # SafeTab-P
        "safetab_bad_sex": dict(key=ST_P, data=_set(ST_P, 4, "QSEX", "3"), row=5, column="QSEX"),
        "safetab_age_out_of_domain": dict(key=ST_P, data=_set(ST_P, 2, "QAGE", "116"), row=3, column="QAGE"),
        "safetab_unknown_race_code": dict(key=ST_P, data=_set(ST_P, 6, "QRACE1", "0001"), row=7, column="QRACE1"),
        "safetab_block_not_in_grfc": dict(key=ST_P, data=_set(ST_P, 9, "TABBLK", "9999"), row=10, column="TABBLK"),
        "safetab_truncated_line": dict(key=ST_P, data=_text([*_lines(ST_P)[:3], "|".join(
            _lines(ST_P)[3].split("|")[:-2]), *_lines(ST_P)[4:]]), row=4, column="QRACE8"),
        "safetab_utf16": dict(key=ST_P, data=(BASE / ST_P).read_text().encode("utf-16"), row=1, column=None),
        "safetab_grfc_bad_fips": dict(key=ST_G, data=_set(ST_G, 2, "TABBLKST", "1A"), row=3, column="TABBLKST"),
        "safetab_grfc_empty": dict(key=ST_G, data=b"", row=1, column=None),
        "safetab_iteration_unknown_code": dict(key=ST_MAP, data=_set(ST_MAP, 5, "ITERATION_CODE", "999999"),
                                               row=6, column="ITERATION_CODE"),
        # group sizes
        # the group-size plugin concatenates every part file: its messages name the folder and the row of
        # the concatenated households table (part files in key order)
        "groupsize_county_not_in_geography": dict(key=GS_U, data=_parquet(_bad_county), file_key=GS_DIR,
                                                  row=_household_row(units, 3), column="COUNTY"),
        "groupsize_missing_column": dict(key=GS_U, data=_parquet(lambda d: d.drop(columns=["SIZE"])), row=None,
                                         column="SIZE"),
        "groupsize_corrupt_parquet": dict(key=GS_U, data=(BASE / GS_U).read_bytes()[:-40], row=None, column=None),
        "groupsize_invariant_mismatch": dict(key=GS_INV, data=json.dumps({"occupied_units": int(
            ((units.HHGQ == 0) & (units.SIZE >= 1)).sum()) + 1}).encode(), file_key=GS_DIR, row=None, column=None),
    }
    for name, case in out.items():
        case["product"] = name.split("_")[0].replace("safetab", "safetab-p")
        case.setdefault("file_key", case["key"])
    return out


def _demo(name: str) -> dict[str, Any]:
    from tests.validation.helpers import _config_text

    raw: dict[str, Any] = json.loads(_config_text(name))
    return raw


def config_cases() -> dict[str, dict[str, Any]]:
    """Bad product configs: name -> {product, text, column} (the key the rejection must name)."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, product: str, file: str, change: Callable[[dict[str, Any]], Any], column: str | None,
            raw_text: str | None = None) -> None:
        cfg = _demo(file)
        change(cfg)
        out[name] = {"product": product, "text": raw_text or json.dumps(cfg, indent=1), "column": column}

    ph, st, gs = "phsafe-us-config.json", "safetab-p-config.json", "groupsize-config.json"
    add("phsafe_unknown_key", "phsafe", ph, lambda c: c.update(epsilon=1), None)
    add("phsafe_missing_key", "phsafe", ph, lambda c: c.pop("tau"), None)
    add("phsafe_negative_budget", "phsafe", ph, lambda c: c["privacy_budget"]["PH2"].update({"usa_*": -0.1}),
        "privacy_budget.PH2.usa_*")
    add("phsafe_string_budget", "phsafe", ph, lambda c: c["privacy_budget"]["PH2"].update({"usa_*": "lots"}),
        "privacy_budget.PH2.usa_*")
    add("phsafe_pr_mixed_with_states", "phsafe", ph, lambda c: c["state_filter"].append("72"), "state_filter")
    add("phsafe_bad_fips_in_filter", "phsafe", ph, lambda c: c["state_filter"].append("03"), "state_filter")
    add("phsafe_tau_not_integer", "phsafe", ph, lambda c: c["tau"].update(PH2=2.5), "tau.PH2")
    add("safetab_unknown_key", "safetab-p", st, lambda c: c.update(privacy_budget_p_level_1_stat=1),
        "privacy_budget_p_level_1_stat")
    add("safetab_negative_budget", "safetab-p", st, lambda c: c.update(privacy_budget_p_level_1_state=-1),
        "privacy_budget_p_level_1_state")
    add("safetab_threshold_not_increasing", "safetab-p", st,
        lambda c: c["thresholds_p"].update({k: [5, 3, 9] for k in list(c["thresholds_p"])[:1]}), "thresholds_p")
    add("safetab_pr_in_us_state_filter", "safetab-p", st, lambda c: c.update(state_filter_us=["10", "72"]),
        "state_filter_us")
    add("safetab_missing_max_race_codes", "safetab-p", st, lambda c: c.pop("max_race_codes"), "max_race_codes")
    add("groupsize_missing_budget", "groupsize", gs, lambda c: c.pop("budget"), "budget")
    add("groupsize_unknown_key", "groupsize", gs, lambda c: c.update(epsilon="1"), "epsilon")
    add("groupsize_negative_budget", "groupsize", gs, lambda c: c.update(budget="-0.5"), None)
    # JSON-level: NaN and Infinity where no budget may be infinite
    text = re.sub(r'"usa_\*": [0-9.eE-]+', '"usa_*": NaN', json.dumps(_demo(ph), indent=1), count=1)
    out["phsafe_nan_budget"] = {"product": "phsafe", "text": text, "column": None}
    text = re.sub(r'"zero_suppression_chance": [0-9.]+', '"zero_suppression_chance": Infinity',
                  json.dumps(_demo(st), indent=1))
    out["safetab_infinity_outside_budget"] = {"product": "safetab-p", "text": text,
                                              "column": "zero_suppression_chance"}
    text = json.dumps(_demo(gs)).replace('"0.5"', "Infinity")
    out["groupsize_infinite_budget"] = {"product": "groupsize", "text": text, "column": "budget"}
    return out


def main() -> None:
    make_base()
    if CASES.exists():
        shutil.rmtree(CASES)
    index = {}
    for name, case in sorted(cases().items()):
        target = CASES / name / str(case["key"])
        target.parent.mkdir(parents=True, exist_ok=True)
        data = case.pop("data")
        assert isinstance(data, bytes)
        target.write_bytes(data)
        index[name] = case
    (HERE / "cases.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    configs = HERE / "configs"
    if configs.exists():
        shutil.rmtree(configs)
    configs.mkdir()
    expect = {}
    for name, case in sorted(config_cases().items()):
        (configs / f"{name}.json").write_text(str(case.pop("text")))
        expect[name] = case
    (HERE / "configs.json").write_text(json.dumps(expect, indent=1, sort_keys=True) + "\n")
    print(f"{len(index)} cases")


if __name__ == "__main__":
    main()
