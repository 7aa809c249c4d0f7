"""The write-once ledger archive: create-only copies of the plan, every ledger entry, the approval record and the
published audit files; idempotent; other bytes refused; never inside the release store."""

from __future__ import annotations

from pathlib import Path

import pytest

from dasflow.errors import LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.pipeline.run import freeze_config
from dasflow.release.ledger_archive import archive_ledger
from dasflow.release.publish import PublicationRefused
from tests.dag import counts_product  # noqa: F401  (registers the product)
from tests.dag.helpers import local_release
from tests.dag.test_pipeline import run_all


def test_ledger_is_archived_create_only(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    run_all(ctx)
    first = archive_ledger(ctx, str(tmp_path / "archive"))
    archive = LocalStore(tmp_path / "archive")
    keys = archive.list("r1/")
    assert "r1/ledger/plan.json" in keys and "r1/release/ledger.csv" in keys and "r1/release/CERTIFICATE.md" in keys
    assert sum(k.endswith(".committed.json") for k in keys) == 2
    assert first["written_now"] == first["objects"] == len(keys)
    for key in keys:  # byte-identical to the store's
        assert archive.get(key) == store.get("runs/" + key)
    assert archive_ledger(ctx, str(tmp_path / "archive"))["written_now"] == 0  # again: nothing new
    archive.put("r1/ledger/plan.json", b"{}")  # an archive that differs is never overwritten
    with pytest.raises(LedgerRefusal, match="other bytes"):
        archive_ledger(ctx, str(tmp_path / "archive"))
    assert archive.get("r1/ledger/plan.json") == b"{}"
    with pytest.raises(PublicationRefused, match="not separate"):
        archive_ledger(ctx, str(tmp_path / "store" / "ledger-archive"))
