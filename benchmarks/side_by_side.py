"""Two code trees on the same data, side by side: one fresh interpreter per (tree, repeat), interleaved so that
a change in the machine's load hits both; the least CPU over the repeats is each tree's figure. Used by
``kept_parts.py``, ``kept_prepare.py`` and ``nmf_encode.py``; each passes the code its child runs (the tree under
test first on ``sys.path``; the child prints one JSON line with ``user`` and ``sys`` CPU seconds)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def child(code: str, *argv: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with ``argv``; its last output line as JSON, plus ``cpu``."""
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["cpu"] = round(result["user"] + result["sys"], 2)
    return result


def commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def parser(doc: str) -> argparse.ArgumentParser:
    """The common options: ``--other`` (the tree to compare with), ``--repeat``, ``--out``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--other", type=Path, required=True, help="another dasflow checkout (e.g. a git worktree)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    return ap


def compare(name: str, other: Path, repeat: int, run: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Every run of both trees (interleaved), each tree's best, the CPU ratio other / this, and both commits
    (the trees by commit: no path of this machine in the result)."""
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
    for _ in range(repeat):
        for label, tree in (("this", HERE), ("other", other.resolve())):
            runs[label].append(run(tree))
            print(label, runs[label][-1], flush=True)
    best = {label: min(rs, key=lambda r: r["cpu"]) for label, rs in runs.items()}
    return {"benchmark": name, "this_commit": commit(HERE), "other_commit": commit(other), "runs": runs,
            "best": best, "cpu_ratio_other_over_this": round(best["other"]["cpu"] / best["this"]["cpu"], 3)}


def finish(result: dict[str, Any], out: Path | None) -> int:
    """Print the result without its runs; write it whole to ``out``."""
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0
