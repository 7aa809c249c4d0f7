"""Resource use of each stage, recorded by the release itself in its stage manifests (``metrics`` block).

What is measured, per stage function call, for *this process* (the stage functions run in the process of the
task that calls them):

``wall_seconds``
    elapsed time (``time.perf_counter``).
``cpu_seconds``
    user + system CPU of this process (``getrusage(RUSAGE_SELF)``, all its threads) plus that of its waited-for
    children (``RUSAGE_CHILDREN``) during the stage; ``children_cpu_seconds`` is the children's share. Stages
    that run at the same time in one process (the thread task runner) each see the other's CPU too.
``rss_start_bytes``, ``rss_end_bytes``
    resident set size when the stage started and ended (``psutil``).
``peak_rss_bytes``
    the process's *lifetime* peak RSS read when the stage ended (``ru_maxrss``, which Linux updates lazily,
    so at least the start and end RSS): an upper bound of the stage's own peak, and exactly it when it exceeds
    the peak recorded at the start (``peak_rss_start_bytes``; then the stage set the new peak). The operating
    system keeps no per-interval peak.

Timings are not reproducible, so they live only in ``runs/{id}/manifests/`` (operator records): the skip test
of a stage compares input hashes, config and code version, never metrics, and nothing under ``release/`` reads
them. They are facts about the machine, not about confidential data.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import psutil

from dasflow.io.store import StoreError
from dasflow.pipeline.run import RunContext, manifest_key

#: Per-product stage manifests in release order ("tables": a product's release files; the release stage has one
#: manifest, product "all").
_ORDER = ("validate", "preprocess", "measure", "postprocess", "tables")


def _maxrss_bytes(usage: resource.struct_rusage) -> int:
    """``ru_maxrss`` in bytes (kilobytes on Linux, bytes on macOS)."""
    return int(usage.ru_maxrss) * (1 if sys.platform == "darwin" else 1024)


def _cpu(usage: resource.struct_rusage) -> float:
    return float(usage.ru_utime + usage.ru_stime)


@dataclass(frozen=True)
class StageMeter:
    """A running measurement of one stage: start it before the stage's work, ``read()`` when it is done."""

    wall0: float
    cpu0: float
    children0: float
    rss0: int
    peak0: int

    @staticmethod
    def start() -> StageMeter:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss = int(psutil.Process().memory_info().rss)
        return StageMeter(time.perf_counter(), _cpu(me), _cpu(kids), rss, max(_maxrss_bytes(me), rss))

    def read(self) -> dict[str, Any]:
        """The stage's metrics so far (see the module docstring for what each figure means)."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - self.children0
        rss = int(psutil.Process().memory_info().rss)
        return {"wall_seconds": round(time.perf_counter() - self.wall0, 6),
                "cpu_seconds": round(_cpu(me) - self.cpu0 + kids, 6),
                "children_cpu_seconds": round(kids, 6),
                "rss_start_bytes": self.rss0,
                "rss_end_bytes": rss,
                "peak_rss_start_bytes": self.peak0,
                "peak_rss_bytes": max(_maxrss_bytes(me), self.rss0, rss)}


def stage_metrics(ctx: RunContext) -> list[dict[str, Any]]:
    """The metrics of every stage manifest of the release (release order; stages not run yet are left out),
    as rows: stage, product, wall s, CPU s, peak RSS MB, RSS at start MB."""
    keys = [(stage, p.name) for stage in _ORDER for p in ctx.config.products] + [("release", "all")]
    rows: list[dict[str, Any]] = []
    for stage, product in keys:
        try:
            record = json.loads(ctx.store.get(manifest_key(ctx, stage, product)))
        except StoreError:
            continue
        m = record.get("metrics")
        if not isinstance(m, dict):
            continue
        rows.append({"stage": stage, "product": product, "wall s": round(float(m["wall_seconds"]), 2),
                     "CPU s": round(float(m["cpu_seconds"]), 2),
                     "peak RSS MB": round(int(m["peak_rss_bytes"]) / 2**20, 1),
                     "RSS at start MB": round(int(m["rss_start_bytes"]) / 2**20, 1)})
    return rows
