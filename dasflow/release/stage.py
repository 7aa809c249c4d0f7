"""The release stage: every product's release files and derived files (``extra_release_files``: PHSafe's
estimates), each product's as soon as its post-processing is done (:func:`product_release_files`), then the
certificate (Markdown + HTML), the accuracy report, and the validated manifest last.

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
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.delimited import pipe_text
from dasflow.io.store import ObjectWriter, sha256_bytes
from dasflow.pipeline.estimates import StoredEstimates
from dasflow.pipeline.metrics import StageMeter
from dasflow.pipeline.run import RunContext, manifest_if_current, write_manifest
from dasflow.pipeline.stages import _measurement_hashes, ledger_csv
from dasflow.privacy import faults
from dasflow.products.plugin import overrides
from dasflow.release.accuracy import ESTIMATES, LazyTruth, accuracy_report
from dasflow.release.certificate import certificate
from dasflow.release.publish import MANIFEST, PUBLICATION, release_prefix, write_release_manifest
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


def write_extra_files(ctx: RunContext, product: str) -> dict[str, dict[str, Any]]:
    """The product's derived release files (its plugin's ``extra_release_files``, computed from its released
    tables only: post-processing) under ``release/{product}/``."""
    plugin = ctx.plugin(product)
    if not overrides(plugin, "extra_release_files"):  # none: do not read the tables back
        return {}
    files = plugin.extra_release_files(release_tables(ctx, product), ctx.product_config(product))
    return dict(_put(ctx, f"{product}/{rel}", data) for rel, data in sorted(files.items()))


def write_certificate(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """``CERTIFICATE.md`` and ``CERTIFICATE.html``."""
    md, page = certificate(ctx)
    return dict([_put(ctx, CERTIFICATE_MD, md.encode()), _put(ctx, CERTIFICATE_HTML, page.encode())])


def write_accuracy_report(ctx: RunContext, with_truth: bool | None = None) -> dict[str, dict[str, Any]]:
    """``ACCURACY.html``; ``with_truth`` defaults to "test release" (never possible for production)."""
    use_truth = ctx.config.is_test if with_truth is None else with_truth
    page = accuracy_report(ctx, LazyTruth(ctx) if use_truth else None)  # one product's truth at a time
    return dict([_put(ctx, ACCURACY_HTML, page.encode())])


def finalize_release(ctx: RunContext, *, accuracy_truth: bool | None = None) -> dict[str, Any]:
    """Write the certificate and accuracy report, then validate and write ``MANIFEST.json`` last.

    Call after every product's files are in ``release/`` (:func:`release_stage`). Returns the manifest.
    """
    write_certificate(ctx)
    write_accuracy_report(ctx, accuracy_truth)
    return write_release_manifest(ctx)


#: rows of release tables validated together (one ``validate_outputs`` call: its grouped expectation runs)
VALIDATION_ROWS = 2_000_000


class _OutputChecks:
    """Output validation of a product's tables as they are written in chunks: every row of every table passes
    ``validate_outputs`` (header, integer COUNT, planned VARIANCE, no confidential column, …) in batches of
    about ``VALIDATION_ROWS`` rows, a failure naming the table's own row; a table that never gets a row is
    checked as empty. A product with cross-file rules (``check_outputs``) is validated whole, at the end."""

    def __init__(self, plan_record: Mapping[str, Any], whole: bool) -> None:
        self.plan_record = plan_record
        self.whole = whole
        self.pending: dict[str, list[pd.DataFrame]] = {}
        self.rows = 0
        self.offset: dict[str, int] = {}
        self.empty: dict[str, pd.DataFrame] = {}

    def add(self, rel: str, chunk: pd.DataFrame) -> None:
        self.offset.setdefault(rel, 0)
        if chunk.empty:
            self.empty.setdefault(rel, chunk)
            return
        self.pending.setdefault(rel, []).append(chunk)
        self.rows += len(chunk)
        if not self.whole and self.rows >= VALIDATION_ROWS:
            self.flush()

    def flush(self) -> None:
        frames = {rel: pd.concat(chunks, ignore_index=True) if len(chunks) > 1 else chunks[0]
                  for rel, chunks in self.pending.items()}
        frames |= {rel: frame for rel, frame in self.empty.items() if self.offset[rel] == 0 and rel not in frames}
        if not frames:
            return
        error = validate_outputs(frames, self.plan_record).error
        if error is not None:
            raise self._located(error)
        for rel, frame in frames.items():
            self.offset[rel] += len(frame)
        self.pending, self.rows = {}, 0

    def finish(self) -> None:
        self.flush()

    def _located(self, error: InputError) -> InputError:
        """The error with its row counted from the start of its table (not of the batch)."""
        if error.file is None or error.row is None or error.row < 2:
            return error
        where = [f"file {error.file}", f"row {error.row}"] + ([f"column {error.column}"] if error.column else [])
        message = str(error).removeprefix(", ".join(where) + ": ")
        return InputError(message, file=error.file, row=error.row + self.offset.get(error.file, 0),
                          column=error.column)


class _TableSink:
    """One release table written as its chunks arrive: pipe-delimited text (header once) or Parquet row groups,
    into a streaming put that publishes the file only when it is complete."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.writer = writer
        self.parquet: pq.ParquetWriter | None = None
        self.first = True

    def write(self, chunk: pd.DataFrame) -> None:
        if self.writer.key.endswith(".parquet"):
            table = pa.Table.from_pandas(chunk, preserve_index=False)
            if self.parquet is None:
                self.parquet = pq.ParquetWriter(self.writer, table.schema)
            self.parquet.write_table(table)
        else:
            self.writer.write(pipe_text(chunk, header=self.first))
        self.first = False

    def close(self) -> None:
        if self.parquet is not None:
            self.parquet.close()
        self.writer.close()


def write_product_tables(ctx: RunContext, product: str, estimates: Mapping[str, pd.DataFrame],
                         plan_record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Write a product's release tables under ``release/{product}/`` from its estimates, chunk by chunk where the
    product streams them (``table_chunks``: TopDown, one state at a time) and else table by table; each file
    is hashed while it is written and published only once all of the product's tables passed output
    validation (nothing of a product that fails validation is published). Returns key -> sha256, bytes."""
    plugin = ctx.plugin(product)
    obj = plugin.product(ctx.product_config(product))
    streamed = getattr(obj, "table_chunks", None)
    chunks: Iterator[tuple[str, pd.DataFrame]] = streamed(estimates) if callable(streamed) else \
        iter(sorted(obj.tables(dict(estimates)).items()))
    checks = _OutputChecks(plan_record, whole=overrides(plugin, "check_outputs"))
    post = ctx.post_store()
    sinks: dict[str, _TableSink] = {}
    try:
        for name, chunk in chunks:
            rel = f"{product}/{plugin.file_name(name, ctx.config.universe)}"
            if rel not in sinks:
                sinks[rel] = _TableSink(post.writer(f"{ctx.root}/release/{rel}"))
            checks.add(rel, chunk)
            sinks[rel].write(chunk)
        checks.finish()
    except BaseException:
        for sink in sinks.values():
            sink.writer.abort()
        raise
    out = {}
    for sink in sinks.values():
        sink.close()
        out[sink.writer.key] = {"sha256": sink.writer.sha256, "bytes": sink.writer.size}
    return out


#: the stage manifest of a product's release files (``manifests/tables/{product}.json``)
TABLES = "tables"


def product_release_files(ctx: RunContext, product: str) -> dict[str, Any]:
    """A product's part of the release stage, ready to run as soon as its post-processing is done (in its own
    lane, beside the other products): its release tables, output-validated as they are written, and its derived
    files, under ``release/{product}/``. Recorded in the stage manifest ``tables/{product}``, whose inputs are
    the post-processed estimates' hashes; a current record (same estimates, config and code, every file intact)
    is returned without writing anything. Before writing, the ledger's frozen chain is checked (plan binding,
    every commit against its plan entry), as the release stage does. Post-processing only: what is read are the
    stored estimates (checked against their manifest) and the frozen plan, through the view that cannot read
    ``confidential/``."""
    record = manifest_if_current(ctx, "postprocess", product, _measurement_hashes(ctx, product))
    if record is None:
        raise InputError(f"{product}: no current post-processed estimates; run postprocess first")
    inputs = {k: v["sha256"] for k, v in record["outputs"].items()}
    current = manifest_if_current(ctx, TABLES, product, inputs)
    if current is not None:
        return current
    meter = StageMeter.start()
    ctx.ledger.verify(deep=False)  # nothing is written under release/ before the frozen chain is checked
    # output validation as the tables are written: schemas, integer counts, VARIANCE as planned, no
    # confidential column, consistency where a product promises it (validation/outputs.py)
    out = write_product_tables(ctx, product, StoredEstimates(ctx.post_store(), record["outputs"]),
                               ctx.ledger.plan_record())
    out |= write_extra_files(ctx, product)
    faults.point(f"stage:{TABLES}:{product}:before-manifest")
    return write_manifest(ctx, TABLES, product, inputs, out, {"metrics": meter.read()})


def _finished_release(ctx: RunContext, upstream: Mapping[str, str], checked: Mapping[str, str]
                      ) -> dict[str, Any] | None:
    """The release's ``MANIFEST.json`` when the release is already finished from exactly these post-processed
    estimates and this ledger audit: the release stage's record is current (same estimates, config and code,
    the manifest intact), and every file under ``release/`` is one the manifest lists, with the bytes it
    lists. Anything else (a file edited, removed or added, a newer code version) is ``None``: the stage writes
    the release again. A resumed release that had finished thus redoes nothing (its accuracy report included).

    ``checked``: files whose bytes were hashed just now (the ledger audit, the product tables their records
    verified), by SHA-256; each must be listed with that hash, and is not read again."""
    record = manifest_if_current(ctx, "release", "all", upstream)
    if record is None:
        return None
    post = ctx.post_store()
    prefix = release_prefix(ctx)
    manifest: dict[str, Any] = json.loads(post.get(prefix + MANIFEST))
    files: Mapping[str, Mapping[str, Any]] = manifest.get("files", {})
    present = {k for k in post.list(prefix) if k not in (prefix + MANIFEST, prefix + PUBLICATION)}
    if present != set(files) or any(files.get(k, {}).get("sha256") != h for k, h in checked.items()):
        return None
    if any(post.sha256(k) != v.get("sha256") for k, v in files.items() if k not in checked):
        return None
    return manifest


def release_stage(ctx: RunContext) -> dict[str, Any]:
    """Every product's release files (:func:`product_release_files`: already written by each product's lane
    in a flow, written here otherwise, or again where one no longer matches its record) and the ledger audit,
    then the privacy certificate, the accuracy report, and the validated release manifest (last). Its metrics
    go to the stage manifest under ``manifests/``, never into ``release/``.

    Memory: one product's tables are produced from its stored estimates (read on demand, TopDown's blocks one
    state at a time) and streamed into the store with their output validation; nothing holds every table.
    A release already finished from the same estimates (:func:`_finished_release`) is returned as it is."""
    meter = StageMeter.start()
    post = ctx.post_store()
    ctx.ledger.verify(deep=False)  # the NMFs themselves are verified as post-processing loads them
    upstream: dict[str, str] = {}
    tables: dict[str, str] = {}  # every product table, as its record was just verified (or written)
    for p in ctx.config.products:
        record = product_release_files(ctx, p.name)
        upstream.update(record["inputs"])
        tables.update({k: v["sha256"] for k, v in record["outputs"].items()})
    audit_key = f"{ctx.root}/release/ledger.csv"
    audit = ledger_csv(ctx).encode()
    finished = _finished_release(ctx, upstream, tables | {audit_key: sha256_bytes(audit)})
    if finished is not None:
        return finished
    post.put(audit_key, audit)
    faults.point("stage:release:before-manifest")
    # certificate (md + html), accuracy report, then output validation and MANIFEST.json last
    manifest = finalize_release(ctx)
    key = f"{ctx.root}/release/MANIFEST.json"
    write_manifest(ctx, "release", "all", upstream, {key: {"sha256": post.sha256(key)}}, {"metrics": meter.read()})
    return manifest
