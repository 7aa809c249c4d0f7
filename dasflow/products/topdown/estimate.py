"""Top-down estimation on the internal spine (topdown-estimation.md): the whole pass, root then level by level.

Pure post-processing: every function here takes noisy answers, their variances and public facts (spine,
strategy, invariants) only. The optional bottom-up combination (Hay et al.) first replaces each node's answers
by an inverse-variance combination with its children's; then the root (:func:`batch.estimate_root`) and each
level's families (:func:`batch.estimate_families`) are solved in order — the algorithm, its exactness and its
invariants are described in :mod:`~dasflow.products.topdown.batch`; the data types are in
:mod:`~dasflow.products.topdown.model`.

Module layering (imports point downward only): ``estimate`` → ``batch`` → ``model`` → ``spine``; ``batch`` also
uses :mod:`~dasflow.products.topdown.solvers`. The names below are re-exported for existing callers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from dasflow.io.arrays import unique
from dasflow.products.topdown.batch import estimate_families, estimate_root
from dasflow.products.topdown.model import (
    Constraints,
    EstimatorOptions,
    FamilyResult,
    GroupAnswers,
    Histogram,
    LevelReport,
    consistency_violations,
    root_total,
)
from dasflow.products.topdown.spine import Spine

__all__ = ["Constraints", "EstimatorOptions", "FamilyResult", "GroupAnswers", "Histogram", "LevelReport",
           "bottom_up_start", "combine_bottom_up", "consistency_violations", "estimate_families", "estimate_root",
           "estimate_topdown", "root_total"]

log = logging.getLogger(__name__)


def bottom_up_start(spine: Spine, measurements: Sequence[Sequence[GroupAnswers]], max_entries: int) -> int:
    """The deepest level whose dense size (units × the widest group's rows) is within ``max_entries``: the
    bottom-up pass changes only the levels above it and reads only it and those (public facts only)."""
    for l in range(spine.n_levels - 1, -1, -1):
        rows = max((g.n_rows for g in measurements[l]), default=1)
        if spine.n_units(l) * rows <= max_entries:
            return l
    return 0


def combine_bottom_up(spine: Spine, measurements: Sequence[Sequence[GroupAnswers]],
                      max_entries: int) -> list[list[GroupAnswers]]:
    """Hay et al. (2010) bottom-up pass: replace each node's answers by the inverse-variance combination of
    its own answers and the sum of its children's combined answers, for query groups measured (same name and
    rows) at both levels. Linear and unbiased; pure post-processing. It starts at the deepest level whose
    dense size (units × rows) stays within ``max_entries`` (memory bound); deeper levels keep their own
    answers.
    An unmeasured node (γ = 0, an only child's parent chain) takes its subtree's combination."""
    out = [list(m) for m in measurements]
    start = bottom_up_start(spine, measurements, max_entries)
    for l in range(start - 1, -1, -1):
        par = spine.parent[l + 1]
        nu, nc = spine.n_units(l), spine.n_units(l + 1)
        child_by_name = {g.name: g for g in out[l + 1]}
        new_groups: list[GroupAnswers] = []
        for g in out[l]:
            ch = child_by_name.get(g.name)
            if ch is None or not np.array_equal(ch.row_index, g.row_index) or ch.units.size == 0:
                new_groups.append(g)
                continue
            cz = np.zeros((nc, g.n_rows))
            cv = np.full(nc, np.inf)
            cz[ch.units] = ch.answers
            cv[ch.units] = ch.variance
            sz = np.zeros((nu, g.n_rows))
            has = np.bincount(par, minlength=nu) > 0
            sz[has] = np.add.reduceat(cz, np.searchsorted(par, np.flatnonzero(has)), axis=0)
            sv = np.bincount(par, weights=cv, minlength=nu)
            oz = np.zeros((nu, g.n_rows))
            ov = np.full(nu, np.inf)
            oz[g.units] = g.answers
            ov[g.units] = g.variance
            with np.errstate(divide="ignore", invalid="ignore"):
                prec = 1.0 / ov + 1.0 / sv
                z = (np.nan_to_num(oz / ov[:, None]) + np.nan_to_num(sz / sv[:, None])) / prec[:, None]
                v = 1.0 / prec
            known = np.isfinite(v)
            units = np.flatnonzero(known).astype(np.int64)
            new_groups.append(GroupAnswers(g.name, g.row_index, g.n_rows, units, z[units], v[units],
                                           g.detailed))
        out[l] = new_groups
    return out


def estimate_topdown(spine: Spine, measurements: Sequence[Sequence[GroupAnswers]], n_cells: int,
                     total: int | None, *, truth: Sequence[Histogram] | None = None,
                     opts: EstimatorOptions | None = None, constraints: Constraints | None = None
                     ) -> tuple[list[Histogram], list[LevelReport]]:
    """Whole top-down pass. ``measurements[l]`` are the query groups measured at level l (only units with
    γ > 0). ``truth`` (test mode only) adds the per-level L1 error. ``constraints``: state totals and
    structural zeros (see :class:`Constraints`); each level's report counts entries violating them (must be
    0). Returns (histograms, reports)."""
    opts = opts or EstimatorOptions()
    total = root_total(total, constraints)
    if opts.bottom_up:
        measurements = combine_bottom_up(spine, measurements, opts.bottom_up_max_entries)
    hists: list[Histogram] = []
    reports: list[LevelReport] = []
    for l in range(spine.n_levels):
        t0 = time.perf_counter()
        c0 = time.process_time()
        if l == 0:
            res = estimate_root(spine, measurements[0], n_cells, total, opts, constraints=constraints)
            viol = 0 if total is None else int(res.hist.count.sum() != total)
        else:
            res = estimate_families(spine, l, np.arange(spine.n_units(l - 1)), hists[l - 1], measurements[l],
                                    opts, constraints=constraints)
            viol = consistency_violations(spine, l, res.hist, hists[l - 1])
        hists.append(res.hist)
        inv_viol = constraints.violations(l, res.hist) if constraints is not None else 0
        rep = LevelReport(spine.levels[l], spine.n_units(l), res.status, time.perf_counter() - t0,
                          res.iterations, viol, cpu_seconds=time.process_time() - c0,
                          invariant_violations=inv_viol)
        if truth is not None:
            rep.l1_error = _l1(res.hist, truth[l])
        log.info("topdown estimate %s: %d units, %.1f s cpu, status %s, %d violations", rep.level, rep.units,
                 rep.cpu_seconds, rep.status, rep.consistency_violations)
        reports.append(rep)
    return hists, reports


def _l1(a: Histogram, b: Histogram) -> float:
    n_cells = int(max(a.cell.max(initial=0), b.cell.max(initial=0))) + 1
    ka = a.unit * n_cells + a.cell
    kb = b.unit * n_cells + b.cell
    keys = unique(np.concatenate((ka, kb)))  # np.union1d, by one sort
    va = np.zeros(keys.size)
    vb = np.zeros(keys.size)
    va[np.searchsorted(keys, ka)] = a.count
    vb[np.searchsorted(keys, kb)] = b.count
    return float(np.abs(va - vb).sum())
