"""The release stage: every product's release files, then its extra outputs in one call — derived files of the
products (``extra_release_files``: PHSafe's estimates), certificate (Markdown + HTML), accuracy report, and the
validated manifest last.

Layout under ``runs/{id}/release/``::

    {product}/…                                      product tables (:func:`release_stage`), ledger.csv
    {product}/{extra}                                derived files of a product (e.g. phsafe/estimates/PH1.csv)
    CERTIFICATE.md, CERTIFICATE.html                privacy certificate
    ACCURACY.html                                   accuracy report (plots embedded)
    MANIFEST.json                                   SHA-256 and rows of every file; written last

Everything except the accuracy report of a *test* release is computed from released files, the frozen plan
and public inputs through the post-processing store view (which cannot read ``confidential/``). A test
release's report also compares against the ground-truth twins (:func:`dasflow.release.accuracy.truth_frames`,
test mode only). All outputs are deterministic: re-running gives the same bytes. The release layer sits above
the pipeline: it uses the pipeline's stage machinery (manifests, the ledger audit), never the other way round.
"""

from __future__ import annotations

import io
from typing import Any

import pandas as pd

from dasflow.errors import InputError
from dasflow.io.store import sha256_bytes
from dasflow.pipeline.metrics import StageMeter
from dasflow.pipeline.run import RunContext, manifest_if_current, write_manifest
from dasflow.pipeline.stages import _measurement_hashes, _table_bytes, ledger_csv
from dasflow.privacy import faults
from dasflow.products.plugin import overrides
from dasflow.release.accuracy import ESTIMATES, accuracy_report, truth_frames
from dasflow.release.certificate import certificate
from dasflow.release.publish import write_release_manifest
from dasflow.validation import validate_outputs

CERTIFICATE_MD = "CERTIFICATE.md"
CERTIFICATE_HTML = "CERTIFICATE.html"
ACCURACY_HTML = "ACCURACY.html"


def _put(ctx: RunContext, rel: str, data: bytes) -> tuple[str, dict[str, Any]]:
    key = f"{ctx.root}/release/{rel}"
    ctx.post_store().put(key, data)
    return key, {"sha256": sha256_bytes(data), "bytes": len(data)}


def release_tables(ctx: RunContext, product: str) -> dict[str, pd.DataFrame]:
    """A product's released tables as published (path relative to ``release/{product}/`` -> frame; CSV as
    text, pipe-delimited), without the derived estimates under ``estimates/``."""
    store = ctx.post_store()
    prefix = f"{ctx.root}/release/{product}/"
    out: dict[str, pd.DataFrame] = {}
    for key in store.list(prefix):
        rel = key[len(prefix):]
        if rel.startswith(ESTIMATES):
            continue
        if rel.endswith(".parquet"):
            out[rel] = pd.read_parquet(io.BytesIO(store.get(key)))
        elif rel.endswith(".csv"):
            out[rel] = pd.read_csv(io.BytesIO(store.get(key)), sep="|", dtype=str, keep_default_na=False)
    return out


def write_extra_files(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """Every product's derived release files (its plugin's ``extra_release_files``, computed from its released
    tables only: post-processing) under ``release/{product}/``."""
    out = {}
    for p in ctx.config.products:
        plugin = ctx.plugin(p.name)
        if not overrides(plugin, "extra_release_files"):  # none: do not read the tables back
            continue
        files = plugin.extra_release_files(release_tables(ctx, p.name), ctx.product_config(p.name))
        for rel, data in sorted(files.items()):
            key, info = _put(ctx, f"{p.name}/{rel}", data)
            out[key] = info
    return out


def write_certificate(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """``CERTIFICATE.md`` and ``CERTIFICATE.html``."""
    md, page = certificate(ctx)
    return dict([_put(ctx, CERTIFICATE_MD, md.encode()), _put(ctx, CERTIFICATE_HTML, page.encode())])


def write_accuracy_report(ctx: RunContext, with_truth: bool | None = None) -> dict[str, dict[str, Any]]:
    """``ACCURACY.html``; ``with_truth`` defaults to "test release" (never possible for production)."""
    use_truth = ctx.config.is_test if with_truth is None else with_truth
    page = accuracy_report(ctx, truth_frames(ctx) if use_truth else None)
    return dict([_put(ctx, ACCURACY_HTML, page.encode())])


def finalize_release(ctx: RunContext, *, accuracy_truth: bool | None = None) -> dict[str, Any]:
    """Write the products' derived files, certificate and accuracy report, then validate and write
    ``MANIFEST.json`` last.

    Call after the product tables are in ``release/`` (:func:`release_stage`). Returns the manifest.
    """
    write_extra_files(ctx)
    write_certificate(ctx)
    write_accuracy_report(ctx, accuracy_truth)
    return write_release_manifest(ctx)


def release_stage(ctx: RunContext) -> dict[str, Any]:
    """Write every product's release files and the ledger audit, then the products' derived files, the privacy
    certificate, the accuracy report, and the validated release manifest (last). Its metrics go to the stage
    manifest under ``manifests/``, never into ``release/``."""
    meter = StageMeter.start()
    post = ctx.post_store()
    ctx.ledger.verify(deep=False)  # the NMFs themselves are verified as post-processing loads them
    upstream: dict[str, str] = {}
    written: dict[str, pd.DataFrame] = {}
    for p in ctx.config.products:
        record = manifest_if_current(ctx, "postprocess", p.name, _measurement_hashes(ctx, p.name))
        if record is None:
            raise InputError(f"{p.name}: no current post-processed estimates; run postprocess first")
        estimates = {out["name"]: post.get_parquet(key) for key, out in record["outputs"].items()}
        upstream.update({k: v["sha256"] for k, v in record["outputs"].items()})
        plugin = ctx.plugin(p.name)
        for name, frame in sorted(plugin.product(ctx.product_config(p.name)).tables(estimates).items()):
            rel = f"{p.name}/{plugin.file_name(name, ctx.config.universe)}"
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
    # derived files, certificate (md + html), accuracy report, then output validation and MANIFEST.json last
    manifest = finalize_release(ctx)
    key = f"{ctx.root}/release/MANIFEST.json"
    write_manifest(ctx, "release", "all", upstream, {key: {"sha256": post.sha256(key)}}, {"metrics": meter.read()})
    return manifest
