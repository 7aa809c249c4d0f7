"""Render the group-size experiment JSON (benchmarks/groupsize_experiment.py) into docs/groupsize.md + plots.

    .venv/bin/python benchmarks/groupsize_report.py benchmarks/results/groupsize_experiment.json docs/groupsize.md

The claims of spec §3.3 are checked mechanically from the recorded means; the verdicts are printed as they
come out, including the ones that contradict the paper.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

LEVEL_NAMES = ("L1 (root)", "L2", "L3 (leaves)")


def aggregate(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    acc: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        acc[(r["method"], r["eps"])].append(r)
    out = {}
    for key, rs in acc.items():
        l1 = np.array([r["l1"] for r in rs])
        out[key] = {
            "n": len(rs),
            "l1_mean": l1.mean(axis=0),
            "l1_std": l1.std(axis=0),
            "cv": float(np.mean([r["cv"] for r in rs])),
            "sec": float(np.mean([r["seconds"] for r in rs])),
            "sec_std": float(np.std([r["seconds"] for r in rs])),
            "valid": all(r["valid"] for r in rs),
            "notes": _notes([r["note"] for r in rs if r["note"]]),
        }
    return out


def _notes(notes: list[str]) -> list[str]:
    """DP widenings as recorded; QP runs: solver status(es) plus the largest certified relative duality gap."""
    fields = [dict(p.split("=", 1) for p in n.split() if "=" in p) for n in notes]
    if not fields or "qp_status" not in fields[0]:
        return sorted({n.split("=")[-1] for n in notes})
    out = sorted({f["qp_status"] for f in fields})
    gaps = [float(f["rel_gap"]) for f in fields if "rel_gap" in f]
    if gaps:
        out.append(f"max rel. duality gap {max(gaps):.0e}")
    return out


def eps_key(e: str) -> float:
    num, _, den = e.partition("/")
    return float(num) / float(den or 1)


def table(ds: str, agg: dict[tuple[str, str], dict[str, Any]], methods: list[str]) -> list[str]:
    eps = sorted({e for _, e in agg}, key=eps_key)
    head = f"| ε | method | reps | {' | '.join(LEVEL_NAMES)} | #CV | post-proc. s | valid | QP status or DP widenings |"
    lines = [head,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in eps:
        for m in methods:
            a = agg.get((m, e))
            if a is None:
                continue
            cells = " | ".join(f"{mu:.1f} ± {sd:.1f}" for mu, sd in zip(a["l1_mean"], a["l1_std"], strict=True))
            lines.append(f"| {eps_key(e):g} | {m} | {a['n']} | {cells} | {a['cv']:.0f} | {a['sec']:.2f} | "
                         f"{'yes' if a['valid'] else 'no'} | {', '.join(a['notes'])} |")
    return lines


def plots(ds: str, agg: dict[tuple[str, str], dict[str, Any]], methods: list[str], out_dir: Path) -> list[str]:
    eps = sorted({e for _, e in agg}, key=eps_key)
    x = [eps_key(e) for e in eps]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for m in methods:
        if not all((m, e) in agg for e in eps):
            continue
        for lv in range(3):
            axes[lv].plot(x, [agg[(m, e)]["l1_mean"][lv] for e in eps], marker="o", label=m)
        axes[3].plot(x, [agg[(m, e)]["sec"] for e in eps], marker="o", label=m)
    for lv in range(3):
        axes[lv].set_title(f"{ds}: L1 error, {LEVEL_NAMES[lv]}")
        axes[lv].set_yscale("log")
        axes[lv].set_xlabel("ε")
    axes[3].set_title(f"{ds}: post-processing seconds")
    axes[3].set_yscale("log")
    axes[3].set_xlabel("ε")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    name = f"groupsize_{ds}.png"
    fig.savefig(out_dir / name, dpi=90)
    plt.close(fig)
    return [f"![{ds}]({name})"]


def verdict(ok: bool) -> str:
    return "holds" if ok else "does NOT hold"


def claims(per_ds: dict[str, dict[tuple[str, str], dict[str, Any]]]) -> list[str]:
    lines = ["| claim (spec §3.3) | dataset | measured | verdict |", "|---|---|---|---|"]

    def sec(agg: dict[tuple[str, str], dict[str, Any]], m: str, e: str) -> float:
        return float(agg[(m, e)]["sec"])

    for ds, agg in per_ds.items():
        eps = sorted({e for _, e in agg}, key=eps_key)
        have = {m for m, _ in agg}

        def ratios(
            a: str, b: str, agg: dict[tuple[str, str], dict[str, Any]] = agg, eps: list[str] = eps
        ) -> list[float]:
            return [sec(agg, a, e) / max(sec(agg, b, e), 1e-9) for e in eps]

        if {"M_DP", "M_H-R"} <= have:
            r = ratios("M_H-R", "M_DP")
            capped = any("Time limit" in n for e in eps for n in agg[("M_H-R", e)]["notes"])
            how = "QP capped at its time limit" if capped else "QP solved to optimality"
            lines.append(f"| (1) M_DP faster than M_H-R | {ds} | QP/DP time ratio {', '.join(f'{v:.1f}x' for v in r)} "
                         f"({how}) | {verdict(min(r) > 1)} |")
        if {"M_DPC", "M_HC-R"} <= have:
            r = ratios("M_HC-R", "M_DPC")
            lines.append(f"| (1) M_DPC faster than M_HC-R | {ds} | ratio {', '.join(f'{v:.1f}x' for v in r)} | "
                         f"{verdict(min(r) > 1)} |")
        if "TopDown" in have:
            dps = [m for m in ("M_DP", "M_DPC", "M_DPC*") if m in have]
            worst = max(ratios(m, "TopDown")[i] for m in dps for i in range(len(eps)))
            lines.append(f"| (2) every DP faster than TopDown | {ds} | max DP/TopDown time ratio {worst:.1f}x | "
                         f"{verdict(worst < 1)} |")
        if {"M_HC-R", "M_H-R"} <= have:
            r = ratios("M_HC-R", "M_H-R")
            lines.append(f"| (3) M_HC-R slower than M_H-R | {ds} | ratio {', '.join(f'{v:.2f}' for v in r)} | "
                         f"{verdict(min(r) > 1)} |")
        for m in ("M_DP", "M_DPC"):
            if m in have:
                s = [sec(agg, m, e) for e in eps]
                lines.append(f"| (4) {m} runtime falls as ε grows | {ds} | "
                             f"{', '.join(f'{v:.2f}s' for v in s)} | {verdict(s[0] > s[-1])} |")
        if {"M_DPC", "M_DP"} <= have:
            r = ratios("M_DP", "M_DPC")
            lines.append(f"| (5) M_DPC faster than M_DP | {ds} | M_DP/M_DPC {', '.join(f'{v:.1f}x' for v in r)} | "
                         f"{verdict(min(r) > 1)} |")
        if {"M_DPC*", "M_DP", "M_DPC"} <= have:
            r = [min(sec(agg, "M_DP", e), sec(agg, "M_DPC", e)) / max(sec(agg, "M_DPC*", e), 1e-9) for e in eps]
            lines.append(f"| (6) M_DPC* faster than M_DP and M_DPC | {ds} | "
                         f"min(M_DP, M_DPC)/M_DPC* {', '.join(f'{v:.0f}x' for v in r)} | {verdict(min(r) > 1)} |")
        for m in sorted(have):
            e0, e1 = eps[0], eps[-1]
            fall = all(agg[(m, e1)]["l1_mean"][lv] <= agg[(m, e0)]["l1_mean"][lv] for lv in range(3))
            if not fall:
                lines.append(f"| error falls with ε | {ds} | {m}: level errors at ε={eps_key(e0):g} "
                             f"{np.round(agg[(m, e0)]['l1_mean'], 1).tolist()} vs ε={eps_key(e1):g} "
                             f"{np.round(agg[(m, e1)]['l1_mean'], 1).tolist()} | does NOT hold for {m} |")
        falls = [
            m for m in sorted(have)
            if all(agg[(m, eps[-1])]["l1_mean"][lv] <= agg[(m, eps[0])]["l1_mean"][lv] for lv in range(3))
        ]
        lines.append(f"| error falls with ε | {ds} | every level, ε={eps_key(eps[0]):g} → {eps_key(eps[-1]):g}: "
                     f"{', '.join(falls)} | holds for these |")
        exact = [m for m in sorted(have) if m not in ("M_H-R", "M_HC-R")]
        cv0 = all(agg[(m, e)]["cv"] == 0 for m in exact for e in eps)
        relax = [f"{m}: {np.mean([agg[(m, e)]['cv'] for e in eps]):.0f}" for m in ("M_H-R", "M_HC-R") if m in have]
        lines.append(f"| DP methods 0 #CV, relaxed many | {ds} | exact methods all 0: {cv0}; mean #CV "
                     f"{'; '.join(relax)} | {verdict(cv0 and all(float(x.split(': ')[1]) > 0 for x in relax))} |")
        private = [m for m in sorted(have) if "not DP" not in m and m not in ("M_H-R", "M_HC-R")]
        for e in eps:
            tot = {m: float(np.sum(agg[(m, e)]["l1_mean"])) for m in private}
            best = min(tot, key=lambda m: tot[m])
            star = tot.get("M_DPC*", float("nan"))
            lines.append(f"| M_DPC* (corrected Δ=\\|R_l\\|) most accurate | {ds} | ε={eps_key(e):g}: best (sum "
                         f"of level errors) among DP methods = {best} ({tot[best]:.1f}); M_DPC* = {star:.1f}"
                         f" | {verdict(best == 'M_DPC*')} |")
        if {"TopDown", "M_DP"} <= have:
            wins = sum(agg[("TopDown", e)]["l1_mean"][lv] <= agg[("M_DP", e)]["l1_mean"][lv]
                       for e in eps for lv in range(3))
            lines.append(f"| Table 7 pattern: TopDown ≤ M_DP error | {ds} | in {wins}/{3 * len(eps)} (ε, level) cells "
                         f"| {verdict(wins == 3 * len(eps))} |")
        if {"M_DPC", "M_DP"} <= have:
            wins = sum(agg[("M_DPC", e)]["l1_mean"][lv] <= agg[("M_DP", e)]["l1_mean"][lv]
                       for e in eps for lv in range(3))
            lines.append(f"| cumulative (sens. 1) M_DPC beats M_DP | {ds} | in {wins}/{3 * len(eps)} cells | "
                         f"{verdict(wins == 3 * len(eps))} |")
    return lines


def main(argv: list[str]) -> int:
    src, out = Path(argv[0]), Path(argv[1])
    head = Path(argv[2]).read_text() if len(argv) > 2 else ""
    res = json.loads(src.read_text())
    methods = list(dict.fromkeys(r["method"] for ds in res["datasets"].values() for r in ds["runs"]))
    per_ds = {ds: aggregate(d["runs"]) for ds, d in res["datasets"].items()}
    lines = [head] if head else []
    lines += ["## Measured grid", "", f"Machine: {res['machine']}; started {res['started']}, finished "
              f"{res.get('finished', '(incomplete)')}. Arguments: `{json.dumps(res['args'])}`.", ""]
    for rep in res.get("replaced", []):
        lines += [f"Rows of {', '.join(rep['methods'])} re-run (same seeds, hence the same noise draws) on "
                  f"{rep['machine']}, started {rep['started']}, finished {rep['finished']}, with "
                  f"`--reps {rep['args']['reps']} --qp-reps {rep['args']['qp_reps']} --qp-time-limit "
                  f"{rep['args']['qp_time_limit']}`.", ""]
    for ds, d in res["datasets"].items():
        lines += [f"### {ds}", "", f"Manifest: `{json.dumps(d['manifest'])}`", ""]
        lines += [*table(ds, per_ds[ds], methods), ""]
        lines += [*plots(ds, per_ds[ds], methods, out.parent), ""]
    lines += ["## Claims check (computed from the grid above)", "", *claims(per_ds), ""]
    out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
