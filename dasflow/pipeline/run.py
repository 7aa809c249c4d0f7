"""A release run in its store: frozen config, stage manifests, and the run context every stage gets."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dasflow
from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import ObjectStore, StoreError, open_store
from dasflow.pipeline.adapters import Adapter, get_adapter
from dasflow.privacy.ledger import Cap, Ledger

CONFIDENTIAL = "confidential/"


@functools.cache
def code_version() -> str:
    """``dasflow-<version>+<sha256 of the library's sources>``: any code change invalidates stage manifests."""
    root = Path(dasflow.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    version = getattr(dasflow, "__version__", "0")
    return f"dasflow-{version}+{h.hexdigest()[:16]}"


@dataclass
class RunContext:
    """Everything a stage needs: the store, the frozen config and its hash, the ledger."""

    store: ObjectStore
    config: ReleaseConfig
    config_sha256: str
    ledger: Ledger
    _product_configs: dict[str, Any] = field(default_factory=dict)
    _plans: dict[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict)  # post-processing: public inputs, stored parts

    @property
    def release_id(self) -> str:
        return self.config.release_id

    @property
    def root(self) -> str:
        return f"runs/{self.release_id}"

    @property
    def cap(self) -> Cap:
        return Cap(rho=self.config.cap.fraction("rho"), epsilon=self.config.cap.fraction("epsilon"))

    def adapter(self, name: str) -> Adapter:
        return get_adapter(name)

    def product_config(self, name: str) -> Any:
        if name not in self._product_configs:
            entry = next(p for p in self.config.products if p.name == name)
            self._product_configs[name] = self.adapter(name).load_config(entry.config_text, self.config.universe)
        return self._product_configs[name]

    def post_public(self, name: str) -> Any:
        """The product's public inputs read through the post-processing view, once per context (the parts a
        worker runs share them, and the product objects' caches keyed by them: TopDown's spine)."""
        key = f"public:{name}"
        if key not in self._cache:
            self._cache[key] = self.adapter(name).public_inputs(self.post_store(), self.config.inputs,
                                                                  self.product_config(name))
        return self._cache[key]

    def post_store(self) -> ObjectStore:
        """The store view post-processing and release get: it cannot resolve confidential keys."""
        return self.store.restricted([CONFIDENTIAL])


def freeze_config(config: ReleaseConfig, store: ObjectStore | None = None) -> RunContext:
    """Freeze ``config`` into its store (create-only) or verify it equals the frozen one; return the context.

    A different config under an existing release id is refused (``InputError``, exit 2).
    """
    store = store or open_store(config.store)
    text = config.canonical_json()
    key = f"runs/{config.release_id}/config.json"
    if not store.put_if_absent(key, text.encode()):
        frozen = store.get_text(key)
        if frozen != text:
            raise InputError(
                f"release {config.release_id!r} already exists in {store.uri} with a different config "
                f"(frozen sha256 {hashlib.sha256(frozen.encode()).hexdigest()[:12]}, given {config.sha256()[:12]});"
                " use a new release_id",
                file=f"{store.uri}/{key}",
            )
    store.put_if_absent(f"runs/{config.release_id}/config.sha256", (config.sha256() + "\n").encode())
    return RunContext(store=store, config=config, config_sha256=config.sha256(),
                      ledger=Ledger(store, config.release_id))


def open_run(release_id: str, store_uri: str) -> RunContext:
    """The context of an existing release from its frozen config (for resume, status, ledger)."""
    store = open_store(store_uri)
    try:
        raw = json.loads(store.get_text(f"runs/{release_id}/config.json"))
    except StoreError:
        raise InputError(f"no release {release_id!r} in {store.uri}", file=f"{store.uri}/runs/{release_id}") from None
    raw["store"] = store_uri  # execution settings are not frozen (see ReleaseConfig.canonical_json)
    config = parse_release_config(raw, source=f"{store.uri}/runs/{release_id}/config.json")
    return RunContext(store=store, config=config, config_sha256=config.sha256(), ledger=Ledger(store, release_id))


# ------------------------------------------------------------------------------------------------- manifests
def manifest_key(ctx: RunContext, stage: str, product: str) -> str:
    return f"{ctx.root}/manifests/{stage}/{product}.json"


def write_manifest(ctx: RunContext, stage: str, product: str, inputs: Mapping[str, str],
                   outputs: Mapping[str, Mapping[str, Any]], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write a stage manifest: input hashes, code version, output hashes/rows (written last, after outputs)."""
    record = {"stage": stage, "product": product, "release_id": ctx.release_id, "config_sha256": ctx.config_sha256,
              "code_version": code_version(), "inputs": dict(sorted(inputs.items())),
              "outputs": {k: dict(v) for k, v in sorted(outputs.items())}, **(extra or {})}
    ctx.store.put(manifest_key(ctx, stage, product), (json.dumps(record, sort_keys=True, indent=1) + "\n").encode())
    return record


def manifest_if_current(ctx: RunContext, stage: str, product: str,
                        inputs: Mapping[str, str]) -> dict[str, Any] | None:
    """The stage's manifest if it matches these inputs and this code version and its outputs are intact."""
    try:
        record: dict[str, Any] = json.loads(ctx.store.get(manifest_key(ctx, stage, product)))
    except StoreError:
        return None
    if record.get("code_version") != code_version() or record.get("inputs") != dict(sorted(inputs.items())):
        return None
    for key, out in record.get("outputs", {}).items():
        if not ctx.store.exists(key) or ctx.store.sha256(key) != out.get("sha256"):
            return None
    return record
