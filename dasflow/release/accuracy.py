"""The accuracy report of a release: a self-contained HTML page with matplotlib plots embedded as base64 PNG.

Contents:

* **Analytic MOE of the noisy measurements** (every release): per product and level, the 90 % and 95 % MOE of
  the noise added to each measured cell — not the error of the published, post-processed tables — from the
  frozen plan alone (``accounting.dgauss_moe_exact`` /
  ``geometric_moe_exact``: exact summation of the discrete noise distribution). Data-independent, so it is
  safe to publish with a production release.
* **Observed error** (test releases only): released counts against the ground-truth twin of each product,
  by population size (the true count of the cell), with the share of cells within the noise's 90 % MOE where
  a VARIANCE is published. Ground truth comes from the confidential inputs (:func:`truth_frames`), so it is
  computed **only in test mode**: the report of a production release contains expected MOEs and the
  consistency diagnostics only, never anything derived from confidential data.
* **Error of the published tables, measured by an accuracy experiment** (every release, where one is recorded
  for the release's method): the metrics of ``dasflow experiment`` (repeated seeded runs on synthetic inputs,
  :mod:`dasflow.experiment`) found in the store under ``experiments/{method_sha256}/``. Computed from
  synthetic inputs only, so a production release may show them; without one the report says the published
  tables' error is not measured.
* **Consistency diagnostics** (every release): for hierarchical products — group sizes (nation ⊇ states ⊇
  counties per household size, and the nation total against the public invariant n) and TopDown (each
  standard geolevel against the sum of its children) — the number of cells whose released value differs from
  the sum of the released values below it. These use released values only.
"""

from __future__ import annotations

import base64
import io
import itertools
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import DasflowError
from dasflow.pipeline.run import RunContext
from dasflow.privacy import accounting
from dasflow.release.certificate import TEST_BANNER
from dasflow.release.document import Block, Bullets, Heading, Image, Para, Table, to_html

#: product -> release file (relative to ``release/{product}/``) -> frame with the file's key columns + COUNT
TruthFrames = Mapping[str, Mapping[str, pd.DataFrame]]
TruthFn = Callable[[RunContext], dict[str, pd.DataFrame]]
NON_KEY = ("COUNT", "NOISE_DISTRIBUTION", "VARIANCE", "ESTIMATE", "NOISY")
SIZE_BINS = (0, 1, 10, 100, 1_000, 10_000)
SIZE_LABELS = ("0", "1–9", "10–99", "100–999", "1,000–9,999", "10,000+")
Z90 = 1.6448536269514722  # two-sided 90 % normal quantile (for published-variance MOEs)
#: products whose release files list only nonzero cells (an absent cell is published as 0): TopDown
ZERO_FILLED = frozenset({"topdown"})


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
def release_frames(ctx: RunContext) -> dict[str, dict[str, pd.DataFrame]]:
    """Every tabular release file (``.csv`` pipe-delimited, ``.parquet``) per product, by relative path."""
    store = ctx.post_store()
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for p in ctx.config.products:
        prefix = f"{ctx.root}/release/{p.name}/"
        for key in store.list(prefix):
            rel = key[len(prefix):]
            if rel.startswith("estimates/"):
                continue
            if rel.endswith(".parquet"):
                frame = pd.read_parquet(io.BytesIO(store.get(key)))
            elif rel.endswith(".csv"):
                frame = pd.read_csv(io.BytesIO(store.get(key)), sep="|", dtype=str, keep_default_na=False)
            else:
                continue
            out.setdefault(p.name, {})[rel] = frame
    return out


# ------------------------------------------------------------------------------------------ observed error
def _key_columns(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    return [c for c in a.columns if c in b.columns and c not in NON_KEY]


def compare(released: pd.DataFrame, truth: pd.DataFrame, zero_fill: bool = False) -> pd.DataFrame:
    """Released vs true count per cell (inner join on the shared key columns; with ``zero_fill``, for files
    that omit zero cells (``ZERO_FILLED``), an outer join with an absent cell counted as 0): TRUE, RELEASED,
    ERROR, MOE90 (from VARIANCE when published, else NaN), LEVEL (the geography level: REGION_TYPE, or "all").
    Key columns are compared as text. The released value is the file's COUNT column, or ESTIMATE for products
    that publish estimates under that name. A one-cell file without key columns (a total) is compared with a
    one-row truth."""
    keys = _key_columns(released, truth)
    if not keys and not (len(released) == len(truth) == 1):
        raise ValueError("release and truth frames share no key column")
    left = released.copy()
    right = truth.copy()
    for c in keys:
        left[c] = left[c].astype(str)
        right[c] = right[c].astype(str)
    value = "COUNT" if "COUNT" in left.columns else "ESTIMATE"
    if value not in left.columns:
        raise ValueError("release frame has neither COUNT nor ESTIMATE")
    left = left.rename(columns={value: "_RELEASED"})
    right = right[[*keys, "COUNT"]].rename(columns={"COUNT": "_TRUE"})
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
                out[(product, rel)] = compare(release[product][rel], frame, zero_fill=product in ZERO_FILLED)
    return out


def estimate_checks(ctx: RunContext, truth: TruthFrames) -> pd.DataFrame:
    """Test mode: PHSafe's count estimates (``release/phsafe/estimates/``) against the ground truth, per table
    and for true zeros vs positive counts: RMSE of the published noisy count and of the posterior mean, mean
    error of the posterior mean, and the share of true counts inside [LOWER_90, UPPER_90]."""
    cols = ["file", "true count", "cells", "rmse_noisy", "rmse_estimate", "bias_estimate", "interval_coverage"]
    rows: list[dict[str, Any]] = []
    store = ctx.post_store()
    prefix = f"{ctx.root}/release/phsafe/estimates/"
    for rel, frame in truth.get("phsafe", {}).items():
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
def hierarchy_check(parent: pd.DataFrame, child: pd.DataFrame, parent_keys: list[str],
                    child_parent: pd.DataFrame, attrs: list[str]) -> tuple[int, int, float]:
    """Compare each parent cell with the sum of its children: (cells compared, cells differing, max |diff|).

    ``child_parent`` holds, row-aligned with ``child``, the parent key columns of each child row.
    """
    kids = child_parent.copy()
    for a in attrs:
        kids[a] = child[a].astype(str).to_numpy()
    kids["COUNT"] = pd.to_numeric(child["COUNT"]).to_numpy(np.float64)
    sums = kids.groupby([*parent_keys, *attrs], as_index=False)["COUNT"].sum()
    par = parent[[*parent_keys, *attrs]].astype(str)
    par["PARENT"] = pd.to_numeric(parent["COUNT"]).to_numpy(np.float64)
    merged = par.merge(sums, on=[*parent_keys, *attrs], how="left").fillna({"COUNT": 0.0})
    diff = np.abs(merged["PARENT"].to_numpy() - merged["COUNT"].to_numpy())
    return len(merged), int((diff > 0).sum()), float(diff.max() if len(diff) else 0.0)


def _groupsize_consistency(files: Mapping[str, pd.DataFrame], n: int | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    nation, state, county = (files.get(f"groupsize_{x}.csv") for x in ("nation", "state", "county"))
    if nation is not None and state is not None:
        link = pd.DataFrame({"STATE": ["US"] * len(state)})
        c, d, m = hierarchy_check(nation, state, ["STATE"], link, ["HOUSEHOLD_SIZE"])
        rows.append({"product": "groupsize", "check": "nation = Σ states (per size)", "cells": c,
                     "inconsistent": d, "max_abs_diff": m})
    if state is not None and county is not None:
        link = pd.DataFrame({"STATE": county["STATE"].astype(str).to_numpy()})
        c, d, m = hierarchy_check(state, county, ["STATE"], link, ["HOUSEHOLD_SIZE"])
        rows.append({"product": "groupsize", "check": "state = Σ counties (per size)", "cells": c,
                     "inconsistent": d, "max_abs_diff": m})
    if nation is not None and n is not None:
        total = float(pd.to_numeric(nation["COUNT"]).sum())
        rows.append({"product": "groupsize", "check": f"Σ nation = invariant n ({n})", "cells": 1,
                     "inconsistent": int(total != n), "max_abs_diff": abs(total - n)})
    return rows


#: TopDown's standard geolevels and GEOID widths (as ``dasflow.products.topdown.product.STANDARD_LEVELS``)
TOPDOWN_LEVELS = (("US", 0), ("state", 2), ("county", 5), ("tract", 11), ("block_group", 12), ("block", 15))


def _topdown_consistency(files: Mapping[str, pd.DataFrame]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    present = [(name, w) for name, w in TOPDOWN_LEVELS if f"topdown_{name}.csv" in files
               or f"topdown_{name}.parquet" in files]
    for (pname, pw), (cname, _cw) in itertools.pairwise(present):
        parent = files.get(f"topdown_{pname}.csv", files.get(f"topdown_{pname}.parquet"))
        child = files.get(f"topdown_{cname}.csv", files.get(f"topdown_{cname}.parquet"))
        assert parent is not None and child is not None
        attrs = [c for c in child.columns if c not in ("GEOID", "COUNT")]
        geo = child["GEOID"].astype(str)
        link = pd.DataFrame({"GEOID": (geo.str[:pw] if pw else pd.Series(["US"] * len(child))).to_numpy()})
        parent = parent.assign(GEOID=parent["GEOID"].astype(str))
        c, d, m = hierarchy_check(parent, child, ["GEOID"], link, attrs)
        rows.append({"product": "topdown", "check": f"{pname} = Σ {cname}", "cells": c, "inconsistent": d,
                     "max_abs_diff": m})
    return rows


def consistency(ctx: RunContext, release: Mapping[str, Mapping[str, pd.DataFrame]]) -> pd.DataFrame:
    """The group-size and TopDown consistency diagnostics (released values and public invariants only)."""
    rows: list[dict[str, Any]] = []
    if "groupsize" in release:
        n = None
        try:
            adapter = ctx.plugin("groupsize")
            public = adapter.public_inputs(ctx.post_store(), ctx.config.inputs, ctx.product_config("groupsize"))
            n = int(public["n_groups"])
        except DasflowError:
            n = None
        rows += _groupsize_consistency(release["groupsize"], n)
    for product, files in release.items():
        if any(k.startswith("topdown_") for k in files):
            rows += [r | {"product": product} for r in _topdown_consistency(files)]
    return pd.DataFrame(rows, columns=["product", "check", "cells", "inconsistent", "max_abs_diff"])


# ------------------------------------------------------------------------------------------------- plots
def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plot_moes(moes: pd.DataFrame) -> str:
    import matplotlib.pyplot as plt

    levels = moes.groupby(["product", "level"], sort=False)["moe90"].agg(["min", "max"]).reset_index()
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * len(levels) + 1)))
    y = np.arange(len(levels))
    colors = {p: f"C{i % 10}" for i, p in enumerate(dict.fromkeys(levels["product"]))}
    ax.barh(y, np.maximum(levels["max"], 0.5), color=[colors[p] for p in levels["product"]])
    ax.scatter(np.maximum(levels["min"], 0.5), y, color="black", s=10, zorder=3, label="smallest key MOE")
    ax.set_yticks(y, [f"{p} · {lv}" for p, lv in zip(levels["product"], levels["level"], strict=True)],
                  fontsize=7)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("90 % MOE of one noisy cell (persons; bar = largest key of the level)")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _plot_error_by_size(tables: Mapping[tuple[str, str], pd.DataFrame]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, ((product, rel), table) in enumerate(tables.items()):
        if table.empty:
            continue
        x = [SIZE_LABELS.index(s) for s in table["size"]]
        ax.plot(x, np.maximum(table["rmse"], 0.1), marker="o", color=f"C{i % 10}", label=f"{product}/{rel}")
    ax.set_xticks(range(len(SIZE_LABELS)), SIZE_LABELS)
    ax.set_yscale("log")
    ax.set_xlabel("true count of the cell (population size)")
    ax.set_ylabel("RMSE of the released count")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return _png(fig)


def _plot_scatter(cells: Mapping[tuple[str, str], pd.DataFrame], product: str) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, ((p, rel), frame) in enumerate(cells.items()):
        if p != product or frame.empty:
            continue
        step = max(1, len(frame) // 5000)  # deterministic thinning for large tables
        part = frame.iloc[::step]
        ax.scatter(part["TRUE"], part["ERROR"], s=4, alpha=0.5, color=f"C{i % 10}", label=rel)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=-0.5)
    ax.set_xlabel("true count")
    ax.set_ylabel("released − true")
    ax.set_title(product)
    ax.legend(fontsize=6, ncol=3, markerscale=3)
    fig.tight_layout()
    return _png(fig)


def _plot_consistency(diag: pd.DataFrame) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, max(2.0, 0.4 * len(diag) + 1)))
    y = np.arange(len(diag))
    share = diag["inconsistent"] / diag["cells"].clip(lower=1)
    ax.barh(y, share * 100, color="C3")
    ax.scatter(np.zeros(len(diag)), y, color="C2", marker="|", s=200, label="0 % = fully consistent")
    ax.set_yticks(y, [f"{p}: {c}" for p, c in zip(diag["product"], diag["check"], strict=True)], fontsize=7)
    ax.set_xlim(-2, 102)
    ax.invert_yaxis()
    ax.set_xlabel("cells differing from the sum of their children (%)")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    return _png(fig)


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


def accuracy_blocks(ctx: RunContext, truth: TruthFrames | None) -> list[Block]:
    if truth is not None and not ctx.config.is_test:
        raise TruthRefused("ground truth is only ever used for a test release's accuracy report")
    import matplotlib

    matplotlib.use("Agg")
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
    blocks.append(Image(_plot_moes(moes), "Expected 90 % MOE of one noisy cell, per product and level"))
    per_level = moes.groupby(["product", "level", "mechanism"], sort=False).agg(
        keys=("key", "size"), cells=("cells", "sum"), moe90_min=("moe90", "min"), moe90_max=("moe90", "max"),
        moe95_max=("moe95", "max")).reset_index()
    blocks.append(Table(("product", "level", "mechanism", "keys", "cells", "90 % MOE (min–max)",
                         "95 % MOE (max)"),
                        tuple((*_cells(r, "product", "level", "mechanism", "keys", "cells"),
                               f"{r['moe90_min']}–{r['moe90_max']}", str(r["moe95_max"]))
                              for r in _records(per_level))))
    release = release_frames(ctx)
    if truth is not None:
        cells = observed_errors(release, truth)
        by_size = {k: error_by_size(v) for k, v in cells.items()}
        blocks.append(Heading("Observed error against the ground truth of the published tables (this run), by "
                              "population size"))
        if by_size:
            blocks.append(Image(_plot_error_by_size(by_size), "RMSE of released counts by true cell size"))
            for product in dict.fromkeys(p for p, _ in cells):
                blocks.append(Image(_plot_scatter(cells, product), f"{product}: released − true vs true count"))
            by_level = {(p, rel, str(lv)): error_by_size(part) for (p, rel), frame in cells.items()
                        for lv, part in frame.groupby("LEVEL", sort=False)}
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
        checks = estimate_checks(ctx, truth)
        if not checks.empty:
            blocks.append(Heading("PHSafe statistical post-processing against the ground truth"))
            blocks.append(Table(
                ("file", "true count", "cells", "RMSE noisy count", "RMSE estimate", "mean error of estimate",
                 "true count inside 90 % interval"),
                tuple((*_cells(r, "file", "true count", "cells"),
                       *(_fmt(float(r[c])) for c in ("rmse_noisy", "rmse_estimate", "bias_estimate")),
                       f"{float(r['interval_coverage']):.1%}") for r in _records(checks))))
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
        blocks.append(Image(_plot_consistency(diag), "Share of cells inconsistent with their children"))
        blocks.append(Table(("product", "check", "cells", "inconsistent", "max |difference|"),
                            tuple((*_cells(r, "product", "check", "cells", "inconsistent"),
                                   _fmt(float(r["max_abs_diff"]))) for r in _records(diag))))
    return blocks


def experiment_blocks(ctx: RunContext) -> list[Block]:
    """The published tables' error from the accuracy experiment recorded for this release's method (same
    universe and product configs), or a statement that none was run. The experiment ran on synthetic inputs
    only (it refuses others), so nothing here is derived from this release's confidential inputs."""
    from dasflow.experiment.record import recorded
    from dasflow.experiment.runner import method_sha256

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
def _phsafe_truth(ctx: RunContext) -> dict[str, pd.DataFrame]:
    """PHSafe's non-private twin (no noise, no truncation: phsafe.md §3 implementation notes)."""
    from dasflow.products.phsafe.product import run_non_private

    adapter = ctx.plugin("phsafe")
    cfg = ctx.product_config("phsafe")
    public = adapter.public_inputs(ctx.store, ctx.config.inputs, cfg)
    conf = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    frames = run_non_private(conf["persons"], conf["units"], public["geo"], cfg)
    return {adapter.file_name(t, ctx.config.universe): f for t, f in frames.items()}


def _safetab_truth(ctx: RunContext) -> dict[str, pd.DataFrame]:
    """SafeTab-P's ground-truth twin: every tabulated level at infinite budget (no noise, same adaptivity)."""
    from dasflow.privacy import rng
    from dasflow.products.safetab_p.product import ground_truth_config, run_universe

    adapter = ctx.plugin("safetab-p")
    cfg = ground_truth_config(ctx.product_config("safetab-p"))
    public = adapter.public_inputs(ctx.store, ctx.config.inputs, cfg)
    conf = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    result = run_universe(public, conf, rng.seeded(0))  # σ² = 0 everywhere: the generator is never used
    return {adapter.file_name(n, ctx.config.universe): f for n, f in result.tables.items()}


def _groupsize_truth(ctx: RunContext) -> dict[str, pd.DataFrame]:
    """Group sizes by exact tabulation: households per (geography, size) in the release layout."""
    adapter = ctx.plugin("groupsize")
    cfg = ctx.product_config("groupsize")
    public = adapter.public_inputs(ctx.store, ctx.config.inputs, cfg)
    hh = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)["households"]
    k = int(cfg.k)
    size = np.minimum(hh["SIZE"].to_numpy(np.int64), k)
    labels = [str(s) if s < k else f"{k}+" for s in range(1, k + 1)]
    geo = public["geography"][["STATE", "COUNTY"]].astype(str)
    out: dict[str, pd.DataFrame] = {}
    for level, cols in (("nation", []), ("state", ["STATE"]), ("county", ["STATE", "COUNTY"])):
        dom = geo[cols].drop_duplicates() if cols else pd.DataFrame({"STATE": ["US"]})
        dom = dom.merge(pd.DataFrame({"SIZE": np.arange(1, k + 1)}), how="cross")
        tab = pd.DataFrame({c: hh[c].astype(str).to_numpy() for c in cols} | {"SIZE": size})
        if not cols:
            tab["STATE"] = "US"
        keys = cols or ["STATE"]
        counts = tab.groupby([*keys, "SIZE"], as_index=False).size().rename(columns={"size": "COUNT"})
        frame = dom.merge(counts, on=[*keys, "SIZE"], how="left").fillna({"COUNT": 0})
        frame["HOUSEHOLD_SIZE"] = [labels[s - 1] for s in frame["SIZE"]]
        out[adapter.file_name(f"groupsize_{level}", ctx.config.universe)] = \
            frame[[*keys, "HOUSEHOLD_SIZE", "COUNT"]].astype({"COUNT": np.int64})
    return out


def _topdown_truth(ctx: RunContext) -> dict[str, pd.DataFrame]:
    """TopDown's published tables computed from the true block histogram: the product's own ``prepare()``
    (persons tabulated onto the spine's blocks, vectorised) fed to its own ``tables()`` in place of the
    estimated blocks — so the truth has exactly the published files, geolevels and key columns, nonzero cells
    only (as published: an absent cell is 0, ``ZERO_FILLED``)."""
    from dasflow.products.topdown.product import TopDown

    adapter = ctx.plugin("topdown")
    cfg = ctx.product_config("topdown")
    product = adapter.product(cfg)
    assert isinstance(product, TopDown)
    public = adapter.public_inputs(ctx.store, ctx.config.inputs, cfg)
    conf = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    spine = product.spine(public)
    hist = product.prepare(conf, public)[f"hist/{spine.levels[-1]}"]
    block = pd.DataFrame({"GEOID": spine.block_geoid[hist["UNIT"].to_numpy(np.int64)].astype(str),
                          "CELL": hist["CELL"].to_numpy(np.int64), "COUNT": hist["COUNT"].to_numpy(np.int64)})
    return {adapter.file_name(t, ctx.config.universe): f for t, f in product.tables({"block": block}).items()}


def _matrix_truth(ctx: RunContext) -> dict[str, pd.DataFrame]:
    """The matrix product's workload tables of the true histogram (the product's own tabulation): attribute
    codes + COUNT per cell, in the release layout (``{level}_{table}``)."""
    from dasflow.products.matrix.estimate import marginal_of
    from dasflow.products.matrix.product import MatrixProduct

    adapter = ctx.plugin("matrix")
    cfg = ctx.product_config("matrix")
    product = adapter.product(cfg)
    assert isinstance(product, MatrixProduct)
    conf = adapter.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    hist = product.histogram(conf["records"], str(conf["records_source"]))
    names = list(cfg.schema)
    out: dict[str, pd.DataFrame] = {}
    for table, attrs in cfg.workload.items():
        counts = marginal_of(hist, [names.index(a) for a in attrs]).astype(np.int64).reshape(-1)
        grid = np.indices([cfg.schema[a] for a in attrs]).reshape(len(attrs), -1) if attrs else ()
        frame = pd.DataFrame({a: grid[i] for i, a in enumerate(attrs)} | {"COUNT": counts})
        out[adapter.file_name(f"{cfg.level}_{table}", ctx.config.universe)] = frame
    return out


TRUTH: dict[str, TruthFn] = {"phsafe": _phsafe_truth, "safetab-p": _safetab_truth, "groupsize": _groupsize_truth,
                             "topdown": _topdown_truth, "matrix": _matrix_truth}


def register_truth(product: str, fn: TruthFn) -> None:
    """Declare the ground-truth twin of a (plug-in) product, in its release-file layout."""
    TRUTH[product] = fn


def truth_frames(ctx: RunContext) -> dict[str, dict[str, pd.DataFrame]]:
    """Ground-truth frames of every product with a registered twin — TEST releases only.

    Reads the confidential inputs (it is the only release-stage function that does), so it refuses a
    production release (:class:`TruthRefused`): a production accuracy report never contains anything
    computed from confidential data.
    """
    if not ctx.config.is_test:
        raise TruthRefused(f"release {ctx.release_id} is a production release: ground truth is never computed "
                           "for it (its accuracy report shows expected MOEs only)")
    return {p.name: TRUTH[p.name](ctx) for p in ctx.config.products if p.name in TRUTH}
