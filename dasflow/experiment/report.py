"""The experiment report: a self-contained HTML page (matplotlib plots embedded as base64 PNG, as the
release's accuracy report), readable on its own or as a Prefect artifact.

Plots, per product: the RMSE of the published tables by population-size bin, one line per geolevel; and, for a
budget sweep, the RMSE against the budget scale per geolevel. RMSEs are pooled over the product's tables
(Σ cells·rmse² / Σ cells). The table lists every (table, geolevel, scale) row of the ``all`` bin; the full
breakdown by population size is in ``metrics.csv``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dasflow.experiment.metrics import ALL_BIN, BIN_ORDER
from dasflow.release.document import Block, Bullets, Heading, Image, Para, Table, to_html, to_markdown

BANNER = "ACCURACY EXPERIMENT — seeded test noise on synthetic inputs; not a release"


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plain_log_ticks(axis: Any) -> None:
    """Log-axis ticks as plain numbers (3, 10, 20), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(fmt)


def pooled(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """RMSE pooled over tables: √(Σ cells·rmse² / Σ cells) per ``by`` group."""
    weights = table["cells"].to_numpy(np.float64)
    frame = table[by].assign(w=weights, wsq=weights * table["rmse"].to_numpy(np.float64) ** 2)
    out = frame.groupby(by, sort=False, as_index=False)[["w", "wsq"]].sum()
    out["rmse"] = np.sqrt(out["wsq"] / out["w"].where(out["w"] > 0))
    return out[[*by, "rmse"]]


def _plot_by_size(table: pd.DataFrame, product: str, scale: float) -> str:
    import matplotlib.pyplot as plt

    part = table[(table["product"] == product) & (table["budget_scale"] == scale) & (table["pop_bin"] != ALL_BIN)]
    curves = pooled(part, ["geolevel", "pop_bin"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    order = list(BIN_ORDER[:-1])
    for i, (level, sub) in enumerate(curves.groupby("geolevel", sort=False)):
        sub = sub.assign(x=[order.index(b) for b in sub["pop_bin"]]).sort_values("x")
        ax.plot(sub["x"], np.maximum(sub["rmse"], 0.1), marker="o", color=f"C{i % 10}", label=str(level))
    ax.set_xticks(range(len(order)), order)
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("true count of the published cell (population size)")
    ax.set_ylabel("RMSE of the published value")
    ax.set_title(f"{product}: error of the published tables by population size (budget scale {scale:g})")
    ax.legend(fontsize=7, ncol=3, title="geolevel", title_fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _plot_sweep(table: pd.DataFrame, product: str) -> str:
    import matplotlib.pyplot as plt

    part = table[(table["product"] == product) & (table["pop_bin"] == ALL_BIN)]
    curves = pooled(part, ["geolevel", "budget_scale"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, (level, sub) in enumerate(curves.groupby("geolevel", sort=False)):
        sub = sub.sort_values("budget_scale")
        ax.plot(sub["budget_scale"], np.maximum(sub["rmse"], 0.1), marker="o", color=f"C{i % 10}", label=str(level))
    ax.set_xscale("log")
    ax.set_yscale("log")
    scales = sorted(set(curves["budget_scale"]))
    ax.set_xticks(scales, [f"{s:g}" for s in scales])
    ax.xaxis.set_minor_formatter("")
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("budget scale (every key's budget × factor)")
    ax.set_ylabel("RMSE of the published value")
    ax.set_title(f"{product}: error vs budget")
    ax.legend(fontsize=7, ncol=3, title="geolevel", title_fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _fmt(x: Any) -> str:
    v = float(x)
    return "—" if v != v else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"


def _share(x: Any) -> str:
    v = float(x)
    return "—" if v != v else f"{v:.1%}"


def _plot_splits(table: pd.DataFrame, splits: pd.DataFrame, product: str) -> str:
    """Pooled RMSE per geolevel at each candidate split (x: the plan's own split, where scale 1 ran, then the
    candidates in the given order)."""
    import matplotlib.pyplot as plt

    part = splits[(splits["product"] == product) & (splits["pop_bin"] == ALL_BIN)]
    curves = pooled(part, ["geolevel", "budget_split"])
    base = table[(table["product"] == product) & (table["pop_bin"] == ALL_BIN) & (table["budget_scale"] == 1.0)]
    if not base.empty:
        curves = pd.concat([pooled(base, ["geolevel"]).assign(budget_split="plan"), curves], ignore_index=True)
    order = list(dict.fromkeys(curves["budget_split"]))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, (level, sub) in enumerate(curves.groupby("geolevel", sort=False)):
        sub = sub.assign(x=[order.index(b) for b in sub["budget_split"]]).sort_values("x")
        ax.plot(sub["x"], np.maximum(sub["rmse"], 0.1), marker="o", color=f"C{i % 10}", label=str(level))
    ax.set_xticks(range(len(order)), [o.split(":", 1)[-1][:40] for o in order], fontsize=6, rotation=15)
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("budget split (product total kept)")
    ax.set_ylabel("RMSE of the published value")
    ax.set_title(f"{product}: error vs budget split")
    ax.legend(fontsize=7, ncol=3, title="geolevel", title_fontsize=7)
    fig.tight_layout()
    return _png(fig)


def split_blocks(table: pd.DataFrame, splits: pd.DataFrame) -> list[Block]:
    """The split sweep: per product, RMSE vs candidate split per geolevel and the ``all``-bin rows."""
    if splits.empty:
        return []
    blocks: list[Block] = [Heading("Budget splits (each product's total budget kept)"), Para(
        "Each candidate re-weights the named levels of one product: their combined budget is shared in proportion "
        "to the weights, other levels keep theirs, and every key's noise is recomputed through the accountant. "
        "Full breakdown by population size: split_metrics.csv.")]
    for product in dict.fromkeys(splits["product"]):
        blocks.append(Image(_plot_splits(table, splits, product), f"{product}: RMSE vs budget split, per geolevel"))
        rows = splits[(splits["product"] == product) & (splits["pop_bin"] == ALL_BIN)]
        blocks.append(Table(
            ("split", "table", "geolevel", "cells", "MAE", "RMSE", "bias", "within 90 % MOE", "90th pct |error|"),
            tuple((str(r["budget_split"]), str(r["table"]), str(r["geolevel"]), str(r["cells"]), _fmt(r["mae"]),
                   _fmt(r["rmse"]), _fmt(r["bias"]), _share(r["within_moe"]), _fmt(r["q90_abs_error"]))
                  for r in rows.to_dict("records"))))
    return blocks


def experiment_blocks(table: pd.DataFrame, meta: Mapping[str, Any],
                      splits: pd.DataFrame | None = None) -> list[Block]:
    """The report's blocks (headings, plots, the ``all``-bin table, the split sweep where one ran)."""
    import matplotlib

    matplotlib.use("Agg")
    scales = sorted(set(table["budget_scale"]))
    reference = 1.0 if 1.0 in scales else (scales[0] if scales else 1.0)
    blocks: list[Block] = [Heading(f"Accuracy experiment: `{meta['release_id']}`", 1), Bullets((
        f"{meta['runs']} runs per budget scale and split (seed {meta['seed']}); budget scales: "
        f"{', '.join(meta['budget_scales'])}; budget splits: {'; '.join(meta.get('budget_splits', [])) or 'none'}; "
        f"products: {', '.join(meta['products']) or 'none'}",
        f"inputs: {meta['inputs']}; noise: {meta['noise']}",
        f"config sha256 {meta['config_sha256']}; method sha256 {meta['method_sha256']} (universe + product "
        "configs: a release with the same method shows these figures in its accuracy report)",
        "error = published value − true value, for the *published* (post-processed) tables, including every "
        "error source: noise, post-processing, thresholds, truncation",
        "within 90 % MOE: the share of published cells within the MOE the release states for them (Z90·√VARIANCE "
        "where a variance is published; SafeTab-P: the analytic MOE of the cell's noise — one draw of its "
        "(region type, level) key, or the sum of its Sex × Age cells; else the plan's analytic MOE where all keys "
        "of the level share one; — where no MOE is stated, e.g. TopDown)",
    ))]
    for name, reason in dict(meta.get("skipped", {})).items():
        blocks.append(Para(f"{name}: not measured — {reason}"))
    for product in dict.fromkeys(table["product"]):
        blocks.append(Heading(f"{product}"))
        blocks.append(Image(_plot_by_size(table, product, reference),
                            f"{product}: RMSE of the published tables by population size, per geolevel"))
        if len(scales) > 1:
            blocks.append(Image(_plot_sweep(table, product), f"{product}: RMSE vs budget scale, per geolevel"))
        rows = table[(table["product"] == product) & (table["pop_bin"] == ALL_BIN)]
        blocks.append(Table(
            ("table", "geolevel", "budget scale", "runs", "cells", "MAE", "RMSE", "mean rel. error", "bias",
             "within 90 % MOE", "90th pct |error|"),
            tuple((str(r["table"]), str(r["geolevel"]), f"{float(r['budget_scale']):g}", str(r["runs"]),
                   str(r["cells"]), _fmt(r["mae"]), _fmt(r["rmse"]), _fmt(r["mean_relative_error"]),
                   _fmt(r["bias"]), _share(r["within_moe"]), _fmt(r["q90_abs_error"]))
                  for r in rows.to_dict("records"))))
    if splits is not None:
        blocks += split_blocks(table, splits)
    if "seconds" in meta:
        blocks.append(Heading("Run time"))
        blocks.append(Table(("step", "seconds"), tuple((str(k), f"{float(v):.1f}")
                                                      for k, v in dict(meta["seconds"]).items())))
    return blocks


def experiment_report(table: pd.DataFrame, meta: Mapping[str, Any], splits: pd.DataFrame | None = None) -> str:
    """The report as one self-contained HTML page."""
    return to_html(experiment_blocks(table, meta, splits), f"Accuracy experiment: {meta['release_id']}",
                   banner=BANNER)


def experiment_markdown(table: pd.DataFrame, meta: Mapping[str, Any], splits: pd.DataFrame | None = None) -> str:
    """The report as Markdown (plots as inline data URIs): the Prefect UI's markdown artifact."""
    return f"**{BANNER}**\n\n" + to_markdown(experiment_blocks(table, meta, splits))
