"""Issue 11 item 5: every bad input of the corpus is rejected by the release DAG with the validation gate
installed — exit code 2, the message naming file, row and column, and the release left with no ledger entry,
no measurement and no prepared data. The valid base releases end to end and its outputs pass the output suites.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dasflow.errors import InputError
from tests.validation.helpers import CASES, corpus_store, release_raw, run_release


def _assert_nothing_spent(root: Path, release_id: str) -> None:
    run = root / "runs" / release_id
    for sub in ("ledger/entries", "measurements", "prepared", "release"):
        d = run / sub
        assert not d.exists() or not any(p.is_file() for p in d.rglob("*")), f"{sub} written after rejection"


@pytest.mark.parametrize("case", sorted(CASES))
def test_corpus_case_is_rejected_with_file_row_column_exit_2(tmp_path: Path, case: str) -> None:
    spec = CASES[case]
    store = corpus_store(tmp_path / "store", case)
    errors: list[BaseException] = []
    code = run_release(store, release_raw(store, [spec["product"]]), errors=errors)
    assert code == 2, f"{case}: exit {code}, {errors}"
    exc = errors[0]
    assert isinstance(exc, InputError)
    assert exc.file is not None and Path(exc.file).name == Path(spec["file_key"]).name, str(exc)
    assert exc.row == spec["row"], str(exc)
    assert exc.column == spec["column"], str(exc)
    assert f"file {exc.file}" in str(exc)
    if spec["row"] is not None:
        assert f"row {spec['row']}" in str(exc)
    if spec["column"] is not None:
        assert f"column {spec['column']}" in str(exc)
    _assert_nothing_spent(tmp_path / "store", "v1")


@pytest.mark.slow
def test_valid_base_releases_and_outputs_pass_the_output_suites(tmp_path: Path) -> None:
    """Control: the same gate accepts the valid base (no false rejection), the release completes, the stored
    validation summary carries the GX counts, and the released tables pass ``validate_outputs``."""
    import json

    from dasflow.pipeline.run import open_run
    from dasflow.registry import get_plugin
    from dasflow.validation import validate_outputs, validate_product_config

    store = corpus_store(tmp_path / "store")
    raw = release_raw(store, ["phsafe", "safetab-p", "groupsize"])
    errors: list[BaseException] = []
    assert run_release(store, raw, full=True, errors=errors) == 0, errors
    for product in ("phsafe", "safetab-p", "groupsize"):
        summary = json.loads((tmp_path / "store/runs/v1/validation" / f"{product}.json").read_text())
        assert summary["passed"] is True and summary["gx"]["failed"] == 0 and summary["gx"]["evaluated"] > 5
    ctx = open_run("v1", str(tmp_path / "store"))
    configs = {"phsafe": validate_product_config(get_plugin("phsafe"), raw["products"][0]["config_text"], "US")}
    result = validate_outputs(tmp_path / "store/runs/v1/release", ctx.ledger.plan_record(), configs)
    assert result.success, result.error
    assert any(k.startswith("phsafe/") for k in result.summary["files"])
    assert any(k.startswith("safetab-p/") for k in result.summary["files"])
    assert any(k.startswith("groupsize/") for k in result.summary["files"])
