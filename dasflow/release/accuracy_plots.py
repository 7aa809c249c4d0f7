"""The accuracy report's plots: matplotlib figures rendered to base64 PNG (no timestamp or software tag in the
file, so a re-run gives the same bytes). They draw released values, plan MOEs and, for test releases, the
comparison with the ground truth that :mod:`dasflow.release.accuracy` computed; nothing is read here."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

SIZE_LABELS = ("0", "1–9", "10–99", "100–999", "1,000–9,999", "10,000+")


def png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plot_moes(moes: pd.DataFrame) -> str:
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
    return png(fig)


def plot_error_by_size(tables: Mapping[tuple[str, str], pd.DataFrame]) -> str:
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
    return png(fig)


def plot_scatter(cells: Mapping[tuple[str, str], pd.DataFrame], product: str) -> str:
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
    return png(fig)


def plot_consistency(diag: pd.DataFrame) -> str:
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
    return png(fig)
