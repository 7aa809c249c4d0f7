"""Output validation, the release manifest (written last) and publication (issue 12 item 4)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dasflow.errors import IntegrityError
from dasflow.release.publish import (
    MANIFEST,
    PUBLICATION,
    OutputInvalid,
    PublicationRefused,
    publish,
    row_count,
    validate_release,
    write_release_manifest,
)
from tests.release.helpers import released_context


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_manifest_lists_sha256_and_rows_of_every_file(tmp_path: Path) -> None:
    ctx = released_context(tmp_path)
    ctx.post_store().put(f"{ctx.root}/release/counts/extra.html", b"<p>report</p>\n")
    manifest = write_release_manifest(ctx)
    files = manifest["files"]
    assert f"{ctx.root}/release/counts/extra.html" in files
    assert f"{ctx.root}/release/{MANIFEST}" not in files
    for key, info in files.items():
        data = ctx.store.get(key)
        assert info["sha256"] == hashlib.sha256(data).hexdigest()
        assert info["rows"] == row_count(key, data)
    assert files[f"{ctx.root}/release/counts/state.csv"]["rows"] == 4  # 4 states, header excluded
    assert manifest["test_release"] is True and manifest["config_sha256"] == ctx.config_sha256
    assert json.loads(ctx.store.get(f"{ctx.root}/release/{MANIFEST}")) == manifest


def test_row_count_conventions() -> None:
    assert row_count("a.csv", b"H\n1\n2\n") == 2
    assert row_count("a.csv", b"H\n1\n2") == 2
    assert row_count("a.md", b"x\ny\n") == 2


def test_validation_rejects_broken_outputs_before_any_manifest(tmp_path: Path) -> None:
    ctx = released_context(tmp_path)
    key = f"{ctx.root}/release/counts/state.csv"
    good = ctx.store.get(key)
    before = ctx.store.get(f"{ctx.root}/release/{MANIFEST}")
    ctx.store.put(key, b"STATE|COUNT\n01|1.5\n")
    with pytest.raises(OutputInvalid, match="row 2, column COUNT"):
        write_release_manifest(ctx)
    assert ctx.store.get(f"{ctx.root}/release/{MANIFEST}") == before  # not rewritten
    ctx.store.put(key, b"")
    with pytest.raises(OutputInvalid, match="empty"):
        validate_release(ctx)
    ctx.store.put(key, good)
    for k in ctx.store.list(f"{ctx.root}/release/counts/"):
        ctx.store.delete(k)
    with pytest.raises(OutputInvalid, match="no release files"):
        validate_release(ctx)


def test_publish_copies_to_a_separate_store_and_republish_is_byte_identical(tmp_path: Path) -> None:
    ctx = released_context(tmp_path, seed=None)
    write_release_manifest(ctx)
    target = tmp_path / "public-site"
    record = publish(ctx, str(target))
    assert record["kind"] == "production" and record["location"] == "releases/r1/"
    first = _tree(target)
    assert set(first) >= {"releases/r1/counts/state.csv", "releases/r1/CERTIFICATE.md",
                          f"releases/r1/{MANIFEST}", f"releases/r1/{PUBLICATION}"}
    assert not any("confidential" in k for k in first)
    assert first["releases/r1/counts/state.csv"] == ctx.store.get(f"{ctx.root}/release/counts/state.csv")
    assert publish(ctx, target.as_uri()) == record
    assert _tree(target) == first


def test_test_release_is_refused_as_production_and_published_as_marked_test(tmp_path: Path) -> None:
    ctx = released_context(tmp_path)
    write_release_manifest(ctx)
    target = tmp_path / "pub"
    with pytest.raises(PublicationRefused, match="TEST release"):
        publish(ctx, str(target))
    assert not target.exists() or not any(target.rglob("*"))
    record = publish(ctx, str(target), test_publication=True)
    assert record["kind"] == "test" and (target / "test-releases/r1" / PUBLICATION).exists()
    assert not (target / "releases").exists()


def test_production_release_cannot_be_published_as_test(tmp_path: Path) -> None:
    ctx = released_context(tmp_path, seed=None)
    write_release_manifest(ctx)
    with pytest.raises(PublicationRefused, match="production"):
        publish(ctx, str(tmp_path / "pub"), test_publication=True)


def test_publish_refuses_target_inside_or_around_the_release_store(tmp_path: Path) -> None:
    ctx = released_context(tmp_path, seed=None)
    write_release_manifest(ctx)
    store_dir = tmp_path / "store"
    for target in (store_dir, store_dir / "published", tmp_path):
        with pytest.raises(PublicationRefused, match="not separate"):
            publish(ctx, str(target))


def test_publish_refuses_incomplete_tampered_or_conflicting_releases(tmp_path: Path) -> None:
    ctx = released_context(tmp_path, seed=None)
    ctx.store.delete(f"{ctx.root}/release/{MANIFEST}")
    with pytest.raises(PublicationRefused, match="not complete"):
        publish(ctx, str(tmp_path / "pub"))
    write_release_manifest(ctx)
    key = f"{ctx.root}/release/counts/state.csv"
    good = ctx.store.get(key)
    ctx.store.put(key, good + b"99|1\n")
    with pytest.raises(IntegrityError, match=r"does not match MANIFEST\.json"):  # the chain, checked first
        publish(ctx, str(tmp_path / "pub"))
    ctx.store.put(key, good)
    (tmp_path / "pub2/releases/r1/counts").mkdir(parents=True)
    (tmp_path / "pub2/releases/r1/counts/state.csv").write_bytes(b"something else\n")
    with pytest.raises(PublicationRefused, match="never overwritten"):
        publish(ctx, str(tmp_path / "pub2"))


def test_separation_rule_for_s3_and_local_uris() -> None:
    """The publication target must neither contain nor be inside the release store (any scheme)."""
    from types import SimpleNamespace
    from typing import Any

    from dasflow.release.publish import _separate

    def s(uri: str) -> Any:
        return SimpleNamespace(uri=uri)

    assert not _separate(s("s3://census/das"), s("s3://census/public"))  # same bucket as the confidential data
    assert not _separate(s("s3://census/das"), s("s3://census/das-public"))
    assert _separate(s("file:///srv/das"), s("/srv/das-public"))  # prefix boundary is "/"
    assert _separate(s("s3://census"), s("s3://other"))
    assert _separate(s("s3://census/das"), s("file:///srv/pub"))
    assert not _separate(s("s3://census/das"), s("s3://census/das/published"))
    assert not _separate(s("s3://census/das"), s("s3://census"))
    assert not _separate(s("file:///srv/das"), s("/srv/das/pub"))
