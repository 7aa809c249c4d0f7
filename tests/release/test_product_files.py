"""A product's release files are written as soon as its post-processing is done (``product_release_files``, the
``release-files`` task of its lane), recorded in the ``tables`` stage manifest; the release stage then writes
only the ledger audit, certificate, accuracy report and manifest, and rewrites a product's files only where they
no longer match their record (an edited file, new estimates). Same bytes either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.metrics import stage_metrics
from dasflow.pipeline.run import RunContext, manifest_key
from dasflow.release import stage as release
from dasflow.release.stage import TABLES, product_release_files, release_stage
from tests.dag.helpers import release_files
from tests.release.helpers import postprocessed_context


def _postprocessed(tmp: Path) -> RunContext:
    return postprocessed_context(tmp, seed=5)


def _tables_written(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = release.write_product_tables

    def counting(ctx: RunContext, product: str, *args: object) -> dict[str, dict[str, object]]:
        calls.append(product)
        return real(ctx, product, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(release, "write_product_tables", counting)
    return calls


def test_files_written_early_are_the_release_stages_and_are_not_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _postprocessed(tmp_path / "whole")
    release_stage(whole)  # the release stage writing every product's files itself
    early = _postprocessed(tmp_path / "early")
    calls = _tables_written(monkeypatch)
    records = {p.name: product_release_files(early, p.name) for p in early.config.products}
    assert calls == [p.name for p in early.config.products]
    for product, record in records.items():
        assert record["stage"] == TABLES and record["outputs"]
        assert all(key.startswith(f"runs/r1/release/{product}/") for key in record["outputs"])
        assert record["metrics"]["wall_seconds"] >= 0
    assert not early.store.exists("runs/r1/release/MANIFEST.json")  # nothing looks complete yet
    assert product_release_files(early, "counts") == records["counts"]  # current: returned, nothing written
    release_stage(early)
    assert calls == [p.name for p in early.config.products]  # the release stage wrote no product file again
    assert release_files(tmp_path / "early/store", "r1") == release_files(tmp_path / "whole/store", "r1")
    assert {(r["stage"], r["product"]) for r in stage_metrics(early)} >= {(TABLES, "counts"), ("release", "all")}


def test_an_edited_release_file_is_rewritten_from_the_estimates(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _postprocessed(tmp_path)
    record = product_release_files(ctx, "counts")
    key = sorted(record["outputs"])[0]
    original = ctx.store.get(key)
    assert isinstance(ctx.store, LocalStore)
    ctx.store.put(key, original.replace(b"1", b"7", 1) + b"\n")  # an attacker's edit after the files were written
    calls = _tables_written(monkeypatch)
    release_stage(ctx)
    assert calls == ["counts"]  # the record no longer matched: written again, from the stored estimates
    assert ctx.store.get(key) == original
    manifest = json.loads(ctx.store.get("runs/r1/release/MANIFEST.json"))
    assert manifest["files"][key]["sha256"] == record["outputs"][key]["sha256"]


def test_release_files_need_current_estimates(tmp_path: Path) -> None:
    ctx = _postprocessed(tmp_path)
    ctx.store.delete(manifest_key(ctx, "postprocess", "counts"))
    with pytest.raises(InputError, match="no current post-processed estimates"):
        product_release_files(ctx, "counts")
    assert not ctx.store.exists(manifest_key(ctx, TABLES, "counts"))


def test_a_commit_edited_after_post_processing_stops_the_files_before_any_is_written(tmp_path: Path) -> None:
    """The lane checks the ledger's frozen chain before it writes under ``release/``, as the release stage does:
    a commit that no longer matches its plan entry (its hash, which the estimates' record holds, unchanged)."""
    ctx = _postprocessed(tmp_path)
    spec = stages.product_specs(ctx, "counts")[0]
    ckey = f"{ctx.ledger.root}/entries/{spec.key}.committed.json"
    commit = json.loads(ctx.store.get(ckey))
    commit["budget"] = "1/1000000"
    ctx.store.put(ckey, (json.dumps(commit, sort_keys=True, indent=1) + "\n").encode())
    with pytest.raises(IntegrityError, match="does not match its frozen plan entry"):
        product_release_files(ctx, "counts")
    assert ctx.store.list("runs/r1/release/") == []
    assert not ctx.store.exists(manifest_key(ctx, TABLES, "counts"))


def test_a_finished_release_is_not_finished_again_until_a_file_no_longer_matches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resuming a release that had finished writes nothing (no certificate, no accuracy report: a test release's
    report recomputes every ground truth); an edited, removed or added file under ``release/`` finishes it again,
    to the same bytes (an added file is then validated and listed, as any file there)."""
    ctx = _postprocessed(tmp_path)
    first = release_stage(ctx)
    files = release_files(tmp_path / "store", "r1")
    finished: list[str] = []
    real = release.finalize_release

    def finalize(ctx: RunContext, **kw: object) -> dict[str, object]:
        finished.append(ctx.release_id)
        return real(ctx, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(release, "finalize_release", finalize)
    stage_record = ctx.store.get(manifest_key(ctx, "release", "all"))
    assert release_stage(ctx) == first and finished == []
    assert ctx.store.get(manifest_key(ctx, "release", "all")) == stage_record  # its metrics are the first run's
    certificate = "runs/r1/release/CERTIFICATE.md"
    for damage in (lambda: ctx.store.put(certificate, b"**PRODUCTION RELEASE**\n"),
                   lambda: ctx.store.delete("runs/r1/release/ledger.csv"),
                   lambda: ctx.store.delete("runs/r1/release/MANIFEST.json")):
        damage()
        assert release_stage(ctx) == first and len(finished) == 1
        assert release_files(tmp_path / "store", "r1") == files
        finished.clear()
    ctx.store.put("runs/r1/release/extra.txt", b"not the release's\n")
    assert set(release_stage(ctx)["files"]) == set(first["files"]) | {"runs/r1/release/extra.txt"}
    assert finished == ["r1"]
