"""The accuracy report of a release: a self-contained HTML page with its plots embedded as base64 (SVG charts; a
test release's observed-error plots as matplotlib PNGs).

Contents:

* **Analytic MOE of the noisy measurements** (every release): per product and level, the 90 % and 95 % MOE of
  the noise added to each measured cell — not the error of the published, post-processed tables — from the
  frozen plan alone (``accounting.dgauss_moe_exact`` /
  ``geometric_moe_exact``: exact summation of the discrete noise distribution). Data-independent, so it is
  safe to publish with a production release.
* **Observed error** (test releases only): released counts against the ground-truth twin of each product,
  by population size (the true count of the cell), with the share of cells within the noise's 90 % MOE where
  a VARIANCE is published, and a product's published estimates (``estimates/``: ESTIMATE and a 90 % credible
interval) against the truth. Ground truth comes from the confidential inputs (:func:`truth_frames`), so it is
  computed **only in test mode**: the report of a production release contains expected MOEs and the
  consistency diagnostics only, never anything derived from confidential data.
* **Error of the published tables, measured by an accuracy experiment** (every release, where one is recorded
  for the release's method): the metrics of ``dasflow experiment`` (repeated seeded runs on synthetic inputs,
  :mod:`dasflow.experiment`) found in the store under ``experiments/{method_sha256}/``. Computed from
  synthetic inputs only, so a production release may show them; without one the report says the published
  tables' error is not measured.
* **Consistency diagnostics** (every release): for hierarchical products (their plugin's ``consistency``; group
  sizes: nation ⊇ states ⊇ counties per household size, and the nation total against the public invariant n;
  TopDown: each standard geolevel against the sum of its children) — the number of cells whose released value
  differs from the sum of the released values below it. These use released values and public inputs only.

Products are reached only through their plugins (``dasflow.registry``): ``truth``, ``zero_filled``,
``consistency``; plots are in :mod:`dasflow.release.accuracy_plots`.
"""


from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dasflow.errors import DasflowError
from dasflow.io.store import ObjectStore
from dasflow.pipeline.run import RunContext
from dasflow.privacy import accounting
from dasflow.products.plugin import overrides
from dasflow.products.reporting import hierarchy_check
from dasflow.registry import get_plugin
from dasflow.release.accuracy_plots import (
    SIZE_LABELS,
    SVG,
    plot_consistency,
    plot_error_by_size,
    plot_moes,
    plot_scatter,
)
from dasflow.release.certificate import TEST_BANNER
from dasflow.release.document import Block, Bullets, Heading, Image, Para, Table, to_html
from dasflow.release.experiments import method_sha256, recorded

__all__ = ["ESTIMATES", "NON_KEY", "SIZE_BINS", "SIZE_LABELS", "Z90", "LazyTruth", "ReleaseFiles", "TruthFrames",
           "TruthRefused", "accuracy_blocks", "accuracy_report", "compare", "consistency", "error_by_size",
           "estimate_checks", "expected_moes", "experiment_blocks", "hierarchy_check", "observed_errors",
           "release_files", "release_frames", "truth_frames"]

#: product -> release file (relative to ``release/{product}/``) -> frame with the file's key columns + COUNT
TruthFrames = Mapping[str, Mapping[str, pd.DataFrame]]
NON_KEY = ("COUNT", "NOISE_DISTRIBUTION", "VARIANCE", "ESTIMATE", "NOISY")
SIZE_BINS = (0, 1, 10, 100, 1_000, 10_000)
Z90 = 1.6448536269514722  # two-sided 90 % normal quantile (for published-variance MOEs)
#: where a product publishes derived estimates (``extra_release_files``, relative to ``release/{product}/``):
#: not tables of counts, so not compared as such; :func:`estimate_checks` compares them with the truth
ESTIMATES = "estimates/"


class TruthRefused(DasflowError):
    """Ground truth requested for a production release."""


# --------------------------------------------------------------------------------------------- expected MOE
def expected_moes(ctx: RunContext) -> pd.DataFrame:
    """Per planned key: the 90 % and 95 % MOE of one noisy cell (exact, from the plan only)."""
    rows = []
    for e in ctx.ledger.plan_record()["entries"]:
        noise = Fraction(e["noise"])
        moes = []
        for conf in (Fraction(9, 10), Fraction(19, 20)):
            if noise == 0:
                moes.append(0)
            elif e["privacy_defn"] == "puredp":
                moes.append(accounting.geometric_moe_exact(noise, conf))
            else:
                moes.append(accounting.dgauss_moe_exact(noise, conf))
        rows.append({"product": e["product"], "key": e["key"], "level": e["level"], "mechanism": e["mechanism"],
                     "noise": e["noise"], "cells": int(e["cells"]), "moe90": moes[0], "moe95": moes[1]})
    return pd.DataFrame(rows, columns=["product", "key", "level", "mechanism", "noise", "cells", "moe90",
                                       "moe95"])


# ------------------------------------------------------------------------------------------ release frames
def _read_release_file(store: ObjectStore, key: str) -> pd.DataFrame:
    with store.reader(key) as fh:
        if key.endswith(".parquet"):
            return pd.read_parquet(fh)
        return pd.read_csv(fh, sep="|", dtype=str, keep_default_na=False)


#: rows per Arrow table when a release file is streamed (:meth:`ReleaseFiles.text_tables`)
TEXT_TABLE_ROWS = 1 << 20


def _text_schema(names: list[str]) -> pa.Schema:
    return pa.schema([(n, pa.string()) for n in names])


class ReleaseFiles(Mapping[str, pd.DataFrame]):
    """One product's tabular release files (``.csv`` pipe-delimited, ``.parquet``; not ``estimates/``) by
    relative path, each read from the store when it is accessed and not kept: a report step holds the files it
    is looking at, never the whole release."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self._store = store
        self._prefix = prefix
        self._rels = [k[len(prefix):] for k in store.list(prefix)
                      if not k[len(prefix):].startswith(ESTIMATES) and k.endswith((".parquet", ".csv"))]

    def __getitem__(self, rel: str) -> pd.DataFrame:
        if rel not in self._rels:
            raise KeyError(rel)
        return _read_release_file(self._store, self._prefix + rel)

    def __contains__(self, rel: object) -> bool:
        return rel in self._rels

    def text_tables(self, rel: str, rows: int = TEXT_TABLE_ROWS) -> Iterator[pa.Table]:
        """The file as Arrow tables of at most about ``rows`` rows, every column as text (the values
        ``__getitem__`` gives; no Python object per cell): at least one table, one held at a time."""
        if rel not in self._rels:
            raise KeyError(rel)
        with self._store.reader(self._prefix + rel) as fh:
            if rel.endswith(".parquet"):
                f = pq.ParquetFile(fh)
                yield f.schema_arrow.empty_table().cast(_text_schema(f.schema_arrow.names))
                for batch in f.iter_batches(batch_size=rows):
                    yield pa.Table.from_batches([batch]).cast(_text_schema(batch.schema.names))
                return
            names = fh.readline().decode("utf-8").rstrip("\r\n").split("|")
            fh.seek(0)
            reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(block_size=8 << 20),
                                    parse_options=pacsv.ParseOptions(delimiter="|"),
                                    convert_options=pacsv.ConvertOptions(
                                        column_types=_text_schema(names), strings_can_be_null=False,
                                        quoted_strings_can_be_null=False))
            yield _text_schema(names).empty_table()
            for batch in reader:  # over batches of ~8 MB, not rows
                yield pa.Table.from_batches([batch])

    def __iter__(self) -> Iterator[str]:
        return iter(self._rels)

    def __len__(self) -> int:
        return len(self._rels)


def release_files(ctx: RunContext) -> dict[str, ReleaseFiles]:
    """Every product's release files as :class:`ReleaseFiles` (read on access), for products that have any."""
    store = ctx.post_store()
    out = {p.name: ReleaseFiles(store, f"{ctx.root}/release/{p.name}/") for p in ctx.config.products}
    return {name: files for name, files in out.items() if len(files)}


def release_frames(ctx: RunContext) -> dict[str, dict[str, pd.DataFrame]]:
    """Every tabular release file (``.csv`` pipe-delimited, ``.parquet``) per product, by relative path, all in
    memory (small releases and tests; the report itself uses :func:`release_files`)."""
    return {name: dict(files) for name, files in release_files(ctx).items()}


# ------------------------------------------------------------------------------------------ observed error
def _key_columns(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    return [c for c in a.columns if c in b.columns and c not in NON_KEY]


def _text_codes(column: pd.Series) -> tuple[np.ndarray, pd.Index] | None:
    """``column.astype(str)`` as (int64 codes, distinct texts), the text computed once per distinct value (a
    categorical's categories, else the factorized values), values with the same text sharing a code; None if
    the column holds a null."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        raw, values = column.cat.codes.to_numpy(np.int64), pd.Series(column.cat.categories)
    else:
        raw, uniques = pd.factorize(column)
        values = pd.Series(uniques)
    if raw.size and int(raw.min()) < 0:
        return None
    code, texts = pd.factorize(values.astype(str))
    return np.asarray(code, dtype=np.int64)[raw], pd.Index(texts)


def _inner_rows(left: pd.DataFrame, right: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows of ``left.merge(right, on=keys, how="inner")`` with key columns compared as text, as (left rows,
    right rows) in the merge's order (left order), when ``right``'s keys are unique and not null; None otherwise
    (or when the mixed-radix key would overflow). Only the distinct values of ``right``'s columns are turned
    into text, so a large truth twin against a small release costs integer work per row."""
    lkey = np.zeros(len(left), dtype=np.int64)
    rkey = np.zeros(len(right), dtype=np.int64)
    found = np.ones(len(left), dtype=bool)
    span = 1
    for c in keys:
        coded = _text_codes(right[c])
        if coded is None:
            return None
        rc, texts = coded
        lc = texts.get_indexer(pd.Index(left[c].astype(str)))
        found &= lc >= 0
        n = max(len(texts), 1)
        if span > (2**62) // n:
            return None
        span *= n
        lkey = lkey * n + np.maximum(lc, 0)
        rkey = rkey * n + rc
    order = np.argsort(rkey, kind="stable")
    ranked = rkey[order]
    if ranked.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if bool((ranked[1:] == ranked[:-1]).any()):
        return None
    pos = np.minimum(np.searchsorted(ranked, lkey), ranked.size - 1)
    rows = np.flatnonzero(found & (ranked[pos] == lkey))
    return rows, order[pos[rows]]


def compare(released: pd.DataFrame, truth: pd.DataFrame, zero_fill: bool = False) -> pd.DataFrame:
    """Released vs true count per cell (inner join on the shared key columns; with ``zero_fill``, for files
    that omit zero cells (a plugin's ``zero_filled``), an outer join with an absent cell counted as 0): TRUE, RELEASED,
    ERROR, MOE90 (from VARIANCE when published, else NaN), LEVEL (the geography level: REGION_TYPE, or "all").
    Key columns are compared as text. The released value is the file's COUNT column, or ESTIMATE for products
    that publish estimates under that name. A one-cell file without key columns (a total) is compared with a
    one-row truth. An inner join on a truth with unique keys is done on integer codes (:func:`_inner_rows`:
    same rows, same order as the merge)."""
    keys = _key_columns(released, truth)
    if not keys and not (len(released) == len(truth) == 1):
        raise ValueError("release and truth frames share no key column")
    value = "COUNT" if "COUNT" in released.columns else "ESTIMATE"
    if value not in released.columns:
        raise ValueError("release frame has neither COUNT nor ESTIMATE")
    pairs = _inner_rows(released, truth, keys) if keys and not zero_fill else None
    if pairs is not None:
        merged = released.iloc[pairs[0]].reset_index(drop=True).rename(columns={value: "_RELEASED"})
        merged["_RELEASED"] = pd.to_numeric(merged["_RELEASED"])
        merged["_TRUE"] = pd.to_numeric(truth["COUNT"].iloc[pairs[1]]).to_numpy()
    else:
        left = released.copy()
        right = truth.copy()
        for c in keys:
            left[c] = left[c].astype(str)
            right[c] = right[c].astype(str)
        left = left.rename(columns={value: "_RELEASED"})
        left["_RELEASED"] = pd.to_numeric(left["_RELEASED"])  # release files are read as text: 0-fill numbers
        right = right[[*keys, "COUNT"]].rename(columns={"COUNT": "_TRUE"})
        right["_TRUE"] = pd.to_numeric(right["_TRUE"])
        if not keys:
            merged = left.merge(right, how="cross")
        else:
            merged = left.merge(right, on=keys, how="outer" if zero_fill else "inner")
            if zero_fill:
                merged = merged.fillna({"_TRUE": 0, "_RELEASED": 0})
    out = pd.DataFrame({
        "TRUE": pd.to_numeric(merged["_TRUE"]).to_numpy(np.float64),
        "RELEASED": pd.to_numeric(merged["_RELEASED"]).to_numpy(np.float64),
    })
    out["ERROR"] = out["RELEASED"] - out["TRUE"]
    out["MOE90"] = (Z90 * np.sqrt(pd.to_numeric(merged["VARIANCE"]).to_numpy(np.float64))
                    if "VARIANCE" in merged.columns else np.nan)
    out["LEVEL"] = merged["REGION_TYPE"].astype(str).to_numpy() if "REGION_TYPE" in merged.columns else "all"
    return out


def error_by_size(cells: pd.DataFrame) -> pd.DataFrame:
    """Per population-size bin of the true count: cells, mean error, RMSE, mean |error|, 90th percentile of
    |error|, and the share of cells with |error| <= the noise's 90 % MOE (where published)."""
    bins = np.digitize(cells["TRUE"].to_numpy(np.float64), SIZE_BINS[1:])
    rows = []
    for b, label in enumerate(SIZE_LABELS):
        part = cells[bins == b]
        if part.empty:
            continue
        err = part["ERROR"].to_numpy(np.float64)
        moe = part["MOE90"].to_numpy(np.float64)
        cover = float(np.mean(np.abs(err) <= moe)) if np.isfinite(moe).all() else np.nan
        rows.append({"size": label, "cells": len(part), "mean_error": float(err.mean()),
                     "rmse": float(np.sqrt(np.mean(err * err))), "mae": float(np.mean(np.abs(err))),
                     "p90_abs": float(np.quantile(np.abs(err), 0.9)), "within_moe90": cover})
    return pd.DataFrame(rows, columns=["size", "cells", "mean_error", "rmse", "mae", "p90_abs", "within_moe90"])


def observed_errors(release: Mapping[str, Mapping[str, pd.DataFrame]],
                    truth: TruthFrames) -> dict[tuple[str, str], pd.DataFrame]:
    """(product, file) -> per-cell comparison, for every release file that has a truth frame."""
    out: dict[tuple[str, str], pd.DataFrame] = {}
    for product, files in truth.items():
        for rel, frame in files.items():
            if rel in release.get(product, {}):
                zero_fill = get_plugin(product).zero_filled
                out[(product, rel)] = compare(release[product][rel], frame, zero_fill=zero_fill)
    return out




def estimate_checks(ctx: RunContext, product: str, truth: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Test mode: a product's published estimates (``release/{product}/estimates/``, files with ESTIMATE,
    LOWER_90, UPPER_90 and the published COUNT, named as the release file they estimate) against the ground
    truth, per file and for true zeros vs positive counts: RMSE of the published noisy count and of the
    posterior mean, mean error of the posterior mean, and the share of true counts inside [LOWER_90, UPPER_90].
    Empty for a product that publishes no estimates."""
    cols = ["file", "true count", "cells", "rmse_noisy", "rmse_estimate", "bias_estimate", "interval_coverage"]
    rows: list[dict[str, Any]] = []
    store = ctx.post_store()
    prefix = f"{ctx.root}/release/{product}/{ESTIMATES}"
    for rel, frame in truth.items():
        if not store.exists(prefix + rel):
            continue
        est = pd.read_csv(io.BytesIO(store.get(prefix + rel)), sep="|", dtype=str, keep_default_na=False)
        keys = _key_columns(est, frame)
        if not keys or not {"ESTIMATE", "LOWER_90", "UPPER_90", "COUNT"} <= set(est.columns):
            continue
        right = frame[[*keys, "COUNT"]].astype({k: str for k in keys}).rename(columns={"COUNT": "_TRUE"})
        merged = est.merge(right, on=keys, how="inner")
        true = pd.to_numeric(merged["_TRUE"]).to_numpy(np.float64)
        values = {c: pd.to_numeric(merged[c]).to_numpy(np.float64)
                  for c in ("COUNT", "ESTIMATE", "LOWER_90", "UPPER_90")}
        for label, mask in (("0", true == 0), ("> 0", true > 0)):
            if not mask.any():
                continue
            t = true[mask]
            rows.append({
                "file": rel, "true count": label, "cells": int(mask.sum()),
                "rmse_noisy": float(np.sqrt(np.mean((values["COUNT"][mask] - t) ** 2))),
                "rmse_estimate": float(np.sqrt(np.mean((values["ESTIMATE"][mask] - t) ** 2))),
                "bias_estimate": float(np.mean(values["ESTIMATE"][mask] - t)),
                "interval_coverage": float(np.mean((values["LOWER_90"][mask] <= t) & (t <= values["UPPER_90"][mask]))),
            })
    return pd.DataFrame(rows, columns=cols)



# -------------------------------------------------------------------------------------------- consistency
def consistency(ctx: RunContext, release: Mapping[str, Mapping[str, pd.DataFrame]]) -> pd.DataFrame:
    """Every released product's consistency diagnostics (its plugin's ``consistency``: released values and
    public inputs, read through the post-processing view; public inputs that cannot be read are passed as
    none, and the product omits the checks that need them)."""
    rows: list[dict[str, Any]] = []
    for name, files in release.items():
        plugin = ctx.plugin(name)
        if not overrides(plugin, "consistency"):
            continue
        try:
            public: Mapping[str, Any] = ctx.post_public(name)
        except DasflowError:
            public = {}
        rows += [r | {"product": name} for r in plugin.consistency(files, public, ctx.product_config(name))]
    return pd.DataFrame(rows, columns=["product", "check", "cells", "inconsistent", "max_abs_diff"])


# -------------------------------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return "—" if x != x else f"{x:,.2f}"


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in r.items()} for r in frame.to_dict("records")]


def _cells(record: Mapping[str, Any], *cols: str) -> tuple[str, ...]:
    return tuple(str(record[c]) for c in cols)


def _share(record: Mapping[str, Any]) -> str:
    x = float(record["within_moe90"])
    return "—" if x != x else f"{x:.1%}"


def _thinned(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the scatter plot draws (``plot_scatter``'s deterministic thinning to ≈ 5,000 points; thinning
    the result again is the identity, so the plot is the same)."""
    return frame.iloc[::max(1, len(frame) // 5000)][["TRUE", "ERROR"]]


def _observed(ctx: RunContext, release: Mapping[str, Mapping[str, pd.DataFrame]], truth: TruthFrames
              ) -> tuple[dict[tuple[str, str], pd.DataFrame], dict[tuple[str, str], pd.DataFrame],
                         dict[tuple[str, str, str], pd.DataFrame], dict[str, pd.DataFrame]]:
    """:func:`observed_errors` and its summaries one product and one file at a time (the comparison of a file
    is dropped once summarised): the scatter plot's thinned cells, error by size, error by size per level, and
    each product's :func:`estimate_checks`."""
    cells: dict[tuple[str, str], pd.DataFrame] = {}
    by_size: dict[tuple[str, str], pd.DataFrame] = {}
    by_level: dict[tuple[str, str, str], pd.DataFrame] = {}
    checks: dict[str, pd.DataFrame] = {}
    for product, files in truth.items():  # a lazy truth computes one product's twin at a time
        released = release.get(product, {})
        zero_fill = get_plugin(product).zero_filled
        for rel, frame in files.items():
            if rel not in released:
                continue
            compared = compare(released[rel], frame, zero_fill=zero_fill)
            cells[(product, rel)] = _thinned(compared)
            by_size[(product, rel)] = error_by_size(compared)
            by_level |= {(product, rel, str(lv)): error_by_size(part)
                         for lv, part in compared.groupby("LEVEL", sort=False)}
        checks[product] = estimate_checks(ctx, product, files)
    return cells, by_size, by_level, checks


def accuracy_blocks(ctx: RunContext, truth: TruthFrames | None) -> list[Block]:
    if truth is not None and not ctx.config.is_test:
        raise TruthRefused("ground truth is only ever used for a test release's accuracy report")
    blocks: list[Block] = [Heading(f"Accuracy report: release `{ctx.release_id}`", 1)]
    blocks.append(Bullets((
        f"universe: {ctx.config.universe}; products: {', '.join(p.name for p in ctx.config.products)}",
        ("analytic MOE of the noisy measurements: from the frozen plan only (no data); it is the error of the "
         "raw noisy measurements, not of the published tables, which post-processing changes"),
        ("observed error of the published tables: TEST release, against the ground-truth twin of each "
         "product (computed from the confidential inputs, test mode only)") if truth is not None else
        ("observed error of this run's published tables: not shown — a production release's report contains "
         "expected MOEs and consistency diagnostics only (plus an accuracy experiment's figures, computed on "
         "synthetic inputs, where one is recorded for its method)"),
    )))
    moes = expected_moes(ctx)
    blocks.append(Heading("Analytic margin of error of the noisy measurements, per product and level"))
    blocks.append(Para("These MOEs describe the noise of one raw noisy measurement. The published tables are "
                       "post-processed (consistency, non-negativity, thresholds, truncation), so their error "
                       "can be larger or smaller: it is shown under 'observed error' (test releases) and "
                       "'measured by repeated runs' (an accuracy experiment)."))
    blocks.append(Image(plot_moes(moes), "Expected 90 % MOE of one noisy cell, per product and level", SVG))
    per_level = moes.groupby(["product", "level", "mechanism"], sort=False).agg(
        keys=("key", "size"), cells=("cells", "sum"), moe90_min=("moe90", "min"), moe90_max=("moe90", "max"),
        moe95_max=("moe95", "max")).reset_index()
    blocks.append(Table(("product", "level", "mechanism", "keys", "cells", "90 % MOE (min–max)",
                         "95 % MOE (max)"),
                        tuple((*_cells(r, "product", "level", "mechanism", "keys", "cells"),
                               f"{r['moe90_min']}–{r['moe90_max']}", str(r["moe95_max"]))
                              for r in _records(per_level))))
    release = release_files(ctx)
    if truth is not None:
        cells, by_size, by_level, checks = _observed(ctx, release, truth)
        blocks.append(Heading("Observed error against the ground truth of the published tables (this run), by "
                              "population size"))
        if by_size:
            blocks.append(Image(plot_error_by_size(by_size), "RMSE of released counts by true cell size"))
            for product in dict.fromkeys(p for p, _ in cells):
                blocks.append(Image(plot_scatter(cells, product), f"{product}: released − true vs true count"))
            blocks.append(Table(
                ("product", "file", "level", "size", "cells", "mean error", "RMSE", "mean |error|",
                 "90th pct |error|", "within 90 % MOE"),
                tuple((p, rel, lv, *_cells(r, "size", "cells"),
                       *(_fmt(float(r[c])) for c in ("mean_error", "rmse", "mae", "p90_abs")), _share(r))
                      for (p, rel, lv), t in by_level.items() for r in _records(t))))
            blocks.append(Para("Observed errors include every error source of the released value (noise, "
                               "post-processing, and for PHSafe the truncation bias against the untruncated "
                               "ground truth); the MOE covers noise only."))
        else:
            blocks.append(Para("no release file has a ground-truth frame"))
        for product, product_checks in checks.items():
            if product_checks.empty:
                continue
            blocks.append(Heading(f"{ctx.plugin(product).title} statistical post-processing against the ground "
                                  "truth"))
            blocks.append(Table(
                ("file", "true count", "cells", "RMSE noisy count", "RMSE estimate", "mean error of estimate",
                 "true count inside 90 % interval"),
                tuple((*_cells(r, "file", "true count", "cells"),
                       *(_fmt(float(r[c])) for c in ("rmse_noisy", "rmse_estimate", "bias_estimate")),
                       f"{float(r['interval_coverage']):.1%}") for r in _records(product_checks))))
            blocks.append(Para("The credible intervals come from a flat prior on non-negative counts: their lower "
                               "end is always above 0, so a true zero is never inside. For counts large relative "
                               "to the noise the share inside is near 90 %; for counts small relative to the "
                               "noise (every cell of a small demo) it is far lower, because the flat prior on "
                               "[0, ∞) puts most posterior mass above small true counts."))
    blocks += experiment_blocks(ctx)
    diag = consistency(ctx, release)
    blocks.append(Heading("Consistency diagnostics (group sizes, TopDown)"))
    if diag.empty:
        blocks.append(Para("no hierarchical product (group sizes, TopDown) in this release"))
    else:
        blocks.append(Image(plot_consistency(diag), "Share of cells inconsistent with their children", SVG))
        blocks.append(Table(("product", "check", "cells", "inconsistent", "max |difference|"),
                            tuple((*_cells(r, "product", "check", "cells", "inconsistent"),
                                   _fmt(float(r["max_abs_diff"]))) for r in _records(diag))))
    return blocks


def experiment_blocks(ctx: RunContext) -> list[Block]:
    """The published tables' error from the accuracy experiment recorded for this release's method (same
    universe and product configs), or a statement that none was run. The experiment ran on synthetic inputs
    only (it refuses others), so nothing here is derived from this release's confidential inputs."""
    method = method_sha256(ctx.config)
    found = recorded(ctx.post_store(), method)
    blocks: list[Block] = [Heading("Error of the published tables, measured by repeated runs (accuracy "
                                   "experiment)")]
    if found is None:
        blocks.append(Para(f"Not measured: no accuracy experiment is recorded for this method (sha256 {method}). "
                           "Run `dasflow experiment CONFIG --runs 20 --out DIR` with the same product configs on "
                           "synthetic inputs; its figures then appear here."))
        return blocks
    meta, table = found
    same = "this exact config" if meta.get("config_sha256") == ctx.config_sha256 else \
        "the same product configs on synthetic inputs"
    blocks.append(Bullets((
        f"{meta.get('runs')} seeded runs per budget scale (seed {meta.get('seed')}) of {same}; inputs: "
        f"{meta.get('inputs')}",
        "error = published value − true value, after post-processing; within 90 % MOE = share of published cells "
        "within the MOE stated for them (— where none is stated)",
    )))
    rows = table[(table["pop_bin"] == "all") & (table["budget_scale"] == 1.0)]
    blocks.append(Table(
        ("product", "file", "level", "cells", "MAE", "RMSE", "bias", "within 90 % MOE", "90th pct |error|"),
        tuple((*_cells(r, "product", "table", "geolevel", "cells"),
               *(_fmt(float(r[c])) for c in ("mae", "rmse", "bias")),
               "—" if float(r["within_moe"]) != float(r["within_moe"]) else f"{float(r['within_moe']):.1%}",
               _fmt(float(r["q90_abs_error"]))) for r in _records(rows))))
    blocks.append(Para("By population size and budget scale: the experiment's metrics.csv and report.html under "
                       f"experiments/{method}/ in the store."))
    return blocks


def accuracy_report(ctx: RunContext, truth: TruthFrames | None = None) -> str:
    """The accuracy report as a self-contained HTML page (``truth`` only for test releases, else refused)."""
    blocks = accuracy_blocks(ctx, truth)
    return to_html(blocks, f"Accuracy report: {ctx.release_id}",
                   banner=TEST_BANNER if ctx.config.is_test else None)


# -------------------------------------------------------------------------------------------- ground truth
def _truth(ctx: RunContext, product: str) -> dict[str, pd.DataFrame] | None:
    """The product's ground-truth twin, its public inputs read as frozen with the plan (test releases only)."""
    return ctx.plugin(product).truth(ctx.public_store(ctx.store), ctx.config.inputs, ctx.product_config(product),
                                     ctx.config.universe, public=ctx.post_public(product))


class LazyTruth(Mapping[str, Mapping[str, pd.DataFrame]]):
    """Ground-truth frames per product, each product's computed when it is accessed and not kept (the report
    holds one product's twin at a time) — TEST releases only (:func:`truth_frames`)."""

    def __init__(self, ctx: RunContext) -> None:
        if not ctx.config.is_test:
            raise TruthRefused(f"release {ctx.release_id} is a production release: ground truth is never "
                               "computed for it (its accuracy report shows expected MOEs only)")
        self._ctx = ctx
        self._products = [p.name for p in ctx.config.products if overrides(ctx.plugin(p.name), "truth")]

    def __getitem__(self, product: str) -> Mapping[str, pd.DataFrame]:
        if product not in self._products:
            raise KeyError(product)
        ctx = self._ctx
        frames = _truth(ctx, product)
        return {} if frames is None else frames

    def __iter__(self) -> Iterator[str]:
        return iter(self._products)

    def __len__(self) -> int:
        return len(self._products)


def truth_frames(ctx: RunContext) -> dict[str, dict[str, pd.DataFrame]]:
    """Ground-truth frames of every product whose plugin has a twin (``truth``) — TEST releases only.

    Reads the confidential inputs (it is the only release-stage function that does), so it refuses a
    production release (:class:`TruthRefused`): a production accuracy report never contains anything
    computed from confidential data.
    """
    if not ctx.config.is_test:
        raise TruthRefused(f"release {ctx.release_id} is a production release: ground truth is never computed "
                           "for it (its accuracy report shows expected MOEs only)")
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for p in ctx.config.products:
        frames = _truth(ctx, p.name)
        if frames is not None:
            out[p.name] = frames
    return out
