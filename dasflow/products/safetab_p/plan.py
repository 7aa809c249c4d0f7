"""The data-independent budget plan of one SafeTab-P run (US or PR): two keys per (region type, level).

Region granularity (Census ``REGION_GRANULARITY_MAPPING``): R tabulates only the level-L iterations of its
granularity — detailed (USA, STATE, PR-STATE): COARSE_ONLY = False; coarse (the others): DETAILED_ONLY = False
— so g_{R,L} is the level's flat map restricted to that set (:meth:`LevelIndex.for_granularity`), and s, the
group domain and the TotalOnly set are those of the restricted map (coarse region types have no TotalOnly group).
``ignore_region_granularity`` restores "every iteration everywhere" and is written into each key's level name.

For a tabulated (region type R, iteration level L) with level budget ρ_i (ε_i under pure DP) and computed
stability s = Δ(g_{R,L}) (:func:`~dasflow.products.safetab_p.iterations.stability_bound`):

- ``…/stage1``: budget γρ_i. One sensitivity-1 count per non-TotalOnly population group, each with ρ_i·γ/s.
- ``…/stage2``: budget (1−γ)ρ_i. Each non-TotalOnly group: its Step-2 counts (total, Sex × AGE4/9/23 — shape
  chosen from the stage-1 noisy total) with (1−γ)ρ_i/s each; each TotalOnly group: one count with ρ_i/s.

The Census runs the DETAILED_ONLY = True and = False groups of (R, L) as two sessions of a partition of the
flat-mapped rows, each with the full ρ_i; that is the same mechanism: a person's ≤ s rows split between the
parts, every group costs ρ_i/s whichever part it is in, so the two parts together cost ρ_i (parallel
composition over the partition = generalized parallel composition over groups; Lemmas 9/10).

Privacy argument (Theorems 1 and 3, generalized parallel composition, Lemmas 9/10): every group's calls cost
ρ_i/s in total (two-stage: γρ_i/s + (1−γ)ρ_i/s by adaptive sequential composition; the Step-2 Sex × Age cells
are disjoint; TotalOnly: one call), and one person is in at most s groups of the level, so the pair of keys costs
ρ_i. Stage 1 alone costs at most γρ_i (a person is in ≤ s non-TotalOnly groups). Stage 2 is only measurable
after stage 1 (it needs its noisy totals), so the ledger's running sum is always an upper bound. Levels compose
sequentially: the run costs Σ ρ_i.

Noise per count (Alg. 3-5): discrete Gaussian σ² = 1/(2·budget) (zcdp); two-sided geometric b = 1/budget
(puredp); computed by ``accounting.gaussian_sigma2`` / ``accounting.geometric_scale`` with sensitivity 1. The
spec's ``sensitivity`` is that of the key's whole vector (the ``MeasurementSpec`` convention): a person moves at
most s of its counts, each by 1, so Δ₂² = Δ₁ = s, and σ² = s/(2·key budget) (b = s/key budget) is the per-count
noise above, as the non-TotalOnly counts of both stages use.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dasflow.privacy import accounting
from dasflow.privacy.composition import budget_sum
from dasflow.products.base import MeasurementSpec, Mechanism
from dasflow.products.safetab_p.config import SafeTabPConfig
from dasflow.products.safetab_p.iterations import IterationIndex, LevelIndex, stability_bound
from dasflow.products.safetab_p.records import Geography
from dasflow.products.safetab_p.regions import Universe, iteration_set

PRODUCT = "safetab-p"
AGE_BINS: dict[int, tuple[int, ...]] = {
    1: (18, 45, 65),
    2: (5, 18, 25, 35, 45, 55, 65, 75),
    3: (5, 10, 15, 18, 20, 21, 22, 25, 30, 35, 40, 45, 50, 55, 60, 62, 65, 67, 70, 75, 80, 85),
}
MAX_CELLS_PER_GROUP = 2 * (len(AGE_BINS[3]) + 1)
#: a key whose public group domain (regions × iterations) exceeds this is measured and post-processed in region
#: segments of at most this many groups (``segment_regions`` in the plan: frozen with it)
SEGMENT_GROUPS = 4_000_000


def measurement_key(universe: Universe, region_type: str, level: int, stage: int) -> str:
    """``safetab-p/US/COUNTY/2/stage1`` — the ledger key of one (region type, level, stage)."""
    return f"{PRODUCT}/{universe}/{region_type}/{level}/stage{stage}"


def mechanism_of(cfg: SafeTabPConfig, budget: Fraction | None) -> Mechanism:
    if budget is None:
        return "none"
    return "discrete_gaussian" if cfg.privacy_defn == "zcdp" else "two_sided_geometric"


def noise_for(cfg: SafeTabPConfig, per_query_budget: Fraction | None) -> Fraction:
    """σ² (zcdp) or b (puredp) of one sensitivity-1 count with the given budget; 0 for an infinite budget."""
    if per_query_budget is None:
        return Fraction(0)
    if cfg.privacy_defn == "zcdp":
        return Fraction(accounting.gaussian_sigma2(per_query_budget, Fraction(1)))
    return Fraction(accounting.geometric_scale(per_query_budget, Fraction(1)))


def variance_of(mechanism: Mechanism, noise: Fraction) -> Fraction | float:
    """Published per-cell variance: σ² exactly (discrete Gaussian); 2a/(1−a)², a = e^{−1/b} (geometric)."""
    if mechanism == "none" or noise == 0:
        return Fraction(0)
    if mechanism == "discrete_gaussian":
        return noise
    a = math.exp(-1.0 / float(noise))
    return 2.0 * a / (1.0 - a) ** 2


def level_of(cfg: SafeTabPConfig, iterations: IterationIndex, region_type: str, level: int) -> LevelIndex:
    """The iterations (region type, level) tabulates: the level restricted to the region type's granularity."""
    return iterations.levels[level].for_granularity(iteration_set(region_type, cfg.ignore_region_granularity))


def level_name(cfg: SafeTabPConfig, region_type: str, level: int) -> str:
    """``(COUNTY, 1)``; with the granularity rule off, the name says so (the certificate lists it)."""
    if cfg.ignore_region_granularity:
        return f"({region_type}, {level}) all iterations, region granularity off"
    return f"({region_type}, {level})"


def plan(cfg: SafeTabPConfig, iterations: IterationIndex, geography: Geography) -> list[MeasurementSpec]:
    """Every (region type, level, stage) key of the run with its exact budget; reads no private data."""
    universe = geography.universe
    specs: list[MeasurementSpec] = []
    for rt, lv in cfg.tabulated(universe):
        level = level_of(cfg, iterations, rt, lv)
        s = max(stability_bound(level, cfg.max_race_codes), 1)  # 1 only when the set is empty (no group)
        rho = cfg.budgets[(rt, lv)]
        n_regions = len(geography.region_ids[rt])
        n_to = int(level.total_only.sum())
        n_two = level.n_iterations - n_to
        common: dict[str, Any] = {
            "universe": universe, "region_type": rt, "iteration_level": lv, "stability": s,
            "gamma": cfg.gamma, "level_budget": rho, "thresholds": cfg.thresholds[(rt, lv)],
            "n_regions": n_regions, "n_iterations": level.n_iterations, "n_total_only_iterations": n_to,
            "iteration_set": iteration_set(rt, cfg.ignore_region_granularity),
            **({"segment_regions": max(1, SEGMENT_GROUPS // level.n_iterations)}
               if n_regions * level.n_iterations > SEGMENT_GROUPS else {}),
            "neighbours": "add/remove one person",
            "composition": "generalized parallel composition over <= s groups per person (Lemmas 9/10)",
        }
        for stage in (1, 2):
            frac = cfg.gamma if stage == 1 else 1 - cfg.gamma
            key_budget = None if rho is None else rho * frac
            per_query = None if rho is None else rho * frac / s
            mech = mechanism_of(cfg, rho)
            noise = noise_for(cfg, per_query)
            detail = dict(common, stage=stage, per_query_budget=per_query)
            if stage == 1:
                cells = n_regions * n_two
            else:
                to_budget = None if rho is None else rho / s
                to_noise = noise_for(cfg, to_budget)
                detail.update(total_only_budget=to_budget, total_only_noise=to_noise,
                              total_only_variance=variance_of(mech, to_noise),
                              age_bins={k: list(v) for k, v in AGE_BINS.items()},
                              cells_note="adaptive; upper bound: every two-stage group at Sex x AGE23")
                cells = n_regions * (n_to + n_two * MAX_CELLS_PER_GROUP)
            specs.append(MeasurementSpec(
                product=PRODUCT, key=measurement_key(universe, rt, lv, stage), level=level_name(cfg, rt, lv),
                privacy_defn=cfg.privacy_defn, mechanism=mech, budget=key_budget, sensitivity=Fraction(s),
                noise=noise, cells=cells, variance=variance_of(mech, noise), detail=detail))
    return specs


def plan_total(specs: list[MeasurementSpec]) -> Fraction | None:
    """Σ of the keys' budgets (None if any is infinite)."""
    return budget_sum(specs)


def accounting_plan(specs: list[MeasurementSpec]) -> accounting.Sequential:
    """The plan as the accountant's composition tree (Theorems 1-3): for each (region type, level)
    ``Parallel(degree=s, [Sequential(stage-1 count, Step-2 count), TotalOnly count])``, levels composed
    sequentially. ``accounting.compose`` of it gives Σρ_i / Σε_i and the (ε, δ) conversions (Table 2), and its
    RDP curve is Theorem 2's s·max[τ(γρ_i/s) + τ((1−γ)ρ_i/s), τ(ρ_i/s)] summed over levels.
    """
    levels: list[accounting.Parallel] = []
    for spec in specs:
        d = spec.detail
        if d["stage"] != 2:
            continue
        rho = d["level_budget"]
        s = d["stability"]
        defn = spec.privacy_defn
        per = None if rho is None else rho / s
        stage1 = accounting.Spend(defn, None if per is None else d["gamma"] * per,
                                  label=f"{spec.level} stage 1")
        step2 = accounting.Spend(defn, None if per is None else (1 - d["gamma"]) * per,
                                 label=f"{spec.level} step 2")
        total_only = accounting.Spend(defn, per, label=f"{spec.level} TotalOnly")
        levels.append(accounting.Parallel((accounting.Sequential((stage1, step2)), total_only), degree=s,
                                          label=spec.level))
    return accounting.Sequential(tuple(levels), label="safetab-p")
