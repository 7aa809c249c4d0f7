"""Which inputs of a release are confidential, their digests, and the checks every confidential input passes
before a plan may be frozen.

Confidentiality comes from declarations, never from a path prefix: each product's plugin declares its inputs
(``input_declarations``: name, default prefix, confidential or public), and every input the release config names
that no product declares public is treated as confidential (fail closed). The literal ``confidential/`` prefix
stays forbidden to post-processing as well, whatever the config says.

Privacy argument: the digests computed here are functions of the confidential records. They key the stage
manifests, the noisy measurement files and the ledger (all under ``runs/``, the confidential side of the
store) and are never written under ``release/`` (DESIGN.md §2: a SHA-256 of a small file lets anyone who knows
all records but one test candidates for the last).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import LocalStore, ObjectStore, StoreError
from dasflow.products.plugin import InputDeclaration
from dasflow.registry import get_plugin

__all__ = ["CONFIDENTIAL", "InputDeclaration", "InputLayout", "IntegrityError", "check_not_empty",
           "check_synthetic", "input_layout", "inputs_digest", "mark_synthetic", "object_hashes"]

#: forbidden to post-processing and release in every release (the store layout's confidential area)
CONFIDENTIAL = "confidential/"
#: the synthetic census's manifest (``dasflow.synth.generate`` writes it last)
SYNTH_MANIFEST = "manifest.json"
#: how far up from an input prefix a synthetic-census manifest is looked for
_MANIFEST_DEPTH = 4


def _slash(prefix: str) -> str:
    return prefix if prefix.endswith("/") else prefix + "/"


@dataclass(frozen=True)
class InputLayout:
    """The release's inputs split by declaration: name → store prefix."""

    confidential: dict[str, str]
    public: dict[str, str]
    #: confidential input name → the products that declare it (none: named by the config only)
    owners: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def confidential_of(self, product: str) -> dict[str, str]:
        """The confidential inputs a product's stages depend on: those it declares, and (fail closed) every one
        the config names that no product declares. Another product's inputs are never read by this one."""
        return {name: prefix for name, prefix in self.confidential.items()
                if not self.owners.get(name) or product in self.owners[name]}

    @property
    def forbidden(self) -> tuple[str, ...]:
        """Prefixes post-processing and release can never resolve."""
        return tuple(dict.fromkeys((CONFIDENTIAL, *sorted(self.confidential.values()))))


def input_layout(products: list[str], inputs: Mapping[str, str]) -> InputLayout:
    """Confidential and public inputs of a release from the products' declarations and the config.

    A declared input the config does not name sits at its default prefix. A config input that no product declares
    public is confidential. A public prefix inside (or containing) a confidential one is refused: post-processing
    would read confidential objects through it.
    """
    confidential: dict[str, str] = {}
    public: dict[str, str] = {}
    owners: dict[str, tuple[str, ...]] = {}
    for product in products:
        for decl in get_plugin(product).input_declarations:
            prefix = _slash(inputs.get(decl.name, decl.default))
            (confidential if decl.confidential else public)[decl.name] = prefix
            if decl.confidential:
                owners[decl.name] = (*owners.get(decl.name, ()), product)
    for name, prefix in inputs.items():
        if name not in public:
            confidential[name] = _slash(prefix)
    for pname, pprefix in public.items():
        for cname, cprefix in confidential.items():
            if pprefix.startswith(cprefix) or cprefix.startswith(pprefix) or pprefix.startswith(CONFIDENTIAL):
                raise InputError(f"public input {pname!r} ({pprefix}) overlaps the confidential input {cname!r} "
                                 f"({cprefix}) or the confidential area; public and confidential inputs must be "
                                 "disjoint", column=f"inputs.{pname}")
    return InputLayout(confidential=confidential, public=public, owners=owners)


def object_hashes(store: ObjectStore, prefixes: Mapping[str, str], *, require: bool) -> dict[str, str]:
    """SHA-256 of every object under the prefixes (key → hex); ``require``: an input with no object is refused."""
    out: dict[str, str] = {}
    for name, prefix in sorted(prefixes.items()):
        keys = store.list(prefix)
        if require and not keys:
            raise InputError(f"input {name!r}: nothing under {store.uri}/{prefix}", file=prefix)
        for key in keys:
            out[key] = store.sha256(key)
    return out


def inputs_digest(hashes: Mapping[str, str]) -> str:
    """One SHA-256 over the sorted (key, SHA-256) pairs: what the NMFs and commits are bound to."""
    h = hashlib.sha256()
    for key, sha in sorted(hashes.items()):
        h.update(key.encode() + b"\0" + sha.encode() + b"\n")
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ content checks
def _data_rows_present(key: str, head: bytes) -> bool:
    """Whether a delimited text object holds at least one data row after its header (from its first bytes)."""
    lines = [ln for ln in head.replace(b"\r", b"").split(b"\n") if ln.strip()]
    return len(lines) >= 2


def check_not_empty(store: ObjectStore, hashes: Mapping[str, str]) -> None:
    """Refuse an empty or header-only confidential file (a lost export would be released as an all-zero
    census). Delimited text needs a data row; Parquet needs a row. Other objects (manifests) are not tables."""
    for key in sorted(hashes):
        if key.endswith((".csv", ".txt")):
            data = store.head(key, 1 << 16)
            if not data.strip():
                raise InputError("empty confidential input file (no header, no rows)", file=key, row=1)
            if not _data_rows_present(key, data):
                raise InputError("header-only confidential input file: no data rows", file=key, row=2)
        elif key.endswith(".parquet"):
            # a local file's footer is read in place (no copy of the whole file in memory)
            source = store.local_path(key) if isinstance(store, LocalStore) else io.BytesIO(store.get(key))
            try:
                rows = pq.ParquetFile(source).metadata.num_rows
            except Exception:
                continue
            if rows == 0:
                raise InputError("confidential input Parquet file has no rows", file=key)


def _manifest_files(store: ObjectStore, key: str) -> tuple[str, dict[str, str]] | None:
    """The synthetic-census manifest nearest above ``key``: (its folder, relative path → SHA-256)."""
    parts = key.split("/")[:-1]
    for depth in range(len(parts), max(len(parts) - _MANIFEST_DEPTH, 0) - 1, -1):
        folder = "/".join(parts[:depth])
        mkey = f"{folder}/{SYNTH_MANIFEST}" if folder else SYNTH_MANIFEST
        try:
            raw: dict[str, Any] = json.loads(store.get(mkey))
        except (StoreError, ValueError):
            continue
        if raw.get("generator") != "dasflow.synth":
            continue
        files = {str(f["path"]): str(f["sha256"]) for f in raw.get("files", []) if isinstance(f, dict)}
        return (folder + "/" if folder else ""), files
    return None


def check_synthetic(store: ObjectStore, hashes: Mapping[str, str]) -> None:
    """Test mode (seeded randomness, the seed printed, errors against the truth reported) is allowed only on
    inputs that the synthetic census generated: every confidential object must be listed, with its SHA-256, in
    a ``dasflow.synth`` manifest above it. Refused otherwise: on real data it would be full disclosure."""
    cache: dict[str, tuple[str, dict[str, str]] | None] = {}
    for key, sha in sorted(hashes.items()):
        if key.rsplit("/", 1)[-1] == SYNTH_MANIFEST:
            continue
        folder = key.rsplit("/", 1)[0]
        if folder not in cache:
            cache[folder] = _manifest_files(store, key)
        found = cache[folder]
        if found is None or found[1].get(key[len(found[0]):]) != sha:
            raise InputError("test mode (seeded randomness) runs only on inputs generated by the synthetic census "
                             "(dasflow.synth, listed with their SHA-256 in its manifest.json); this confidential "
                             "input is not: use rng mode 'production'", file=key, column="rng.mode")


def mark_synthetic(store: ObjectStore, folder: str, *, generator_note: str) -> str:
    """Write a ``dasflow.synth``-format manifest listing every object under ``folder`` with its SHA-256: for
    synthetic test inputs built by other means than ``dasflow.synth.generate`` (test fixtures). Writing it over
    real data is a deliberate act of whoever controls the store, recorded in the manifest's ``note``. Returns
    the manifest's key."""
    folder = _slash(folder)
    files = [{"path": key[len(folder):], "sha256": store.sha256(key)} for key in sorted(store.list(folder))
             if key != folder + SYNTH_MANIFEST]
    record = {"generator": "dasflow.synth", "note": generator_note, "files": files}
    key = folder + SYNTH_MANIFEST
    store.put(key, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return key
