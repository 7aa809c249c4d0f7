"""The write-once ledger archive: after a release, its privacy ledger is copied create-only into a separate store
(in production the object-locked ``LedgerBucket`` of ``infra/aws/dasflow.yaml``, whose policy refuses any PUT
without ``If-None-Match: *``).

Archived under ``{release_id}/``: every object of ``runs/{id}/ledger/`` (the frozen plan and every reserved /
committed entry), the approval record, and the release's ``ledger.csv``, ``CERTIFICATE.md`` and ``MANIFEST.json``.
Nothing confidential: budgets, states, hashes of noisy measurement files and the published audit files. Archiving
again is a no-op; an archived object with other bytes is refused (``LedgerRefusal``), never overwritten.
"""

from __future__ import annotations

from typing import Any

from dasflow.errors import LedgerRefusal
from dasflow.io.store import open_store, sha256_bytes
from dasflow.pipeline.run import RunContext
from dasflow.release.publish import PublicationRefused, _separate

ARCHIVED_FILES = ("approval.json", "release/ledger.csv", "release/CERTIFICATE.md", "release/MANIFEST.json")


def archive_ledger(ctx: RunContext, target_uri: str) -> dict[str, Any]:
    """Copy the release's ledger create-only to ``target_uri`` (a store separate from the release's)."""
    target = open_store(target_uri)
    if not _separate(ctx.store, target):
        raise PublicationRefused(f"ledger archive {target.uri} is not separate from the release store {ctx.store.uri}")
    source = ctx.post_store()
    keys = source.list(f"{ctx.root}/ledger/") + [f"{ctx.root}/{rel}" for rel in ARCHIVED_FILES
                                                 if source.exists(f"{ctx.root}/{rel}")]
    written = 0
    for key in keys:
        data = source.get(key)
        dest = f"{ctx.release_id}/{key[len(ctx.root) + 1:]}"
        if target.put_if_absent(dest, data):
            written += 1
        elif target.sha256(dest) != sha256_bytes(data):
            raise LedgerRefusal(f"{target.uri}/{dest}: the archive holds other bytes (never overwritten); "
                                "investigate before going on")
    return {"archive": target.uri, "objects": len(keys), "written_now": written}
