"""Repeated seeded runs of a release's products on synthetic inputs, measured against the truth.

The confidential part runs once per product: inputs are read, prepared (the stable tabulations) and the
ground-truth twin computed (the plugin's ``truth``). Then, for each budget scale and each run, the
product's plan is scaled (:mod:`dasflow.experiment.scaling`), every key measured with independent seeded test
noise, post-processed and turned into the published tables, which are compared with the truth in memory.

An experiment is not a release: no config is frozen, no ledger entry is written and no privacy-loss account
is touched; noise comes only from ``rng.seeded`` (a generator per scale, run and key, derived from the
experiment's seed). It runs only on inputs the synthetic census generated (``check_synthetic``), because its
output — errors against the truth — would disclose real confidential data.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dasflow.config import ReleaseConfig
from dasflow.errors import InputError
from dasflow.experiment.metrics import COLUMNS, metrics
from dasflow.experiment.scaling import Split, scale_label, scale_plan, split_plan
from dasflow.io.store import open_store
from dasflow.pipeline.inputs import check_not_empty, check_synthetic
from dasflow.pipeline.run import RunContext
from dasflow.pipeline.stages import measure_one
from dasflow.privacy import accounting, rng
from dasflow.privacy.ledger import Ledger
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.products.base import Product
from dasflow.products.plugin import ProductPlugin, overrides
from dasflow.release.accuracy import NON_KEY, Z90
from dasflow.release.experiments import method_sha256

__all__ = ["SPLIT_COLUMNS", "Experiment", "PreparedProduct", "TruthIndex", "experiment_context", "geolevel_of",
           "method_sha256", "observe", "prepare_product", "run_experiment", "stated_moe", "stated_moes", "variant"]

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------------------------ truth lookup
def _text(column: pd.Series) -> pd.Series:
    """``column.astype(str)``, or for a categorical whose categories have distinct texts and no value missing,
    the categorical of those texts: it hashes as the text does (pandas hashes a categorical's categories), with
    one string per category instead of one per row (SafeTab-P's truth T1 has the whole public domain)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        texts = column.cat.categories.astype(str)
        codes = column.cat.codes.to_numpy()
        if texts.is_unique and not (codes < 0).any():
            return pd.Series(pd.Categorical.from_codes(codes, texts), index=column.index, copy=False)
    return column.astype(str)


class TruthIndex:
    """A truth frame indexed by a 64-bit hash of its key columns, for repeated lookups of the published cells of
    each run without re-joining the whole truth frame. A key column is hashed in its own dtype where the truth
    and the published table agree on it, else both sides as text (as ``accuracy.compare`` joins them). A
    one-cell table without key columns (a total) has the one-row truth."""

    def __init__(self, frame: pd.DataFrame, keys: Sequence[str], published: pd.DataFrame) -> None:
        self.frame = frame
        self.keys = list(keys)
        self.as_text = {k: frame[k].dtype != published[k].dtype for k in self.keys}
        self._dtypes = {k: published[k].dtype for k in self.keys}
        self.index = pd.Index(self._hash(frame))
        if not self.index.is_unique:
            raise ValueError(f"truth frame keys {self.keys} are not unique")
        self.values = pd.to_numeric(frame["COUNT"]).to_numpy(np.float64)

    def _hash(self, frame: pd.DataFrame) -> np.ndarray:
        if not self.keys:
            return np.zeros(len(frame), dtype=np.uint64)
        cols = {k: _text(frame[k]) if self.as_text[k] else frame[k] for k in self.keys}
        return pd.util.hash_pandas_object(pd.DataFrame(cols), index=False).to_numpy()

    def lookup(self, released: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row positions in ``released`` that have a truth cell, their true counts, the truth rows no published
        row matched): an inner join plus what an outer join would add on the truth side."""
        if any(released[k].dtype != self._dtypes[k] for k in self.keys if not self.as_text[k]):
            raise ValueError("a published table changed its key dtypes between runs")
        pos = self.index.get_indexer(self._hash(released))
        found = np.flatnonzero(pos >= 0)
        unmatched = np.ones(len(self.values), dtype=bool)
        unmatched[pos[found]] = False
        return found, self.values[pos[found]], np.flatnonzero(unmatched)


def _matches(level: str, geolevel: str) -> bool:
    """Whether a plan level is at a geolevel: ``nation``; ``usa_*``, ``usa_A-G`` (PHSafe); ``(STATE, 1)``
    (SafeTab-P). Case-insensitive."""
    lv, g = level.strip().lower(), geolevel.strip().lower()
    return lv == g or lv.startswith(g + "_") or re.match(rf"\(\s*{re.escape(g)}\s*,", lv) is not None


def geolevel_of(file: str, product: str, frame: pd.DataFrame, levels: Sequence[str] = ()) -> pd.Series | str:
    """Geography level of each published cell: ``REGION_TYPE`` where the file has it, else the level in the
    file name after the product's prefix (``groupsize_nation.csv`` → ``nation``, ``topdown_block.csv`` →
    ``block``), else, for a product whose plan has a single level, that level where the file name starts with
    it (the matrix product's ``nation_total.csv`` → ``nation``), else ``all``."""
    if "REGION_TYPE" in frame.columns:
        return frame["REGION_TYPE"].astype(str)
    stem = file.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    prefix = product.replace("-", "_") + "_"
    if stem.startswith(prefix):
        return stem[len(prefix):]
    one = set(levels)
    return one.pop() if len(one) == 1 and stem.startswith(f"{next(iter(one))}_") else "all"


def stated_moes(specs: Sequence[MeasurementSpec]) -> dict[str, set[int]]:
    """Plan level → the analytic 90 % MOEs of one noisy cell of its keys (exact summation of the discrete noise
    distribution): what the accuracy report states for products that publish no per-cell VARIANCE."""
    cache: dict[tuple[str, Fraction], int] = {}
    found: dict[str, set[int]] = {}
    for s in specs:
        if s.noise == 0:
            moe = 0
        else:
            kind = "puredp" if s.mechanism == "two_sided_geometric" else "zcdp"
            if (kind, s.noise) not in cache:
                cache[(kind, s.noise)] = (accounting.geometric_moe_exact(s.noise, Fraction(9, 10)) if kind == "puredp"
                                          else accounting.dgauss_moe_exact(s.noise, Fraction(9, 10)))
            moe = cache[(kind, s.noise)]
        found.setdefault(s.level, set()).add(moe)
    return found


def stated_moe(geolevel: str, moes: Mapping[str, set[int]]) -> float:
    """The MOE stated for a published cell of a geolevel: the one MOE of every plan key at that level; NaN where
    the level's keys have different MOEs (SafeTab-P's iteration levels and stages: a cell's MOE is not
    determined by its level, so none is claimed) or there is no key at that level."""
    values = set().union(*(m for level, m in moes.items() if _matches(level, geolevel)))
    return float(next(iter(values))) if len(values) == 1 else float("nan")


def _levels_of(file: str, product: str, frame: pd.DataFrame, plan_levels: Sequence[str]) -> np.ndarray:
    level = geolevel_of(file, product, frame, plan_levels)
    return level.to_numpy() if isinstance(level, pd.Series) else np.full(len(frame), level, dtype=object)


def observe(file: str, product: str, released: pd.DataFrame, truth: TruthIndex,
            stated: Mapping[str, set[int]], zero_fill: bool = False,
            moes: np.ndarray | None = None) -> pd.DataFrame:
    """One run's published table against the truth: TRUE, ERROR (published − true), MOE90 (``moes``, the
    product's per-row stated MOE, where given; else Z90·√VARIANCE where the file publishes a variance, else the
    stated analytic MOE of the cell's level, else NaN), geolevel.

    ``zero_fill`` (a product whose files list nonzero cells only, its plugin's ``zero_filled``): a true cell the run
    did not publish was published as 0, so it is observed with error −true; a published cell absent from the
    truth is true 0. The observed cells are those nonzero in the published or the true table (a cell zero in
    both has error 0 exactly and is not counted)."""
    value = "COUNT" if "COUNT" in released.columns else "ESTIMATE"
    if value not in released.columns:
        raise ValueError(f"{product}/{file}: published table has neither COUNT nor ESTIMATE")
    rows, true, unmatched = truth.lookup(released)
    if zero_fill:
        full = np.zeros(len(released), dtype=np.float64)
        full[rows] = true
        rows, true = np.arange(len(released)), full
    part = released.iloc[rows]
    published = pd.to_numeric(part[value]).to_numpy(np.float64)
    plan_levels = list(stated)
    levels = _levels_of(file, product, part, plan_levels)
    if moes is not None:
        moe = np.asarray(moes, dtype=np.float64)[rows]
    elif "VARIANCE" in part.columns:
        moe = Z90 * np.sqrt(pd.to_numeric(part["VARIANCE"]).to_numpy(np.float64))
    else:
        lookup = {lv: stated_moe(str(lv), stated) for lv in pd.unique(levels)}
        moe = pd.Series(levels).map(lookup).to_numpy(np.float64)
    out = pd.DataFrame({"geolevel": levels, "TRUE": true, "ERROR": published - true, "MOE90": moe})
    if not zero_fill or not unmatched.size:
        return out
    missed = truth.frame.iloc[unmatched]
    miss_true = truth.values[unmatched]
    miss_levels = _levels_of(file, product, missed, plan_levels)
    lookup = {lv: stated_moe(str(lv), stated) for lv in pd.unique(miss_levels)}
    return pd.concat([out, pd.DataFrame({
        "geolevel": miss_levels, "TRUE": miss_true, "ERROR": -miss_true,
        "MOE90": pd.Series(miss_levels).map(lookup).to_numpy(np.float64)})], ignore_index=True)


# ------------------------------------------------------------------------------------------------- products
@dataclass
class PreparedProduct:
    """A product with its confidential part done once: prepared tabulations and truth (kept in memory only)."""

    name: str
    plugin: ProductPlugin[Any]
    config: Any
    product: Product[Any]
    public: Mapping[str, Any]
    prepared: Mapping[str, pd.DataFrame]
    plan: list[MeasurementSpec]
    truth: dict[str, pd.DataFrame]
    _index: dict[tuple[str, tuple[str, ...]], TruthIndex] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)

    def truth_index(self, file: str, released: pd.DataFrame) -> TruthIndex:
        frame = self.truth[file]
        keys = tuple(c for c in released.columns if c in frame.columns and c not in NON_KEY)
        if not keys and not (len(frame) == len(released) == 1):
            raise ValueError(f"{self.name}/{file}: published table and truth share no key column")
        if (file, keys) not in self._index:
            self._index[(file, keys)] = TruthIndex(frame, keys, released)
        return self._index[(file, keys)]

    def publish(self, specs: Sequence[MeasurementSpec], g: rng.Generator, universe: str,
                product: Product[Any] | None = None) -> dict[str, pd.DataFrame]:
        """One run: measure every key (``g.spawn(key)``), post-process, and the published tables by file name
        (``product``: a budget-scaled twin of the product, the plugin's ``scaled_config``)."""
        prod = product if product is not None else self.product
        done: dict[str, Any] = {}
        for s in specs:
            done[s.key] = measure_one(prod, self.prepared, s, g.spawn(s.key), done)
        estimates = prod.postprocess(done, self.public)
        return {self.plugin.file_name(n, universe): f for n, f in prod.tables(estimates).items()}


def experiment_context(config: ReleaseConfig) -> RunContext:
    """A read-only context over the config's store for the truth functions; its ledger is never written."""
    store = open_store(config.store)
    return RunContext(store=store, config=config, config_sha256=config.sha256(),
                      ledger=Ledger(store, config.release_id, {"config_sha256": config.sha256(),
                                                                 "rng_mode": "test"}))


def prepare_product(ctx: RunContext, name: str) -> PreparedProduct:
    """Read, prepare and compute the truth of one product (the only steps that read confidential inputs)."""
    plugin = ctx.plugin(name)
    cfg = ctx.product_config(name)
    product = plugin.product(cfg)
    public = plugin.public_inputs(ctx.post_store(), ctx.config.inputs, cfg)
    confidential = plugin.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    prepared = product.prepare(confidential, public)
    plan = list(product.plan(cfg, public))
    truth = plugin.truth(ctx.store, ctx.config.inputs, cfg, ctx.config.universe)
    if truth is None:
        raise InputError(f"{name}: the product has no ground-truth twin (its plugin's truth)", column="--products")
    return PreparedProduct(name, plugin, cfg, product, public, prepared, plan, truth)


# ----------------------------------------------------------------------------------------------- experiment
#: split_metrics.csv: the metrics columns with the candidate split after the product (budget scale 1)
SPLIT_COLUMNS = ("product", "budget_split", *(c for c in COLUMNS if c not in ("product", "budget_scale")))


@dataclass
class Experiment:
    """An experiment's result: the metrics table (budget scales), the split sweep's (``SPLIT_COLUMNS``; empty
    without ``--budget-split``) and what it was run on."""

    metrics: pd.DataFrame
    meta: dict[str, Any]
    splits: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SPLIT_COLUMNS)))


def _config_scaled(state: PreparedProduct) -> bool:
    """Whether the product draws its noise from its config rather than the planned keys (``scaled_config``)."""
    return overrides(state.plugin, "scaled_config")


def variant(state: PreparedProduct, factor: Fraction = Fraction(1),
            split: Split | None = None) -> tuple[Product[Any], list[MeasurementSpec]]:
    """The product and plan of one sweep point: the plan scaled by ``factor`` or re-weighted by ``split``."""
    if split is not None:
        if _config_scaled(state):
            raise InputError(f"{state.name}: budget splits are not simulated (its level shares shape its "
                             "geography spine; run one experiment per candidate config)", column="--budget-split")
        return state.product, split_plan(state.plan, split)
    if factor == 1:
        return state.product, list(state.plan)
    scaled = state.plugin.scaled_config(state.config, factor)
    if scaled is not None:
        # its own plan through the accountant; the prepared tabulation does not depend on the budget
        twin = state.plugin.product(scaled)
        return twin, list(twin.plan(scaled, state.public))
    return state.product, scale_plan(state.plan, factor)


def _observe_runs(state: PreparedProduct, product: Product[Any], specs: Sequence[MeasurementSpec], runs: int,
                  base: rng.Generator, label: str, universe: str, say: Progress) -> pd.DataFrame | None:
    """``runs`` seeded runs of one sweep point (generator ``base.spawn(f"{product}/{label}/run={r}")``): every
    published cell that has a truth cell, with its run and table."""
    stated = stated_moes(specs)
    parts: list[pd.DataFrame] = []
    for r in range(runs):
        g = base.spawn(f"{state.name}/{label}/run={r}")
        published = state.publish(specs, g, universe, product)
        moes = state.plugin.cell_moes(specs, published, state.public, universe, state.cache)
        for file, frame in sorted(published.items()):
            if file not in state.truth:
                continue
            obs = observe(file, state.name, frame, state.truth_index(file, frame), stated,
                          zero_fill=state.plugin.zero_filled, moes=moes.get(file))
            parts.append(obs.assign(run=r, table=file))
        say(f"{state.name}: {label}: run {r + 1}/{runs}")
    return pd.concat(parts, ignore_index=True) if parts else None


def run_experiment(config: ReleaseConfig, *, runs: int, scales: Sequence[Fraction] = (Fraction(1),),
                   seed: int = 0, products: Sequence[str] | None = None, splits: Sequence[Split] = (),
                   progress: Progress | None = None) -> Experiment:
    """``runs`` seeded runs per budget scale of every product (or ``products``) with a ground-truth twin, and per
    candidate budget split (of the split's product, at scale 1)."""
    say = progress or (lambda _msg: None)
    if runs < 1:
        raise InputError(f"--runs must be at least 1, got {runs}", column="--runs")
    if not scales and not splits:
        raise InputError("at least one budget scale is needed", column="--budget-scale")
    names = [p.name for p in config.products]
    wanted = list(products) if products else names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise InputError(f"products not in the config: {unknown}", column="--products")
    for sp in splits:
        if sp.product not in wanted:
            raise InputError(f"budget split {sp.label!r}: product {sp.product!r} is not run by this experiment",
                             column="--budget-split")
    ctx = experiment_context(config)
    hashes = ctx.confidential_hashes()
    check_not_empty(ctx.store, hashes)
    check_synthetic(ctx.store, hashes)  # refuses anything the synthetic census did not generate
    twins = {n for n in wanted if overrides(ctx.plugin(n), "truth")}
    skipped = {n: "no ground-truth twin (its product plugin has no truth)" for n in wanted if n not in twins}
    timing: dict[str, float] = {}
    frames: list[pd.DataFrame] = []
    split_frames: list[pd.DataFrame] = []
    base = rng.seeded(seed).spawn("dasflow-experiment")
    for name in (n for n in wanted if n in twins):
        t0 = time.perf_counter()
        state = prepare_product(ctx, name)
        timing[f"{name}: prepare + truth (once)"] = time.perf_counter() - t0
        own = [sp for sp in splits if sp.product == name]
        points = [(variant(state, split=sp), sp) for sp in own]   # refusals before any run
        for factor in scales:
            product, specs = variant(state, factor)
            label = scale_label(factor)
            t1 = time.perf_counter()
            obs = _observe_runs(state, product, specs, runs, base, f"scale={label}", config.universe, say)
            timing[f"{name}: {runs} runs at scale {label}"] = time.perf_counter() - t1
            if obs is not None:
                frames.append(metrics(obs.assign(product=name, budget_scale=float(factor))))
        for (product, specs), sp in points:
            t1 = time.perf_counter()
            obs = _observe_runs(state, product, specs, runs, base, f"split={sp.label}", config.universe, say)
            timing[f"{name}: {runs} runs at split {sp.label}"] = time.perf_counter() - t1
            if obs is not None:
                m = metrics(obs.assign(product=name, budget_scale=1.0))
                split_frames.append(m.assign(budget_split=sp.label)[list(SPLIT_COLUMNS)])
    table = pd.concat(frames, ignore_index=True) if frames else metrics(pd.DataFrame(
        columns=["product", "table", "geolevel", "budget_scale", "run", "TRUE", "ERROR", "MOE90"]))
    split_table = (pd.concat(split_frames, ignore_index=True) if split_frames
                   else pd.DataFrame(columns=list(SPLIT_COLUMNS)))
    meta = {"release_id": config.release_id, "universe": config.universe, "config_sha256": config.sha256(),
            "method_sha256": method_sha256(config), "runs": runs, "seed": seed,
            "budget_scales": [scale_label(f) for f in scales], "budget_splits": [sp.label for sp in splits],
            "products": [n for n in wanted if n in twins],
            "skipped": skipped, "inputs": "synthetic census (checked against its manifest)",
            "noise": "rng.seeded test noise, independent per run, sweep point and key; no ledger, no account",
            "seconds": {k: round(v, 2) for k, v in timing.items()}}
    return Experiment(table, meta, split_table)
