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
from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import FrozenStore, ObjectStore, StoreError, open_store, sha256_bytes
from dasflow.pipeline.inputs import InputLayout, input_layout, inputs_digest, object_hashes
from dasflow.privacy.ledger import Cap, Ledger
from dasflow.products.plugin import ProductPlugin
from dasflow.registry import get_plugin
from dasflow.validation.configs import validate_product_config


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

    def plugin(self, name: str) -> ProductPlugin[Any]:
        """The product's plugin (``dasflow.registry``)."""
        return get_plugin(name)

    def product_config(self, name: str) -> Any:
        if name not in self._product_configs:
            entry = next(p for p in self.config.products if p.name == name)
            self._product_configs[name] = validate_product_config(self.plugin(name), entry.config_text,
                                                                  self.config.universe)
        return self._product_configs[name]

    def post_public(self, name: str) -> Any:
        """The product's public inputs read through the post-processing view, once per context (the parts a
        worker runs share them, and the product objects' caches keyed by them: TopDown's spine).

        Once the plan is frozen, every public object is read as frozen (:meth:`public_store`) and the product's
        stored derived objects are loaded (``ProductPlugin.load_derived``) instead of being rebuilt."""
        key = f"public:{name}"
        if key not in self._cache:
            plugin, cfg = self.plugin(name), self.product_config(name)
            view = self.public_store(self.post_store())
            public = plugin.public_inputs(view, self.config.inputs, cfg)
            record = self.public_record()
            prefix = self.derived_prefix(name)
            derived = {k[len(prefix):]: view.get(k) for k in sorted((record or {}).get("derived", {}))
                       if k.startswith(prefix)}
            self._cache[key] = plugin.load_derived(public, derived, cfg) if derived else public
        return self._cache[key]

    def derived_prefix(self, name: str) -> str:
        """Where the plan stage stores a product's derived public objects (``ProductPlugin.derived_public``)."""
        return f"{self.root}/derived/{name}/"

    def public_digests(self) -> dict[str, str]:
        """SHA-256 of every object under the release's public inputs, read through the post-processing view
        (which cannot resolve a confidential key)."""
        return object_hashes(self.post_store(), self.layout.public, require=False)

    def public_record(self) -> dict[str, Any] | None:
        """The public objects frozen with the plan: ``{"inputs": {key: sha256}, "derived": {key: sha256}}``;
        ``None`` before the plan is frozen. A frozen plan without the record is refused (``IntegrityError``)."""
        if "public_record" not in self._cache:
            plan_key = f"{self.ledger.root}/plan.json"
            if not self.store.exists(plan_key):
                return None
            record = self.ledger.plan_record().get("public")
            if not isinstance(record, dict) or not isinstance(record.get("inputs"), dict) \
                    or not isinstance(record.get("derived"), dict):
                raise IntegrityError(f"{self.store.uri}/{plan_key}: records no public-input digests (frozen by an "
                                     "older dasflow, or edited); start a new release id")
            self._cache["public_record"] = record
        found: dict[str, Any] | None = self._cache["public_record"]
        return found

    def public_store(self, base: ObjectStore) -> ObjectStore:
        """``base`` seen with its public inputs and derived objects frozen: once the plan is frozen, a public
        object that was added or changed since raises ``IntegrityError`` naming it when read."""
        record = self.public_record()
        if record is None:
            return base
        guarded = [*self.layout.public.values(), f"{self.root}/derived/"]
        return FrozenStore(base, {**record["inputs"], **record["derived"]}, guarded)

    @property
    def layout(self) -> InputLayout:
        """The release's confidential and public inputs, from the products' declarations and the config."""
        if "layout" not in self._cache:
            self._cache["layout"] = input_layout([p.name for p in self.config.products], self.config.inputs)
        layout: InputLayout = self._cache["layout"]
        return layout

    def confidential_hashes(self, product: str | None = None) -> dict[str, str]:
        """SHA-256 of every object under the confidential inputs ``product`` depends on
        (``InputLayout.confidential_of``), or of the whole release without one; each input prefix is hashed once
        per context, and an input with no object is refused. A product's stages are keyed by its own inputs only:
        at national size one pass over every product's files is ≈ 30 CPU-s of SHA-256 and 48 GB read from disk.
        Confidential-side only: these digests never go under ``release/``."""
        layout = self.layout
        wanted = layout.confidential if product is None else layout.confidential_of(product)
        done: dict[str, dict[str, str]] = self._cache.setdefault("confidential_hashes", {})  # by prefix
        for name, prefix in sorted(wanted.items()):
            if prefix not in done:
                done[prefix] = object_hashes(self.store, {name: prefix}, require=True)
        return {key: sha for name in sorted(wanted) for key, sha in done[wanted[name]].items()}

    def bind_inputs(self, product: str) -> None:
        """Bind the product's measurements to its current confidential inputs (its NMFs record this digest and
        committed ones must carry it: ``Ledger.bind_inputs``)."""
        self.ledger.bind_inputs(product, inputs_digest(self.confidential_hashes(product)))

    def post_store(self) -> ObjectStore:
        """The store view post-processing and release get: it cannot resolve any confidential input (wherever
        the config puts it), the ``confidential/`` area, nor the release's prepared tabulations and validation
        reports."""
        return self.store.restricted([*self.layout.forbidden, f"{self.root}/prepared/", f"{self.root}/validation/"])


def _context(store: ObjectStore, config: ReleaseConfig) -> RunContext:
    binding = {"config_sha256": config.sha256(), "rng_mode": config.rng.mode}
    return RunContext(store=store, config=config, config_sha256=config.sha256(),
                      ledger=Ledger(store, config.release_id, binding))


def _frozen_text(store: ObjectStore, release_id: str) -> str | None:
    """The frozen config's text, verified against ``config.sha256`` (``None``: not frozen yet)."""
    key = f"runs/{release_id}/config.json"
    try:
        data = store.get(key)
    except StoreError:
        return None
    try:
        recorded = store.get_text(f"runs/{release_id}/config.sha256").strip()
    except StoreError:  # a freeze interrupted before its hash: harmless while nothing was planned on it
        recorded = "" if store.exists(f"runs/{release_id}/ledger/plan.json") else sha256_bytes(data)
    if recorded != sha256_bytes(data):
        raise IntegrityError(f"{store.uri}/{key}: does not match its frozen SHA-256 (config.sha256): the frozen "
                             "config was changed or is incomplete; the release cannot go on")
    return data.decode("utf-8")


def candidate_context(config: ReleaseConfig, store: ObjectStore | None = None) -> RunContext:
    """The context of ``config`` *before* it is frozen (validation runs here, so a refused input leaves the release
    id reusable). If the release is already frozen, ``config`` must equal the frozen config."""
    store = store or open_store(config.store)
    frozen = _frozen_text(store, config.release_id)
    if frozen is not None and frozen != config.canonical_json():
        raise InputError(
            f"release {config.release_id!r} already exists in {store.uri} with a different config "
            f"(frozen sha256 {hashlib.sha256(frozen.encode()).hexdigest()[:12]}, given {config.sha256()[:12]}); a "
            "frozen release's config never changes",
            file=f"{store.uri}/runs/{config.release_id}/config.json",
        )
    return _context(store, config)


def freeze_config(config: ReleaseConfig, store: ObjectStore | None = None) -> RunContext:
    """Freeze ``config`` into its store (create-only: its SHA-256 first, then the text) or verify it equals the
    frozen one; return the context.

    A different config under an existing release id is refused (``InputError``, exit 2); a frozen config that
    no longer matches its SHA-256 is refused (``IntegrityError``, exit 3).
    """
    ctx = candidate_context(config, store)
    root = f"runs/{config.release_id}"
    text = config.canonical_json().encode()
    if not ctx.store.exists(f"{root}/config.sha256"):
        ctx.store.put_if_absent(f"{root}/config.json", text)
        winner = ctx.store.get(f"{root}/config.json")  # a concurrent freeze of another config may have won
        ctx.store.put_if_absent(f"{root}/config.sha256", (sha256_bytes(winner) + "\n").encode())
        candidate_context(config, ctx.store)  # ... and then this one is refused here
    return ctx


def open_run(release_id: str, store_uri: str) -> RunContext:
    """The context of an existing release from its frozen config (for resume, status, ledger), verified against
    its frozen SHA-256 and the plan's binding."""
    store = open_store(store_uri)
    text = _frozen_text(store, release_id)
    if text is None:
        raise InputError(f"no release {release_id!r} in {store.uri}", file=f"{store.uri}/runs/{release_id}")
    raw = json.loads(text)
    raw["store"] = store_uri  # execution settings are not frozen (see ReleaseConfig.canonical_json)
    config = parse_release_config(raw, source=f"{store.uri}/runs/{release_id}/config.json")
    if config.canonical_json() != text:
        raise IntegrityError(f"{store.uri}/runs/{release_id}/config.json: not in canonical form (edited)")
    ctx = _context(store, config)
    try:
        bound = json.loads(store.get(f"runs/{release_id}/ledger/plan.json")).get("binding", {})
    except StoreError:
        return ctx
    except ValueError:
        raise IntegrityError(f"{store.uri}/runs/{release_id}/ledger/plan.json: unreadable frozen plan") from None
    if bound != {"config_sha256": ctx.config_sha256, "rng_mode": config.rng.mode}:
        raise IntegrityError(f"{store.uri}/runs/{release_id}/ledger/plan.json: the frozen plan is bound to another "
                             f"config or RNG mode ({bound}); the frozen config was changed")
    return ctx


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


def manifest_if_current(ctx: RunContext, stage: str, product: str, inputs: Mapping[str, str] | None, *,
                        outputs: bool = True) -> dict[str, Any] | None:
    """The stage's manifest if it matches these inputs (``None``: whatever inputs it records), this config and
    this code version, and its outputs are intact (``outputs=False``: not hashed here; the caller checks each
    output it reads against the manifest, ``prepared.VerifiedReads``)."""
    try:
        record: dict[str, Any] = json.loads(ctx.store.get(manifest_key(ctx, stage, product)))
    except StoreError:
        return None
    if record.get("code_version") != code_version() or record.get("config_sha256") != ctx.config_sha256 or \
            (inputs is not None and record.get("inputs") != dict(sorted(inputs.items()))):
        return None
    for key, out in record.get("outputs", {}).items() if outputs else ():
        if not ctx.store.exists(key) or ctx.store.sha256(key) != out.get("sha256"):
            return None
    return record
