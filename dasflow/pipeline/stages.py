"""The five stages of a release as plain, idempotent functions over a ``RunContext``.

Each stage writes its outputs, then its manifest (input hashes, code version, output hashes) last; a stage
whose manifest is current is skipped. Measurement goes through the ledger's measure-once protocol, so a rerun
of a release never spends twice. Post-processing and release see only a store view that cannot resolve
``confidential/`` keys.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from dasflow.errors import InputError, LedgerRefusal
from dasflow.io.store import new_token
from dasflow.pipeline.partitions import PartitionedPostprocess, StoredParts, parts_digest
from dasflow.pipeline.run import (
    CONFIDENTIAL,
    RunContext,
    code_version,
    manifest_if_current,
    write_manifest,
)
from dasflow.privacy import account, faults, rng
from dasflow.privacy.composition import PlanTotal
from dasflow.privacy.ledger import frac_str
from dasflow.products.base import MeasurementSpec, NoisyMeasurement

Progress = Callable[[int, int, str], None]

STAGES = ("validate", "preprocess", "measure", "postprocess", "release")


def _no_progress(done: int, total: int, what: str) -> None:
    return None


def input_hashes(ctx: RunContext) -> dict[str, str]:
    """SHA-256 of every confidential input object of the release (what every stage's manifest is keyed by)."""
    out: dict[str, str] = {}
    for name, prefix in sorted(ctx.config.inputs.items()):
        keys = ctx.store.list(prefix) if prefix.startswith(CONFIDENTIAL) else []
        for key in keys:
            out[key] = ctx.store.sha256(key)
        if prefix.startswith(CONFIDENTIAL) and not keys:
            raise InputError(f"input {name!r}: nothing under {ctx.store.uri}/{prefix}", file=prefix)
    return out


def ledger_spec(product: str, spec: MeasurementSpec) -> MeasurementSpec:
    """The spec under its release-wide ledger key ``{product}/{key}`` (keys are unique across products; a
    product whose keys already carry its name keeps them)."""
    if spec.product != product:
        raise LedgerRefusal(f"{product}: plan lists a key of product {spec.product!r}: {spec.key!r}")
    if spec.key.startswith(f"{product}/"):
        return spec
    return dataclasses.replace(spec, key=f"{product}/{spec.key}")


def planned(ctx: RunContext, product: str) -> list[tuple[MeasurementSpec, MeasurementSpec]]:
    """The product's data-independent plan (config + public inputs only) as (ledger spec, product spec) pairs."""
    if product not in ctx._plans:
        adapter = ctx.adapter(product)
        cfg = ctx.product_config(product)
        public = ctx.post_public(product)
        ctx._plans[product] = [(ledger_spec(product, s), s) for s in adapter.product(cfg).plan(cfg, public)]
    pairs: list[tuple[MeasurementSpec, MeasurementSpec]] = ctx._plans[product]
    return pairs


def product_specs(ctx: RunContext, product: str) -> list[MeasurementSpec]:
    """The product's plan under ledger keys."""
    return [lspec for lspec, _ in planned(ctx, product)]


def plan_stage(ctx: RunContext) -> PlanTotal:
    """Plan every product and freeze the plan against the cap, before any data is read or noise drawn."""
    specs: list[MeasurementSpec] = []
    for p in ctx.config.products:
        specs.extend(product_specs(ctx, p.name))
    faults.point("stage:plan:before-freeze")
    total = ctx.ledger.freeze_plan(specs, ctx.cap)
    account.reserve_for_release(ctx.store, ctx.config.account, release_id=ctx.release_id,  # before any noise
                                universe=ctx.config.universe, config_sha256=ctx.config_sha256, specs=specs)
    return total


def validate_stage(ctx: RunContext, product: str) -> dict[str, Any]:
    """Fail-closed input validation for one product; the summary goes to ``validation/{product}.json``."""
    inputs = input_hashes(ctx)
    current = manifest_if_current(ctx, "validate", product, inputs)
    if current is not None:
        return current
    adapter = ctx.adapter(product)
    cfg = ctx.product_config(product)
    public = adapter.public_inputs(ctx.store, ctx.config.inputs, cfg)
    confidential = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    try:
        summary = adapter.validate(confidential, public, cfg)  # raises InputError: nothing downstream runs
    finally:
        _store_validation_report(ctx, product, getattr(adapter, "last_result", None))
    key = f"{ctx.root}/validation/{product}.json"
    sha = ctx.store.put(key, (json.dumps({"product": product, "passed": True, **summary}, sort_keys=True,
                                         indent=1, default=str) + "\n").encode())
    faults.point(f"stage:validate:{product}:before-manifest")
    return write_manifest(ctx, "validate", product, inputs, {key: {"sha256": sha}})


def _store_validation_report(ctx: RunContext, product: str, result: Any) -> None:
    """The validation gate's full result (expectations, counts, first failure) and its HTML page, written
    under ``validation/`` whether the inputs passed or not (the page may quote input values: it stays in
    ``runs/``, never in ``release/``)."""
    if result is None:
        return
    ctx.store.put(f"{ctx.root}/validation/{product}.gx.json", result.to_json().encode())
    ctx.store.put(f"{ctx.root}/validation/{product}.html", result.html.encode())


def preprocess_stage(ctx: RunContext, product: str) -> dict[str, Any]:
    """Run the product's stable transformations; write each prepared frame as Parquet."""
    inputs = input_hashes(ctx)
    current = manifest_if_current(ctx, "preprocess", product, inputs)
    if current is not None:
        return current
    if manifest_if_current(ctx, "validate", product, inputs) is None:
        raise InputError(f"{product}: inputs have not passed validation for this release; run validate first")
    adapter = ctx.adapter(product)
    cfg = ctx.product_config(product)
    public = adapter.public_inputs(ctx.store, ctx.config.inputs, cfg)
    confidential = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    prepared = adapter.product(cfg).prepare(confidential, public)
    outputs: dict[str, dict[str, Any]] = {}
    for name, frame in sorted(prepared.items()):
        key = f"{ctx.root}/prepared/{product}/{name}.parquet"
        sha, rows = ctx.store.put_parquet(key, frame)
        outputs[key] = {"sha256": sha, "rows": rows, "name": name}
    faults.point(f"stage:preprocess:{product}:before-manifest")
    return write_manifest(ctx, "preprocess", product, inputs, outputs)


def load_prepared(ctx: RunContext, product: str) -> dict[str, pd.DataFrame]:
    """The prepared frames of a product, from its (current) preprocess manifest."""
    record = manifest_if_current(ctx, "preprocess", product, input_hashes(ctx))
    if record is None:
        raise InputError(f"{product}: no current preprocess output for release {ctx.release_id}")
    return {out["name"]: ctx.store.get_parquet(key) for key, out in record["outputs"].items()}


def base_rng(ctx: RunContext) -> rng.Generator:
    """Production: the OS CSPRNG. Test releases: the seeded generator (noise per key derived from seed+key)."""
    if ctx.config.rng.mode == "test":
        assert ctx.config.rng.seed is not None
        return rng.seeded(ctx.config.rng.seed)
    return rng.csprng()


def measure_stage(ctx: RunContext, product: str, progress: Progress = _no_progress) -> dict[str, Any]:
    """Measure every planned key of the product exactly once (the ledger's protocol)."""
    plan = ctx.ledger.plan()
    pairs = planned(ctx, product)
    missing = [s.key for s, _ in pairs if s.key not in plan]
    if missing:
        raise LedgerRefusal(f"{product}: keys not in the frozen plan: {missing[:5]}; refused before any noise")
    account.require_reserved(ctx.store, ctx.config.account, ctx.release_id)
    cache: dict[str, dict[str, pd.DataFrame]] = {}  # prepared frames, loaded only if something is drawn
    adapter = ctx.adapter(product)
    g = base_rng(ctx)
    attempt = new_token()
    drawn = 0
    done: dict[str, NoisyMeasurement] = {}
    for i, (spec, native) in enumerate(pairs):

        def draw(spec: MeasurementSpec = spec, native: MeasurementSpec = native) -> NoisyMeasurement:
            if "prepared" not in cache:
                cache["prepared"] = load_prepared(ctx, product)
            product_obj = adapter.product(ctx.product_config(product))
            return measure_one(product_obj, cache["prepared"], native, g.spawn(spec.key), done)

        measurement, fresh = ctx.ledger.measure_once(spec, draw, attempt=attempt)
        done[native.key] = dataclasses.replace(measurement, spec=native)
        drawn += int(fresh)
        progress(i + 1, len(pairs), spec.key)
    faults.point(f"stage:measure:{product}:done")
    return {"product": product, "keys": len(pairs), "drawn_now": drawn, "rng_mode": g.mode}


def measure_one(product: Any, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, g: rng.Generator,
                earlier: Mapping[str, NoisyMeasurement]) -> NoisyMeasurement:
    """One key's measurement. Adaptive products (SafeTab-P stage 2) receive the earlier noisy measurements of
    this release — public post-processed facts — through ``measure_adaptive``; their budgets are fixed in the
    plan, only the query shape depends on them."""
    if hasattr(product, "measure_adaptive"):
        result: NoisyMeasurement = product.measure_adaptive(prepared, spec, g, earlier)
        return result
    result = product.measure(prepared, spec, g)
    return result


def load_measurements(ctx: RunContext, product: str,
                      keys: Sequence[str] | None = None) -> dict[str, NoisyMeasurement]:
    """The committed measurements of the product (all, or those of the product's own ``keys``); refuses if one
    of them is not committed."""
    out: dict[str, NoisyMeasurement] = {}
    pairs = planned(ctx, product)
    if keys is not None:
        wanted = set(keys)
        unknown = wanted - {native.key for _, native in pairs}
        if unknown:
            raise LedgerRefusal(f"{product}: {sorted(unknown)[:3]} are not planned keys")
        pairs = [(spec, native) for spec, native in pairs if native.key in wanted]
    for spec, native in pairs:
        commit = ctx.ledger.committed(spec.key)
        if commit is None:
            raise LedgerRefusal(f"{product}: {spec.key!r} is not measured yet; run the measure stage first")
        out[native.key] = dataclasses.replace(ctx.ledger.load(spec, commit), spec=native)
    return out


def _measurement_hashes(ctx: RunContext, product: str) -> dict[str, str]:
    hashes = {}
    for spec in product_specs(ctx, product):
        commit = ctx.ledger.committed(spec.key)
        hashes[spec.key] = commit.sha256 if commit else "missing"
    return hashes


def postprocess_stage(ctx: RunContext, product: str, *, force: bool = False) -> dict[str, Any]:
    """Pure post-processing of the committed measurements and public inputs (no confidential access).

    ``force`` recomputes even if the stage's manifest is current (an operator's rerun after a fix)."""
    post = ctx.post_store()
    inputs = _measurement_hashes(ctx, product)
    current = manifest_if_current(ctx, "postprocess", product, inputs)
    if current is not None and not force:
        return current
    adapter = ctx.adapter(product)
    cfg = ctx.product_config(product)
    public = ctx.post_public(product)
    split = partitioner(ctx, product)
    if split is None:
        estimates = adapter.product(cfg).postprocess(load_measurements(ctx, product), public)
    else:  # parts not yet computed (by mapped tasks) are computed here, in plan order; all of them if forced
        parts = stored_parts(ctx, product)
        steps = split.post_steps(public)
        for step in steps:
            for part in step.parts:
                _compute_part(split, parts, step.name, part, public, force=force)
        estimates = split.post_combine(steps, parts, public)
    outputs: dict[str, dict[str, Any]] = {}
    for name, frame in sorted(estimates.items()):
        key = f"{ctx.root}/postprocessed/{product}/{name}.parquet"
        sha, rows = post.put_parquet(key, frame)
        outputs[key] = {"sha256": sha, "rows": rows, "name": name}
    faults.point(f"stage:postprocess:{product}:before-manifest")
    return write_manifest(ctx, "postprocess", product, inputs, outputs)


def partitioner(ctx: RunContext, product: str) -> PartitionedPostprocess | None:
    """The product's post-processing as steps of parts, if its adapter offers that (``partitioned``)."""
    adapter = ctx.adapter(product)
    split = getattr(adapter, "partitioned", None)
    if split is None:
        return None
    result: PartitionedPostprocess | None = split(adapter.product(ctx.product_config(product)))
    return result


def stored_parts(ctx: RunContext, product: str) -> StoredParts:
    """The product's part outputs for its current measurements and code (post-processing store view); one
    instance per context and digest, so the parts a worker runs verify each input part once."""
    digest = parts_digest(_measurement_hashes(ctx, product), code_version())
    key = f"parts:{product}:{digest}"
    if key not in ctx._cache:
        ctx._cache[key] = StoredParts(ctx.post_store(), ctx.root, product, digest,
                                       lambda keys: load_measurements(ctx, product, keys))
    parts: StoredParts = ctx._cache[key]
    return parts


def postprocess_steps(ctx: RunContext, product: str) -> list[dict[str, Any]]:
    """The steps and parts a flow maps over (empty: the product post-processes in one piece)."""
    split = partitioner(ctx, product)
    if split is None:
        return []
    return [{"step": s.name, "parts": list(s.parts)} for s in split.post_steps(ctx.post_public(product))]


def postprocess_part(ctx: RunContext, product: str, step: str, part: str) -> dict[str, Any]:
    """Compute one part of the product's post-processing unless it is done; its part manifest."""
    split = partitioner(ctx, product)
    if split is None:
        raise InputError(f"{product}: post-processing is not partitioned")
    return _compute_part(split, stored_parts(ctx, product), step, part, ctx.post_public(product))


def _compute_part(split: PartitionedPostprocess, parts: StoredParts, step: str, part: str,
                  public: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
    record = None if force else parts.done(step, part)
    if record is None:
        record = parts.write(step, part, split.post_part(step, part, parts, public))
        faults.point(f"postprocess:part-done:{parts.product}/{step}/{part}")
    return record


def release_stage(ctx: RunContext) -> dict[str, Any]:
    """Write every product's release files and the ledger audit, then (``dasflow.release``) the PHSafe
    estimates, the privacy certificate, the accuracy report, and the validated release manifest (last)."""
    from dasflow.release.stage import finalize_release
    from validation import validate_outputs

    post = ctx.post_store()
    upstream: dict[str, str] = {}
    written: dict[str, pd.DataFrame] = {}
    for p in ctx.config.products:
        record = manifest_if_current(ctx, "postprocess", p.name, _measurement_hashes(ctx, p.name))
        if record is None:
            raise InputError(f"{p.name}: no current post-processed estimates; run postprocess first")
        estimates = {out["name"]: post.get_parquet(key) for key, out in record["outputs"].items()}
        upstream.update({k: v["sha256"] for k, v in record["outputs"].items()})
        adapter = ctx.adapter(p.name)
        for name, frame in sorted(adapter.product(ctx.product_config(p.name)).tables(estimates).items()):
            rel = f"{p.name}/{adapter.file_name(name, ctx.config.universe)}"
            key = f"{ctx.root}/release/{rel}"
            post.put(key, _table_bytes(key, frame))
            written[rel] = frame
    # output validation before anything else is derived: schemas, integer counts, VARIANCE as planned, no
    # confidential column, consistency where a product promises it (validation/outputs.py)
    configs = {p.name: ctx.product_config(p.name) for p in ctx.config.products}
    validate_outputs(written, ctx.ledger.plan_record(), configs).raise_for_failure()
    audit_key = f"{ctx.root}/release/ledger.csv"
    post.put(audit_key, ledger_csv(ctx).encode())
    faults.point("stage:release:before-manifest")
    # PHSafe estimates, certificate (md + html), accuracy report, then output validation and MANIFEST.json last
    manifest = finalize_release(ctx)
    key = f"{ctx.root}/release/MANIFEST.json"
    write_manifest(ctx, "release", "all", upstream, {key: {"sha256": post.sha256(key)}})
    return manifest


def _table_bytes(name: str, frame: pd.DataFrame) -> bytes:
    """A release file: Parquet for ``.parquet``, else pipe-delimited text with a header (the Census
    convention for the PHSafe and SafeTab-P ``.csv`` files)."""
    if name.endswith(".parquet"):
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return buf.getvalue()
    return str(frame.to_csv(index=False, sep="|", lineterminator="\n")).encode()


def ledger_csv(ctx: RunContext) -> str:
    """The ledger audit as CSV (deterministic: no times)."""
    rows = ctx.ledger.audit()
    return str(pd.DataFrame(rows).to_csv(index=False, lineterminator="\n"))


def status(ctx: RunContext) -> dict[str, Any]:
    """Stages done / pending per product and ledger spent vs planned."""
    out: dict[str, Any] = {"release_id": ctx.release_id, "store": ctx.store.uri, "products": {}}
    try:
        inputs = input_hashes(ctx)
    except InputError:
        inputs = {}
    for p in ctx.config.products:
        st = {}
        st["validate"] = manifest_if_current(ctx, "validate", p.name, inputs) is not None
        st["preprocess"] = manifest_if_current(ctx, "preprocess", p.name, inputs) is not None
        try:
            rows = [r for r in ctx.ledger.audit() if r["product"] == p.name]
            st["measure"] = bool(rows) and all(r["state"] == "committed" for r in rows)
            st["postprocess"] = manifest_if_current(ctx, "postprocess", p.name,
                                                    _measurement_hashes(ctx, p.name)) is not None
        except LedgerRefusal:
            st["measure"] = st["postprocess"] = False
        out["products"][p.name] = st
    out["released"] = ctx.store.exists(f"{ctx.root}/release/MANIFEST.json")
    try:
        planned = ctx.ledger.plan_record()["total"]
        out["planned"] = planned
        out["spent"] = ctx.ledger.spent().as_record()
    except Exception:  # no plan yet
        out["planned"] = out["spent"] = None
    return out


__all__ = ["STAGES", "frac_str", "measure_stage", "plan_stage", "postprocess_part", "postprocess_stage",
           "postprocess_steps", "preprocess_stage", "release_stage", "status", "validate_stage"]
