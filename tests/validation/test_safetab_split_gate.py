"""The validation gate on a split SafeTab-P person input (``person-records/*.txt``, e.g. one file per state):
every file checked (own checks, cross-file facts, GX suite), errors name the file and its own row, and a split
release gives the same tables as the single file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dasflow.config import parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import candidate_context, freeze_config
from tests.dag.helpers import release_files
from tests.dag.test_pipeline import run_all
from tests.dag.test_products_in_dag import safetab_release, us_persons
from tests.synthetic import mark_inputs


def split_store(tmp: Path, lines_b: list[str] | None = None) -> tuple[LocalStore, dict]:  # type: ignore[type-arg]
    store, raw = safetab_release(tmp, "zcdp")
    header, *rows = us_persons().decode().splitlines()
    store.delete("confidential/safetab-p/person-records.txt")
    half = len(rows) // 2
    b = lines_b if lines_b is not None else rows[half:]
    store.put("confidential/safetab-p/person-records/a.txt", "\n".join([header, *rows[:half]]).encode() + b"\n")
    store.put("confidential/safetab-p/person-records/b.txt", "\n".join([header, *b]).encode() + b"\n")
    mark_inputs(store, raw, "the SafeTab-P toy inputs, split")
    return store, raw


def test_split_person_input_releases_the_same_tables(tmp_path: Path) -> None:
    store, raw = safetab_release(tmp_path / "one", "zcdp")
    run_all(freeze_config(parse_release_config(raw), store))
    split, raw_split = split_store(tmp_path / "split")
    ctx = freeze_config(parse_release_config(raw_split), split)
    run_all(ctx)
    report = ctx.store.get_text(f"{ctx.root}/validation/safetab-p.json")
    assert "person-records/a.txt" in report and "person-records/b.txt" in report
    one = {k: v for k, v in release_files(tmp_path / "one/store", raw["release_id"]).items() if "/" in k}
    two = {k: v for k, v in release_files(tmp_path / "split/store", raw["release_id"]).items() if "/" in k}
    assert one and one == two  # t1 and t2, byte for byte


@pytest.mark.parametrize(("column", "value"), [("QRACE2", "9999"), ("QAGE", "130"), ("TABBLK", "9999")])
def test_bad_row_in_a_split_file_is_named_before_any_noise(tmp_path: Path, column: str, value: str) -> None:
    header, *rows = us_persons().decode().splitlines()
    cols = header.split("|")
    bad = rows[len(rows) // 2:]
    fields = bad[0].split("|")  # a state-02 person (bad[1] is a PR person: outside the US run)
    fields[cols.index(column)] = value
    bad[0] = "|".join(fields)
    store, raw = split_store(tmp_path, bad)
    ctx = candidate_context(parse_release_config(raw), store)
    with pytest.raises(InputError) as caught:
        stages.validate_stage(ctx, "safetab-p")
    exc = caught.value
    assert (exc.file, exc.row) == ("person-records/b.txt", 2), str(exc)
    assert exc.column in (column, "TABBLK"), str(exc)
    assert store.list(f"runs/{ctx.release_id}/ledger/") == []  # validation precedes freezing: nothing planned
    assert not store.exists(f"runs/{ctx.release_id}/config.json")  # ... and the release id stays reusable
