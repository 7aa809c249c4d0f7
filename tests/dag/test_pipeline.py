"""The release pipeline as plain functions: stages, manifests, measure-once, refusals (no Prefect here)."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import InputError, LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.inputs import mark_synthetic
from dasflow.pipeline.run import freeze_config, open_run
from dasflow.privacy.ledger import decode_nmf, encode_nmf
from dasflow.privacy.measurement import NoisyMeasurement
from dasflow.release.stage import release_stage
from tests.dag import counts_product
from tests.dag.helpers import local_release, release_config, release_files


def run_all(ctx) -> dict:  # type: ignore[no-untyped-def]
    for p in ctx.config.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    out = {}
    for p in ctx.config.products:
        stages.preprocess_stage(ctx, p.name)
        out[p.name] = stages.measure_stage(ctx, p.name)
        stages.postprocess_stage(ctx, p.name)
    release_stage(ctx)
    return out


def test_full_release_writes_tables_certificate_ledger_and_manifest(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    summary = run_all(ctx)
    assert summary["counts"] == {"product": "counts", "keys": 2, "drawn_now": 2, "rng_mode": "test"}
    files = release_files(tmp_path / "store", "r1")
    assert set(files) == {"counts/state.csv", "counts/state_sex.csv", "CERTIFICATE.md", "CERTIFICATE.html",
                          "ACCURACY.html", "ledger.csv", "MANIFEST.json"}
    cert = files["CERTIFICATE.md"].decode()
    assert cert.startswith("**TEST RELEASE")
    assert "total ρ (zCDP) = 3/4" in cert and "spent (committed ledger entries): ρ = 3/4" in cert
    manifest = json.loads(files["MANIFEST.json"])
    assert manifest["test_release"] is True
    for key, info in manifest["files"].items():
        assert store.sha256(key) == info["sha256"]
    audit = ctx.ledger.audit()
    assert [r["state"] for r in audit] == ["committed", "committed"]
    assert ctx.ledger.spent().rho == Fraction(3, 4)


def test_rerun_is_a_resume_that_draws_nothing(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    run_all(freeze_config(cfg, store))
    first = release_files(tmp_path / "store", "r1")
    again = run_all(freeze_config(cfg, store))
    assert again["counts"]["drawn_now"] == 0
    assert release_files(tmp_path / "store", "r1") == first
    assert len(store.list("runs/r1/ledger/entries/")) == 4  # reserved + committed per key, nothing more


def test_same_seed_same_bytes_different_seed_different_noise(tmp_path: Path) -> None:
    s1, c1 = local_release(tmp_path / "a")
    s2, c2 = local_release(tmp_path / "b")
    s3, c3 = local_release(tmp_path / "c", seed=12)
    for s, c in ((s1, c1), (s2, c2), (s3, c3)):
        run_all(freeze_config(c, s))
    a = release_files(tmp_path / "a" / "store", "r1")
    b = release_files(tmp_path / "b" / "store", "r1")
    c = release_files(tmp_path / "c" / "store", "r1")
    assert a["counts/state_sex.csv"] == b["counts/state_sex.csv"]
    assert a["counts/state_sex.csv"] != c["counts/state_sex.csv"]


def test_over_cap_plan_is_refused_before_any_noise(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path, cap="1/2")
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    with pytest.raises(LedgerRefusal, match="exceeds the release cap"):
        stages.plan_stage(ctx)
    assert store.list("runs/r1/ledger/") == []
    assert store.list("runs/r1/measurements/") == []


def test_infinite_budget_is_refused_under_a_finite_cap(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path, rho=("Infinity", "1/4"))
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    with pytest.raises(LedgerRefusal, match="Infinity"):
        stages.plan_stage(ctx)


def test_changed_config_under_same_release_id_is_refused(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    freeze_config(cfg, store)
    changed = release_config(str(tmp_path / "store"), rho=("1/3", "1/4"))
    with pytest.raises(InputError, match="different config"):
        freeze_config(changed, store)


def test_changed_plan_is_refused_even_if_config_file_is_swapped(tmp_path: Path) -> None:
    """Someone edits the frozen config in place: the frozen plan still wins and the run is refused."""
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    changed = release_config(str(tmp_path / "store"), rho=("1/3", "1/4"))
    store.put("runs/r1/config.json", changed.canonical_json().encode())
    with pytest.raises(LedgerRefusal, match="does not match its frozen SHA-256"):
        open_run("r1", str(tmp_path / "store"))
    # the hash edited too: the frozen plan's binding still names the original config
    store.put("runs/r1/config.sha256", (changed.sha256() + "\n").encode())
    with pytest.raises(LedgerRefusal, match="bound to another config"):
        open_run("r1", str(tmp_path / "store"))


def test_unplanned_measurement_is_refused(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    spec = stages.product_specs(ctx, "counts")[0]
    rogue = type(spec)(**{**spec.__dict__, "key": "counts/rogue"})
    with pytest.raises(LedgerRefusal, match="unplanned"):
        ctx.ledger.measure_once(rogue, lambda: pytest.fail("drew noise"), attempt="t")
    bigger = type(spec)(**{**spec.__dict__, "budget": Fraction(1)})
    with pytest.raises(LedgerRefusal, match="differs from its frozen plan"):
        ctx.ledger.measure_once(bigger, lambda: pytest.fail("drew noise"), attempt="t")


def test_measure_before_plan_is_refused(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    with pytest.raises(LedgerRefusal, match="no frozen plan"):
        stages.measure_stage(ctx, "counts")


def test_bad_input_fails_validation_and_nothing_is_measured(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    data = store.get(counts_product.PERSONS).decode().splitlines()
    data[7] = "06,3"
    store.put(counts_product.PERSONS, ("\n".join(data) + "\n").encode())
    mark_synthetic(store, "confidential/counts/", generator_note="test: a corrupted synthetic file")
    ctx = freeze_config(cfg, store)
    with pytest.raises(InputError, match=r"row 8, column SEX"):
        stages.validate_stage(ctx, "counts")
    with pytest.raises(InputError, match="not passed validation"):
        stages.plan_stage(ctx)
    with pytest.raises(InputError, match="not passed validation"):
        stages.preprocess_stage(ctx, "counts")
    assert store.list("runs/r1/measurements/") == []
    assert store.list("runs/r1/ledger/entries/") == []


def test_reserved_without_nmf_redraws_the_same_noise_under_the_same_entry(tmp_path: Path) -> None:
    """Crash after reserve, before the NMF: nothing was observable, so the key is drawn under the same entry; in
    test mode the per-key stream makes the redraw identical to an uninterrupted run."""
    ref_store, ref_cfg = local_release(tmp_path / "ref")
    run_all(freeze_config(ref_cfg, ref_store))
    store, cfg = local_release(tmp_path / "x")
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "counts")
    store.put_if_absent("runs/r1/ledger/entries/counts/state.reserved.json", b'{"attempt": "crashed"}\n')
    run_all(ctx)
    assert json.loads(store.get("runs/r1/ledger/entries/counts/state.reserved.json")) == {"attempt": "crashed"}
    assert release_files(tmp_path / "x" / "store", "r1") == release_files(tmp_path / "ref" / "store", "r1")


def test_reserved_with_nmf_is_committed_without_drawing(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "counts")
    spec = stages.product_specs(ctx, "counts")[0]
    prepared = stages.load_prepared(ctx, "counts")
    pre = stages.measure_one(ctx.plugin("counts").product(None), prepared, spec,
                             stages.base_rng(ctx).spawn(spec.key), {})
    ctx.bind_inputs("counts")
    store.put_if_absent(ctx.ledger.nmf_key(spec.key), encode_nmf(pre, spec, ctx.ledger.binding_of(spec)))
    measurement, drawn = ctx.ledger.measure_once(spec, lambda: pytest.fail("drew again"), attempt="t")
    assert not drawn
    assert measurement.table["NOISY"].tolist() == pre.table["NOISY"].tolist()
    assert ctx.ledger.committed(spec.key) is not None


def test_tampered_nmf_is_detected(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    run_all(ctx)
    spec = stages.product_specs(ctx, "counts")[0]
    key = ctx.ledger.nmf_key(spec.key)
    other = stages.product_specs(ctx, "counts")[1]
    store.put(key, store.get(ctx.ledger.nmf_key(other.key)))
    with pytest.raises(LedgerRefusal, match="does not match its committed SHA-256"):
        ctx.ledger.measure_once(spec, lambda: pytest.fail("drew"), attempt="t")


def test_postprocess_view_cannot_read_confidential(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    from dasflow.io.store import ForbiddenKey

    with pytest.raises(ForbiddenKey):
        ctx.post_store().get(counts_product.PERSONS)


def test_status_reports_progress(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    st = stages.status(ctx)
    assert st["planned"] is None and not st["released"]
    run_all(ctx)
    st = stages.status(ctx)
    assert st["released"] and all(st["products"]["counts"].values())
    assert st["spent"]["rho"] == "3/4" and st["planned"]["rho"] == "3/4"


def test_local_store_default_directory_is_created(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "deep" / "store")
    assert (tmp_path / "deep" / "store").is_dir()
    assert store.list() == []


def test_rerun_postprocess_uses_stored_measurements_and_leaves_the_ledger_unchanged(tmp_path: Path) -> None:
    from dasflow.release.operator import ledger_snapshot, rerun_postprocess

    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    run_all(ctx)
    before = release_files(tmp_path / "store", "r1")
    snap = ledger_snapshot(ctx)
    result = rerun_postprocess(ctx)
    assert result["ledger_unchanged"] and ledger_snapshot(ctx) == snap
    assert release_files(tmp_path / "store", "r1") == before


def test_rerun_postprocess_refuses_an_unmeasured_release(tmp_path: Path) -> None:
    from dasflow.release.operator import rerun_postprocess

    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    with pytest.raises(LedgerRefusal, match="not measured yet"):
        rerun_postprocess(ctx)
    assert store.list("runs/r1/measurements/") == []


def test_a_fresh_draw_is_committed_from_the_bytes_written_and_equals_their_read_back(tmp_path: Path) -> None:
    """measure_once does not read a fresh NMF back: its commit hash is that of the stored file, and the
    measurement it returns equals the stored file decoded (dtypes included: categorical, small ints, exact
    fractions, strings; the row index is the file's)."""
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    ctx.bind_inputs("counts")
    spec = stages.product_specs(ctx, "counts")[0]
    n = 5
    table = pd.DataFrame({
        "REGION": pd.Categorical.from_codes(np.array([0, 1, 1, 0, 1], np.int32), categories=pd.Index(["a", "b"])),
        "SEX": np.array([1, 2, 1, 2, 1], np.int8), "NAME": ["x", "y", "z", "w", "v"],
        "NOISY": np.arange(n, dtype=np.int64) - 2, "VARIANCE": [Fraction(1, 3)] * n,
        "NOISE_DISTRIBUTION": pd.Categorical.from_codes(np.zeros(n, np.int8), categories=pd.Index(["Gaussian"])),
    }, index=[9, 8, 7, 6, 5])
    measurement, drawn = ctx.ledger.measure_once(
        spec, lambda: NoisyMeasurement(spec=spec, table=table, rng_mode="test"), attempt="t")
    assert drawn
    data = store.get(ctx.ledger.nmf_key(spec.key))
    commit = ctx.ledger.committed(spec.key)
    assert commit is not None and commit.sha256 == hashlib.sha256(data).hexdigest() and commit.rows == n
    pd.testing.assert_frame_equal(measurement.table, decode_nmf(data, spec).table, check_exact=True)
    assert measurement.rng_mode == "test" and measurement.spec == spec
