"""The release stage end to end on a real PHSafe release (two synthetic states through the DAG stages):
estimates files, certificate, accuracy report with PHSafe's ground truth, validated manifest written last,
byte-identical re-run and publication (issue 12 items 1-4)."""

from __future__ import annotations

import io
import json
import os
from fractions import Fraction
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from dasflow import synth
from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, freeze_config
from dasflow.privacy import account
from dasflow.release.accuracy import estimate_checks, truth_frames
from dasflow.release.publish import MANIFEST, OutputInvalid, publish, write_release_manifest
from dasflow.release.stage import finalize_release, release_stage


def phsafe_release(tmp: Path, seed: int | None = 4) -> RunContext:
    store = LocalStore(tmp / "store")
    root = store.local_path("confidential/synth")
    synth.generate(root, persons=1000, seed=3, states=["01", "02"], formats=("phsafe",))
    (tmp / "store/public/phsafe").mkdir(parents=True)
    os.replace(root / "phsafe/geo.csv", tmp / "store/public/phsafe/geo.csv")
    cfg = json.loads(resources.files("dasflow.demo_data").joinpath("phsafe-us-config.json").read_text())
    cfg["state_filter"] = ["01", "02"]
    raw = {"release_id": "ph", "universe": "US", "store": str(tmp / "store"),
           "inputs": {"phsafe": "confidential/synth/phsafe/", "phsafe_geo": "public/phsafe/"},
           "products": [{"name": "phsafe", "config_text": json.dumps(cfg)}], "cap": {"rho": "2"},
           "rng": {"mode": "test", "seed": seed} if seed is not None else {"mode": "production"}}
    if seed is None:
        raw["account"] = "cef"
        account.open_account(store, "cef", "US", cap_rho=Fraction(10))
    ctx = freeze_config(parse_release_config(raw), store)
    stages.validate_stage(ctx, "phsafe")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "phsafe")
    stages.measure_stage(ctx, "phsafe")
    stages.postprocess_stage(ctx, "phsafe")
    release_stage(ctx)
    return ctx


def _files(store_dir: Path) -> dict[str, bytes]:
    root = store_dir / "runs/ph/release"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_finalize_a_phsafe_test_release_and_publish_it(tmp_path: Path) -> None:
    ctx = phsafe_release(tmp_path)
    manifest = finalize_release(ctx)
    files = _files(tmp_path / "store")
    for name in ("PH1", "PH5", "PH8", "PH2", "PH1_num", "PH8_denom"):
        assert f"phsafe/estimates/{name}.csv" in files
    assert {"CERTIFICATE.md", "CERTIFICATE.html", "ACCURACY.html", MANIFEST} <= set(files)
    assert set(manifest["files"]) == {f"runs/ph/release/{k}" for k in files if k != MANIFEST}
    # estimates: 3 geographies (USA + 2 states) x 10 iterations x 3 average cells; bounds respected
    ph1 = pd.read_csv(io.BytesIO(files["phsafe/estimates/PH1.csv"]), sep="|", dtype={"REGION_ID": str})
    assert len(ph1) == 3 * 10 * 3
    assert ph1["ESTIMATE"].between(0, 10).all() and (ph1["LOWER_90"] <= ph1["UPPER_90"]).all()
    totals = ph1[ph1["PH1_DATA_CELL"] == 1]
    assert (totals["LOWER_90"] >= 1).all()
    ph5 = pd.read_csv(io.BytesIO(files["phsafe/estimates/PH5.csv"]), sep="|")
    assert (ph5[ph5["PH5_DATA_CELL"] == 1]["LOWER_90"] >= 2).all()
    # certificate and accuracy report of a test release
    assert files["CERTIFICATE.md"].startswith(b"**TEST RELEASE")
    report = files["ACCURACY.html"].decode()
    assert "<title>TEST RELEASE" in report and "Observed error against the ground truth" in report
    assert "PH3.csv" in report
    assert "PHSafe statistical post-processing against the ground truth" in report
    checks = estimate_checks(ctx, "phsafe", truth_frames(ctx)["phsafe"])
    assert set(checks["file"]) >= {"PH2.csv", "PH3.csv", "PH1_num.csv"}
    zeros = checks[checks["true count"] == "0"]
    assert (zeros["interval_coverage"] == 0).all()  # the lower end of a flat-prior interval is > 0
    assert (checks["cells"] > 0).all() and checks["rmse_estimate"].notna().all()
    # deterministic: a second finalize writes the same bytes
    finalize_release(ctx)
    assert _files(tmp_path / "store") == files
    # publication: refused as production, published as a marked test publication
    with pytest.raises(Exception, match="TEST release"):
        publish(ctx, str(tmp_path / "site"))
    record = publish(ctx, str(tmp_path / "site"), test_publication=True)
    assert (tmp_path / "site/test-releases/ph/phsafe/estimates/PH1.csv").read_bytes() == \
        files["phsafe/estimates/PH1.csv"]
    assert record["files"] == len(manifest["files"]) + 1


@pytest.mark.slow
def test_phsafe_output_validation_catches_a_wrong_variance(tmp_path: Path) -> None:
    """PHSafe's production output check (VARIANCE equals the formula for the configured ρ/τ) runs before the
    manifest is written."""
    ctx = phsafe_release(tmp_path, seed=None)
    key = "runs/ph/release/phsafe/PH2.csv"
    lines = ctx.store.get(key).decode().splitlines(keepends=True)
    head, first = lines[0], lines[1].split("|")
    first[-2] = "1.0"
    ctx.store.put(key, (head + "|".join(first) + "".join(lines[2:])).encode())
    before = ctx.store.get(f"runs/ph/release/{MANIFEST}")
    with pytest.raises(OutputInvalid, match=r"^phsafe release files: phsafe/PH2\.csv: row 2, column VARIANCE"):
        write_release_manifest(ctx)
    assert ctx.store.get(f"runs/ph/release/{MANIFEST}") == before
    # a release whose manifest was never written: a tampered PH1_num.csv row stops it, naming the file
    ctx.store.put(key, "".join(lines).encode())
    ctx.store.delete(f"runs/ph/release/{MANIFEST}")
    key = "runs/ph/release/phsafe/PH1_num.csv"
    head, *rows = ctx.store.get(key).decode().splitlines(keepends=True)
    cells = rows[0].split("|")
    cells[-3] = "Discrete Laplace"  # NOISE_DISTRIBUTION (the generic table checks cannot see it)
    ctx.store.put(key, (head + "|".join(cells) + "".join(rows[1:])).encode())
    with pytest.raises(OutputInvalid,
                       match=r"^phsafe release files: phsafe/PH1_num\.csv: row 2, column NOISE_DISTRIBUTION"):
        write_release_manifest(ctx)
    assert not ctx.store.exists(f"runs/ph/release/{MANIFEST}")
