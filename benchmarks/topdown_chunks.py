"""TopDown with a large state split into county chunks (issue #20 item 2): measure and post-process peak RSS.

    .venv/bin/python benchmarks/topdown_chunks.py [--persons 10000000] [--split 8] [--out FILE]

One synthetic census of the 50 states and DC (``topdown`` format, per-state folders), then two releases of the
demo's TopDown config, differing only in the public ``segment_blocks`` bound:

``state``
    the bound = the largest state's blocks: small states grouped up to it, the largest state one segment and
    one post-processing subtree (the layout before chunking);
``chunk``
    the bound = the largest state's blocks / ``--split``: every state above it is split into chunks of
    consecutive counties, in measurement (segments ``SS.k``) and in post-processing (parts ``s.k``).

Per release: validate + plan (not measured), then preprocess, measure and post-process, each in a fresh process
(``benchmarks/topdown_partitions.py``'s child), with the stage manifest's CPU seconds and peak RSS. The
post-processing child computes every part in plan order in one process, so its peak is the largest part's (plus
the streamed combine), which is what a worker would need. The releases differ in noise (segments are drawn with
generators spawned from their ids), so only their resources are compared, not their bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.topdown_partitions import census, release_config, run_child  # noqa: E402


def largest_state_blocks(store: Path) -> tuple[str, int]:
    """The state with the most blocks in the public GRF-C, and its block count."""
    import pandas as pd

    grfc = pd.read_csv(store / "public/topdown/GRF-C.txt", sep="|", dtype=str, usecols=["TABBLKST"])
    counts = grfc["TABBLKST"].value_counts()
    return str(counts.index[0]), int(counts.iloc[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", type=float, default=10e6)
    ap.add_argument("--split", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from dasflow.synth.reference import states as synth_states

    nation = [s for s in sorted(synth_states()) if s != "72"]
    row: dict[str, Any] = {"persons": int(args.persons), "states": len(nation)}
    with tempfile.TemporaryDirectory(prefix="td-chunks-", dir="/tmp") as tmp:
        store = Path(tmp) / "store"
        per_state = census(store, int(args.persons), nation)
        state, blocks = largest_state_blocks(store)
        row.update(largest_state=state, largest_state_persons=per_state[state], largest_state_blocks=blocks)
        for mode, bound in (("state", blocks), ("chunk", max(1, blocks // args.split))):
            cfg = Path(tmp) / f"{mode}.json"
            cfg.write_text(json.dumps(release_config(store, mode, bound)))
            run_child("setup", cfg, str(REPO))
            out: dict[str, Any] = {"segment_blocks": bound}
            for stage in ("preprocess", "measure", "postprocess"):
                m = run_child(stage, cfg, str(REPO))["metrics"]
                out[stage] = {"cpu_s": round(m["cpu_seconds"], 1), "wall_s": round(m["wall_seconds"], 1),
                              "peak_rss_mb": round(m["peak_rss_bytes"] / 2**20),
                              "stage_peak_mb": round((m["peak_rss_bytes"] - m["rss_start_bytes"]) / 2**20)}
                print(mode, stage, json.dumps(out[stage]), flush=True)
            row[mode] = out
            shutil.rmtree(store / "runs" / mode)
    print(json.dumps(row, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "topdown_chunks", **row}, indent=1) + "\n")


if __name__ == "__main__":
    main()
