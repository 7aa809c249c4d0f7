"""The read-only commands (status, ledger, budget) in-process, and a whole release on an S3 store (moto)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from dasflow.cli import main
from dasflow.config import parse_release_config
from dasflow.io.store import S3Store
from dasflow.pipeline.run import freeze_config
from tests.dag import counts_product  # noqa: F401  (registers the product)
from tests.dag.helpers import local_release, release_dict, seed_inputs
from tests.dag.test_pipeline import run_all
from tests.servers import make_bucket, moto_server, s3_client

REPO = Path(__file__).resolve().parents[2]


def test_status_and_ledger_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, cfg = local_release(tmp_path)
    run_all(freeze_config(cfg, store))
    assert main(["status", "r1", "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "RELEASED" in out and "planned rho = 3/4" in out and "spent rho = 3/4" in out
    assert main(["ledger", "r1", "--store", str(tmp_path / "store"), "--format", "json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [e["key"] for e in record["entries"]] == ["counts/state", "counts/state_sex"]
    assert main(["ledger", "r1", "--store", str(tmp_path / "store"), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("product,key,")


def test_status_of_unknown_release_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "nope", "--store", str(tmp_path)]) == 2
    assert "no release 'nope'" in capsys.readouterr().err


def test_budget_reproduces_phsafe_totals(capsys: pytest.CaptureFixture[str]) -> None:
    """PHSafe Table 10 budgets: US total ρ = 1.257281 (read from the config alone)."""
    assert main(["budget", str(REPO / "dasflow/demo_data/phsafe-us-config.json"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["format"] == "phsafe"
    assert result["totals"]["US"]["rho"] == "1257281/1000000"


def test_budget_of_safetab_config_splits_stages(capsys: pytest.CaptureFixture[str]) -> None:
    """SafeTab-P 2020 production config: US total ρ = 4.944, each level split γ / (1 − γ) between stages."""
    assert main(["budget", str(REPO / "dasflow/demo_data/safetab-p-config.json"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["totals"]["US"]["rho"] == "618/125"  # 4.944
    stage_budgets = {r["key"]: r["budget"] for r in result["rows"] if r["universe"] == "US"}
    assert all(k.endswith(("stage1", "stage2")) for k in stage_budgets)


def test_budget_of_release_config_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local_release(tmp_path)
    path = tmp_path / "release.json"
    path.write_text(json.dumps(release_dict(str(tmp_path / "store"))))
    assert main(["budget", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["US"]["rho"] == "3/4"
    assert main(["budget", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["budget", str(tmp_path / "junk.json")]) == 2


@pytest.mark.xdist_group("s3servers")
def test_a_release_on_an_s3_store_is_the_same_code_path(tmp_path: Path) -> None:
    with moto_server() as endpoint:
        bucket = f"dasflow-{uuid.uuid4().hex[:10]}"
        make_bucket(endpoint, bucket)
        store = S3Store(f"s3://{bucket}/prod", client=s3_client(endpoint))
        seed_inputs(store)
        cfg = parse_release_config(release_dict(f"s3://{bucket}/prod"))
        ctx = freeze_config(cfg, store)
        run_all(ctx)
        again = run_all(freeze_config(cfg, store))
        assert again["counts"]["drawn_now"] == 0
        keys = store.list("runs/r1/")
        assert "runs/r1/release/MANIFEST.json" in keys
        assert sum(k.endswith(".committed.json") for k in keys) == 2
        # the same release on local disk gives byte-identical tables (the store is not part of the release)
        local_store, local_cfg = local_release(tmp_path)
        run_all(freeze_config(local_cfg, local_store))
        for name in ("counts/state.csv", "counts/state_sex.csv"):
            assert store.get(f"runs/r1/release/{name}") == local_store.get(f"runs/r1/release/{name}")
