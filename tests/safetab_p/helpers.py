"""Fixture builders for the SafeTab-P tests: small hand-built person tables, GRF-C and configs."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from dasflow.privacy import accounting
from dasflow.products.safetab_p.config import SafeTabPConfig, parse_config
from dasflow.products.safetab_p.iterations import IterationIndex, load_iterations, packaged_iterations
from dasflow.products.safetab_p.records import GRFC_COLUMNS, PERSON_COLUMNS, load_geography

TOY = Path(__file__).resolve().parents[1] / "data" / "safetab_p_toy"  # copy of shared/data/safetab-p/toy
TOY_ZCDP = TOY / "input_dir_zcdp"
TOY_PUREDP = TOY / "input_dir_puredp"
PACKAGE_DATA = Path(__file__).resolve().parents[2] / "dasflow" / "products" / "safetab_p" / "data"


def toy_config_dict(name: str = "zcdp") -> dict[str, Any]:
    d = TOY_ZCDP if name == "zcdp" else TOY_PUREDP
    raw = accounting.load_json_exact((d / "config.json").read_text())
    return dict(raw)


def config(raw: dict[str, Any]) -> SafeTabPConfig:
    return parse_config(raw, source="config.json")


def toy_iterations() -> IterationIndex:
    return load_iterations(TOY_ZCDP)


def real_iterations() -> IterationIndex:
    return packaged_iterations()


def person(block: str = "01001000001" "0001", races: Sequence[str] = ("1340",), qspan: str = "9950",
           age: int = 30, sex: int = 1) -> list[str]:
    """One person-records row; block = state(2)+county(3)+tract(6)+block(4)."""
    codes = list(races) + ["Null"] * (8 - len(races))
    return [f"{age:03d}", str(sex), "True", block[:2], block[2:5], block[5:11], block[11:15], "01", *codes,
            qspan]


def persons_table(rows: Sequence[Sequence[str]]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in PERSON_COLUMNS]
    return pa.table({c: pa.array(list(v), pa.string()) for c, v in zip(PERSON_COLUMNS, cols, strict=True)})


def grfc_table(blocks: Sequence[tuple[str, str, str]]) -> pa.Table:
    """(15-char block, PLACEFP, AIANNHCE) triples."""
    rows = [(b[:2], b[2:5], b[5:11], b[11:15], p, a) for b, p, a in blocks]
    cols = list(zip(*rows, strict=True))
    return pa.table({c: pa.array(list(v), pa.string()) for c, v in zip(GRFC_COLUMNS, cols, strict=True)})


DEFAULT_BLOCKS = [("010010000010001", "22800", "0001"), ("010010000020001", "22800", "9999"),
                  ("010020000010001", "99999", "0002"), ("020010000010001", "33300", "0002"),
                  ("720310509012040", "10001", "9999")]


def public(cfg: SafeTabPConfig, index: IterationIndex,
           blocks: Sequence[tuple[str, str, str]] = DEFAULT_BLOCKS,
           universe: str = "US") -> dict[str, Any]:
    geo = load_geography(grfc_table(blocks), universe, cfg.state_filter_us, "GRF-C.txt")  # type: ignore[arg-type]
    return {"config": cfg, "iterations": index, "geography": geo, "universe": universe}


def with_changes(raw: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out.update(changes)
    return out


def write_dir(path: Path, raw: dict[str, Any] | None = None, iteration_dir: Path | None = None) -> Path:
    """A parameters dir with config.json (raw as JSON) and optionally the four iteration files copied in."""
    path.mkdir(parents=True, exist_ok=True)
    if raw is not None:
        path.joinpath("config.json").write_text(json.dumps(raw, default=str))
    if iteration_dir is not None:
        for f in ("race-and-ethnicity-codes.txt", "race-characteristic-iterations.txt",
                  "ethnicity-characteristic-iterations.txt", "race-and-ethnicity-code-to-iteration.txt"):
            path.joinpath(f).write_bytes((iteration_dir / f).read_bytes())
    return path


def write_data_dir(path: Path, persons: Sequence[Sequence[str]],
                   blocks: Sequence[tuple[str, str, str]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    lines = ["|".join(PERSON_COLUMNS)] + ["|".join(r) for r in persons]
    path.joinpath("person-records.txt").write_text("\n".join(lines) + "\n")
    g = ["|".join(GRFC_COLUMNS)] + ["|".join((b[:2], b[2:5], b[5:11], b[11:15], p, a)) for b, p, a in blocks]
    path.joinpath("GRF-C.txt").write_text("\n".join(g) + "\n")
    return path
