"""The accuracy report's plots, embedded as base64 (no timestamp or software tag, so a re-run gives the same
bytes). The bar charts every report has (expected MOEs, consistency) are SVG written here, without matplotlib
(whose import and layout took ≈ 2.7 s of every release stage); the test-release plots of observed error are
matplotlib figures rendered to PNG. They draw released values, plan MOEs and, for test releases, the comparison
with the ground truth that :mod:`dasflow.release.accuracy` computed; nothing is read here."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

SIZE_LABELS = ("0", "1–9", "10–99", "100–999", "1,000–9,999", "10,000+")

#: the MIME type of the SVG charts (``document.Image.mime``)
SVG = "image/svg+xml"

#: matplotlib's default colour cycle ("C0" … "C9"), shared by the SVG charts and the PNG plots
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    _pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _tick_label(v: float, log: bool) -> str:
    if not log:
        return _num(v)
    return f"{v:g}" if 1e-3 <= v < 1e6 else f"1e{round(math.log10(v))}"


def barh_svg(labels: Sequence[str], values: Sequence[float], colors: Sequence[str], *, xlabel: str,
             log: bool = False, xlim: tuple[float, float] | None = None, marks: Sequence[float] | None = None,
             mark_label: str | None = None, mark_color: str = "#000000", mark_tick: bool = False) -> str:
    """A horizontal bar chart as base64 SVG: one row per label, top to bottom, a bar from the axis origin (the
    lower limit on a log axis) to its value, an optional marker per row (a dot, or a vertical tick) with a
    legend entry. Linear or base-10 log x axis (decade ticks); sizes in CSS pixels."""
    n = len(labels)
    row, top, bottom, width = 20.0, 12.0, 46.0, 800.0
    left = min(max(6.5 * max((len(t) for t in labels), default=0) + 14.0, 90.0), 420.0)
    right = width - 16.0
    height = top + row * max(n, 1) + bottom
    pts = [v for v in [*values, *(marks or ())] if np.isfinite(v) and (v > 0 or not log)]
    if xlim is not None:
        lo, hi = xlim
    elif log:
        lo = 10.0 ** math.floor(math.log10(min(pts, default=1.0)))
        hi = 10.0 ** math.ceil(math.log10(max(pts, default=10.0)))
        hi = hi * 10 if hi <= lo else hi
    else:
        lo, hi = min(0.0, *pts), max(1.0, *pts) * 1.05

    def x(v: float) -> float:
        if log:
            t = (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        else:
            t = (v - lo) / (hi - lo)
        return left + (right - left) * min(max(t, 0.0), 1.0)

    if log:
        ticks = [10.0 ** k for k in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
    else:
        unit = 10.0 ** (math.floor(math.log10(max(hi - lo, 1e-12))) - 1)
        step = next(unit * f for f in (1, 2, 5, 10, 20) if (hi - lo) / (unit * f) <= 10)  # 5–10 ticks
        ticks = [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    base = x(lo if log else max(lo, 0.0))
    axis_y = top + row * max(n, 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(width)}" height="{_num(height)}" '
           f'viewBox="0 0 {_num(width)} {_num(height)}" font-family="sans-serif" font-size="11">',
           f'<rect width="{_num(width)}" height="{_num(height)}" fill="#ffffff"/>']
    for t in ticks:
        out.append(f'<line x1="{_num(x(t))}" y1="{_num(top)}" x2="{_num(x(t))}" y2="{_num(axis_y)}" '
                   'stroke="#e0e0e0"/>')
        out.append(f'<text x="{_num(x(t))}" y="{_num(axis_y + 14)}" text-anchor="middle">'
                   f"{html.escape(_tick_label(t, log))}</text>")
    for i, (label, value, color) in enumerate(zip(labels, values, colors, strict=True)):
        y = top + row * i
        end = x(value) if np.isfinite(value) else base
        out.append(f'<rect x="{_num(min(base, end))}" y="{_num(y + 3)}" width="{_num(abs(end - base))}" '
                   f'height="{_num(row - 6)}" fill="{color}"/>')
        out.append(f'<text x="{_num(left - 6)}" y="{_num(y + row / 2 + 4)}" text-anchor="end">'
                   f"{html.escape(label)}</text>")
        if marks is not None and np.isfinite(marks[i]):
            m = x(marks[i])
            out.append(f'<line x1="{_num(m)}" y1="{_num(y + 1)}" x2="{_num(m)}" y2="{_num(y + row - 1)}" '
                       f'stroke="{mark_color}" stroke-width="2"/>' if mark_tick else
                       f'<circle cx="{_num(m)}" cy="{_num(y + row / 2)}" r="3" fill="{mark_color}"/>')
    out.append(f'<line x1="{_num(left)}" y1="{_num(axis_y)}" x2="{_num(right)}" y2="{_num(axis_y)}" '
               'stroke="#333333"/>')
    out.append(f'<text x="{_num((left + right) / 2)}" y="{_num(axis_y + 32)}" text-anchor="middle">'
               f"{html.escape(xlabel)}</text>")
    if mark_label:
        out.append(f'<circle cx="{_num(right - 8 - 6.2 * len(mark_label) - 10)}" cy="{_num(height - 8)}" r="3" '
                   f'fill="{mark_color}"/><text x="{_num(right - 4)}" y="{_num(height - 4)}" '
                   f'text-anchor="end">{html.escape(mark_label)}</text>')
    out.append("</svg>")
    return base64.b64encode("".join(out).encode()).decode()


def plot_moes(moes: pd.DataFrame) -> str:
    """Per product and level, the largest key's 90 % MOE (bar) and the smallest's (dot), on a log axis."""
    levels = moes.groupby(["product", "level"], sort=False)["moe90"].agg(["min", "max"]).reset_index()
    colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(dict.fromkeys(levels["product"]))}
    return barh_svg([f"{p} · {lv}" for p, lv in zip(levels["product"], levels["level"], strict=True)],
                    np.maximum(levels["max"].to_numpy(np.float64), 0.5).tolist(),
                    [colors[p] for p in levels["product"]], log=True,
                    marks=np.maximum(levels["min"].to_numpy(np.float64), 0.5).tolist(),
                    mark_label="smallest key MOE",
                    xlabel="90 % MOE of one noisy cell (persons; bar = largest key of the level)")


def _plain_log_ticks(axis: Any) -> None:
    """Label a log or symlog axis's decades as the SVG charts do (``1``, ``10``, ``1e6``), in plain text: the
    default labels are mathtext (``10^k``), whose parsing was a sixth of the plots' time."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: "0" if v == 0 else
                                           ("−" if v < 0 else "") + _tick_label(abs(v), True)))


def plot_error_by_size(tables: Mapping[tuple[str, str], pd.DataFrame]) -> str:
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, ((product, rel), table) in enumerate(tables.items()):
        if table.empty:
            continue
        x = [SIZE_LABELS.index(s) for s in table["size"]]
        ax.plot(x, np.maximum(table["rmse"], 0.1), marker="o", color=f"C{i % 10}", label=f"{product}/{rel}")
    ax.set_xticks(range(len(SIZE_LABELS)), SIZE_LABELS)
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("true count of the cell (population size)")
    ax.set_ylabel("RMSE of the released count")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return png(fig)


def plot_scatter(cells: Mapping[tuple[str, str], pd.DataFrame], product: str) -> str:
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, ((p, rel), frame) in enumerate(cells.items()):
        if p != product or frame.empty:
            continue
        step = max(1, len(frame) // 5000)  # deterministic thinning for large tables
        part = frame.iloc[::step]
        ax.scatter(part["TRUE"], part["ERROR"], s=4, alpha=0.5, color=f"C{i % 10}", label=rel)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("symlog", linthresh=10)
    _plain_log_ticks(ax.xaxis)
    ax.set_xlim(left=-0.5)
    ax.set_xlabel("true count")
    ax.set_ylabel("released − true")
    ax.set_title(product)
    # a fixed corner: the "best" one is searched against every point drawn (≈ 5,000 per file)
    ax.legend(fontsize=6, ncol=3, markerscale=3, loc="upper right")
    fig.tight_layout()
    return png(fig)


def plot_consistency(diag: pd.DataFrame) -> str:
    """Per check, the share of cells differing from the sum of their children (0 % marked: fully consistent)."""
    share = (diag["inconsistent"] / diag["cells"].clip(lower=1) * 100).to_numpy(np.float64)
    return barh_svg([f"{p}: {c}" for p, c in zip(diag["product"], diag["check"], strict=True)], share.tolist(),
                    [PALETTE[3]] * len(diag), xlim=(-2.0, 102.0), marks=[0.0] * len(diag), mark_tick=True,
                    mark_color=PALETTE[2], mark_label="0 % = fully consistent",
                    xlabel="cells differing from the sum of their children (%)")
