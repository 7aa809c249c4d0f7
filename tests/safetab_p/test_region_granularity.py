"""Census region granularity (issue 23): each region type tabulates only the iterations of its granularity —
detailed (USA, STATE, PR-STATE): COARSE_ONLY = False; coarse (COUNTY, TRACT, PLACE, AIANNH, PR-*): DETAILED_ONLY
= False (DAS_2020_DDHCA safetab_utils ``REGION_GRANULARITY_MAPPING`` and the flat maps of
``safetab_p_analytics``). Checked from the iteration files independently of the product's code, on the toy and
real 2020 files; stability and per-group budget re-derived on the restricted flat maps and tested by whole-domain
and neighbour enumeration (US and PR); the opt-out is off by default and named in the plan; toy and synthetic
(US + PR) runs publish exactly the rule's groups, with the counts of the rows both behaviours share unchanged."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dasflow import synth
from dasflow.cli import main
from dasflow.errors import InputError
from dasflow.privacy import rng
from dasflow.products.safetab_p.config import SafeTabPConfig, load_config
from dasflow.products.safetab_p.iterations import (
    PACKAGED_DIR,
    IterationIndex,
    LevelIndex,
    race_iterations,
    stability_bound,
)
from dasflow.products.safetab_p.plan import level_of
from dasflow.products.safetab_p.product import (
    SafeTabP,
    ground_truth_config,
    load_inputs,
    load_public,
    run_universe,
)
from dasflow.products.safetab_p.regions import ALL_REGION_TYPES, REGION_GRANULARITY
from dasflow.products.safetab_p.tabulate import merged
from tests.safetab_p.helpers import (
    TOY,
    TOY_ZCDP,
    config,
    person,
    persons_table,
    public,
    real_iterations,
    toy_config_dict,
    toy_iterations,
    write_dir,
)

#: the Census mapping, restated from DAS_2020_DDHCA safetab_utils/regions.py (public facts)
CENSUS_GRANULARITY = {"USA": "detailed", "STATE": "detailed", "COUNTY": "coarse", "TRACT": "coarse",
                      "PLACE": "coarse", "AIANNH": "coarse", "PR-STATE": "detailed", "PR-COUNTY": "coarse",
                      "PR-TRACT": "coarse", "PR-PLACE": "coarse"}
ITER_FILES = ("race-characteristic-iterations.txt", "ethnicity-characteristic-iterations.txt")


def _flags(directory: Path) -> pd.DataFrame:
    """ITERATION_CODE, LEVEL, DETAILED_ONLY, COARSE_ONLY of both iteration files, read directly."""
    frames = [pd.read_csv(directory / f, sep="|", dtype=str, keep_default_na=False) for f in ITER_FILES]
    cols = ["ITERATION_CODE", "LEVEL", "DETAILED_ONLY", "COARSE_ONLY"]
    out: pd.DataFrame = pd.concat([f[cols] for f in frames], ignore_index=True).apply(lambda s: s.str.strip())
    return out


def _census_set(flags: pd.DataFrame, region_type: str, level: int) -> set[str]:
    """The iteration codes the Census tabulates at (region type, level): its flat-map filter."""
    f = flags[flags.LEVEL.eq(str(level))]
    if CENSUS_GRANULARITY[region_type] == "detailed":
        return set(f.ITERATION_CODE[f.COARSE_ONLY == "False"])
    return set(f.ITERATION_CODE[f.DETAILED_ONLY == "False"])


def _cfg(ignore: bool = False, budget: int = 1) -> SafeTabPConfig:
    raw = toy_config_dict("zcdp")
    for k in list(raw):
        if k.startswith("privacy_budget_p_level"):
            raw[k] = budget
    raw["run_pr"] = True
    if ignore:
        raw["ignore_region_granularity"] = True
    return config(raw)


def test_mapping_is_the_census_mapping() -> None:
    assert dict(REGION_GRANULARITY) == CENSUS_GRANULARITY
    assert set(REGION_GRANULARITY) == set(ALL_REGION_TYPES)


@pytest.mark.parametrize("which", ["toy", "real"])
def test_iteration_sets_follow_the_files(which: str) -> None:
    """Each (region type, level) tabulates exactly the Census filter of the files (read here with pandas)."""
    index, directory = (toy_iterations(), TOY_ZCDP) if which == "toy" else (real_iterations(), PACKAGED_DIR)
    flags = _flags(directory)
    cfg = _cfg()
    for rt in ALL_REGION_TYPES:
        for lv in (1, 2):
            level = level_of(cfg, index, rt, lv)
            assert set(level.iteration_codes) == _census_set(flags, rt, lv), (rt, lv)
            assert len(set(level.iteration_codes)) == level.n_iterations
            if CENSUS_GRANULARITY[rt] == "coarse":
                assert not level.total_only.any()  # no TotalOnly (DETAILED_ONLY) group below the state
    if which == "real":  # the 2020 files: 798 DETAILED_ONLY iterations, none COARSE_ONLY
        assert int((flags.DETAILED_ONLY == "True").sum()) == 798
        assert int((flags.COARSE_ONLY == "True").sum()) == 0
        assert level_of(cfg, index, "COUNTY", 2).n_iterations == 2944 - 794
        assert level_of(cfg, index, "STATE", 2).n_iterations == 2944


def _all_records(n_codes: int, r: int) -> np.ndarray:
    combos = [c for k in range(1, r + 1) for c in itertools.combinations(range(n_codes), k)]
    arr = np.full((len(combos), 8), -1, dtype=np.int64)
    for i, c in enumerate(combos):
        arr[i, : len(c)] = c
    return arr


def _flat_map_sets(level: LevelIndex, combos: np.ndarray) -> list[set[str]]:
    ptr, idx = race_iterations(level, combos)
    return [set(level.iteration_codes[idx[ptr[i]:ptr[i + 1]]]) for i in range(len(combos))]


@pytest.mark.parametrize("rt", ["USA", "COUNTY"])
def test_restricted_flat_map_and_stability_by_enumeration(rt: str) -> None:
    """Over EVERY record of the toy domain (≤ 3 of its 27 codes, every QSPAN code): the restricted flat map is
    the full one intersected with the region type's set, and the stability computed on the restricted map is
    exactly max |g_{R,L}(r)| (the toy files have ≤ 1 alone and ≤ 1 AOIC iteration per code: the exact case)."""
    index = toy_iterations()
    cfg = _cfg()
    combos = _all_records(len(index.codes), 3)
    for lv in (1, 2):
        full = index.levels[lv]
        part = level_of(cfg, index, rt, lv)
        keep = set(part.iteration_codes)
        full_sets, part_sets = _flat_map_sets(full, combos), _flat_map_sets(part, combos)
        assert all(p == f & keep for p, f in zip(part_sets, full_sets, strict=True))
        eth = [set(part.iteration_codes[part.eth_idx[part.eth_ptr[c]:part.eth_ptr[c + 1]]])
               for c in range(len(index.codes))]
        assert all(e <= keep for e in eth)
        brute = max(len(p) for p in part_sets) + max(len(e) for e in eth)
        assert stability_bound(part, 3) == brute, (rt, lv)


def _random_people(rng_: np.random.Generator, index: IterationIndex, blocks: list[str], n: int) -> list[list[str]]:
    rows = []
    for _ in range(n):
        k = int(rng_.choice([1, 1, 2, 3, 8]))
        races = [str(c) for c in rng_.choice(index.codes, size=k, replace=False)]
        rows.append(person(blocks[int(rng_.integers(len(blocks)))], races, str(rng_.choice(index.codes)),
                           age=int(rng_.integers(0, 116)), sex=int(rng_.integers(1, 3))))
    return rows


BLOCKS = [("010010000010001", "22800", "0001"), ("010010000020001", "22800", "9999"),
          ("010020000010001", "99999", "0002"), ("020010000010001", "33300", "0002"),
          ("720310509012040", "10001", "9999"), ("720330509012041", "10002", "9999")]


@pytest.mark.parametrize(("universe", "seed"), [("US", 0), ("US", 1), ("PR", 2), ("PR", 3)])
def test_neighbours_sensitivity_and_group_budget(universe: str, seed: int) -> None:
    """Add/remove one person (toy codes, which have DETAILED_ONLY and COARSE_ONLY iterations): per (region
    type, level) at most s groups change, each by exactly +1 in one cell, only groups of the region type's
    iteration set; and the planned per-group costs of the changed groups sum to at most ρ_i (zCDP: Σ Δ²·ρ_i/s
    with Δ = 1; TotalOnly ρ_i/s, two-stage γρ_i/s + (1−γ)ρ_i/s)."""
    index = toy_iterations()
    cfg = _cfg()
    pub = public(cfg, index, BLOCKS, universe)
    flags = _flags(TOY_ZCDP)
    blocks = [b for b, _, _ in BLOCKS if (b[:2] == "72") == (universe == "PR")]
    rows = _random_people(np.random.default_rng(seed), index, blocks, 40)
    product = SafeTabP()
    specs = {s.key: s for s in product.plan(cfg, pub)}
    base = product.prepare({"persons": persons_table(rows), "source": "p"}, pub)
    worst = 0
    for i in range(0, 40, 4):
        nb = product.prepare({"persons": persons_table(rows[:i] + rows[i + 1:]), "source": "p"}, pub)
        for key, frame in base.items():
            if not key.startswith("counts/"):
                continue
            _, _, rt, lv = key.split("/")
            s2 = specs[f"safetab-p/{universe}/{rt}/{lv}/stage2"]
            d = s2.detail
            level = level_of(cfg, index, rt, int(lv))
            assert d["stability"] == stability_bound(level, cfg.max_race_codes)
            a, b = merged(frame), merged(nb[key])
            m = a.merge(b, on=["GROUP", "CELL"], how="outer", suffixes=("_a", "_b")).fillna(0)
            diff = m[m.COUNT_a != m.COUNT_b]
            assert ((diff.COUNT_a - diff.COUNT_b) == 1).all() and diff.GROUP.is_unique
            assert len(diff) <= d["stability"]
            its = set(level.iteration_codes[diff.GROUP.to_numpy() % level.n_iterations])
            assert its <= _census_set(flags, rt, int(lv)), (rt, lv)
            to = level.total_only[diff.GROUP.to_numpy() % level.n_iterations]
            cost = int(to.sum()) * d["total_only_budget"] + int((~to).sum()) * (
                specs[f"safetab-p/{universe}/{rt}/{lv}/stage1"].detail["per_query_budget"] + d["per_query_budget"])
            assert cost <= d["level_budget"]
            worst = max(worst, len(diff))
    assert worst >= 2


def test_opt_out_is_off_by_default_and_named_in_the_plan() -> None:
    index = toy_iterations()
    on, off = _cfg(), _cfg(ignore=True)
    assert on.ignore_region_granularity is False
    pub_on, pub_off = public(on, index), public(off, index)
    plan_on, plan_off = SafeTabP().plan(on, pub_on), SafeTabP().plan(off, pub_off)
    assert [s.key for s in plan_on] == [s.key for s in plan_off]
    assert all(s.level == f"({s.detail['region_type']}, {s.detail['iteration_level']})" for s in plan_on)
    assert all("region granularity off" in s.level for s in plan_off)  # the certificate lists plan levels
    assert {s.detail["iteration_set"] for s in plan_off} == {"all"}
    county_on = next(s for s in plan_on if s.key.endswith("COUNTY/2/stage2"))
    county_off = next(s for s in plan_off if s.key.endswith("COUNTY/2/stage2"))
    assert county_on.detail["n_total_only_iterations"] == 0 < county_off.detail["n_total_only_iterations"]
    assert county_on.detail["n_iterations"] < county_off.detail["n_iterations"]
    raw = toy_config_dict("zcdp")
    raw["ignore_region_granularity"] = "yes"
    with pytest.raises(InputError, match="ignore_region_granularity"):
        config(raw)


def _t1(out: Path, universe: str) -> pd.DataFrame:
    return pd.read_csv(out / "t1" / f"t1_{universe}.csv", sep="|", dtype=str, keep_default_na=False)


def test_toy_cli_us_and_pr_publish_the_rule(tmp_path: Path) -> None:
    """Toy inputs through ``dasflow safetab-p execute --ground-truth`` (US and PR runs): every region of every
    tabulated (region type, level) has exactly the Census set of iterations (no suppression in the twin);
    the manifest states the granularity; the opt-out restores the superset with the same shared counts."""
    flags = _flags(TOY_ZCDP)
    outs = {}
    for name, extra in (("rule", {}), ("all", {"ignore_region_granularity": True})):
        raw = toy_config_dict("zcdp") | {"run_pr": True, **extra}
        params = write_dir(tmp_path / f"params-{name}", raw, iteration_dir=TOY_ZCDP)
        outs[name] = tmp_path / name
        assert main(["safetab-p", "execute", "--ground-truth", str(params), str(TOY), str(outs[name])]) == 0
    cfg = config(toy_config_dict("zcdp") | {"run_pr": True})
    manifest = json.loads((outs["rule"] / "manifest.json").read_text())
    for universe in ("US", "PR"):
        assert manifest["runs"][universe]["region_granularity"] == {
            rt: g for rt, g in CENSUS_GRANULARITY.items() if rt.startswith("PR-") == (universe == "PR")}
        t1, t1_all = _t1(outs["rule"], universe), _t1(outs["all"], universe)
        for (rt, lv), budget in cfg.budgets.items():
            if budget == 0 or rt.startswith("PR-") != (universe == "PR"):
                continue
            expect = _census_set(flags, rt, lv)
            codes = set(flags.ITERATION_CODE[flags.LEVEL.eq(str(lv))])
            sub = t1[t1.REGION_TYPE.eq(rt) & t1.ITERATION_CODE.isin(codes)]
            assert len(sub) > 0
            for _, its in sub.groupby("REGION_ID").ITERATION_CODE:
                assert set(its) == expect, (universe, rt, lv)
        keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
        joined = t1.merge(t1_all, on=keys, how="left", suffixes=("", "_all"))
        assert joined.COUNT_all.notna().all() and joined.COUNT.eq(joined.COUNT_all).all()
        assert len(t1_all) > len(t1)
    off = json.loads((outs["all"] / "manifest.json").read_text())["runs"]["US"]["region_granularity"]
    assert off.startswith("off")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4,000-person synthetic census (dasflow.synth, DC and Puerto Rico) with the 2020 production config."""
    root = tmp_path_factory.mktemp("gran")
    synth.generate(root / "gen", persons=4_000, seed=23, states=["11", "72"], formats=("safetab_p",))
    raw = json.loads((PACKAGED_DIR / "production-config.json").read_text())
    raw["run_pr"] = True
    raw["state_filter_us"] = ["11"]
    for rt in ("tract", "place", "pr_tract", "pr_place"):  # keep the test fast (level-2 domains are large)
        raw[f"privacy_budget_p_level_2_{rt}"] = 0
    params = root / "params"
    params.mkdir()
    (params / "config.json").write_text(json.dumps(raw))
    return root


@pytest.mark.parametrize("universe", ["US", "PR"])
def test_synthetic_ground_truth_follows_the_rule(synthetic: Path, universe: str) -> None:
    """2020 iteration files on synthetic persons: every (region, level) of the twin has exactly the Census
    set, and every count the rule keeps equals the count of the old (all-iterations) twin."""
    params, data = synthetic / "params", synthetic / "gen" / "safetab_p"
    flags = _flags(PACKAGED_DIR)
    inputs = load_inputs(data)
    tables = {}
    for ignore in (False, True):
        cfg = ground_truth_config(dataclasses.replace(load_config(params), ignore_region_granularity=ignore))
        pub = load_public(params, data, universe, cfg)  # type: ignore[arg-type]
        tables[ignore] = run_universe(pub, inputs, rng.seeded(0)).tables["t1"]
    t1, t1_all = tables[False], tables[True]
    level_of_code = dict(zip(flags.ITERATION_CODE, flags.LEVEL, strict=True))
    t1 = t1.assign(LEVEL=t1.ITERATION_CODE.map(level_of_code))
    seen = 0
    for (rt, lv), part in t1.groupby(["REGION_TYPE", "LEVEL"]):
        expect = _census_set(flags, str(rt), int(str(lv)))
        for _, its in part.groupby("REGION_ID").ITERATION_CODE:
            assert set(its) == expect, (rt, lv)
            seen += 1
    assert seen > 0 and set(t1.REGION_TYPE) >= ({"USA", "STATE", "COUNTY"} if universe == "US"
                                                 else {"PR-STATE", "PR-COUNTY"})
    keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
    joined = t1.merge(t1_all, on=keys, how="left", suffixes=("", "_all"))
    assert joined.COUNT.eq(joined.COUNT_all).all()
    dropped = t1_all.merge(t1[keys], on=keys, how="left", indicator=True)
    dropped = dropped[dropped["_merge"] == "left_only"]
    detailed_only = set(flags.ITERATION_CODE[flags.DETAILED_ONLY == "True"])
    assert len(dropped) > 0 and set(dropped.ITERATION_CODE) <= detailed_only
    assert set(dropped.REGION_TYPE).isdisjoint({"USA", "STATE", "PR-STATE"})


@pytest.mark.parametrize("ignore", [False, True])
def test_release_certificate_states_the_granularity_choice(tmp_path: Path, ignore: bool) -> None:
    """Through the release DAG (toy inputs, seeded test release): the frozen config carries the opt-out, the
    certificate's plan levels say "region granularity off" exactly when it is on, and the released t1 follows
    the rule by default."""
    from dasflow.config import parse_release_config
    from dasflow.pipeline.run import freeze_config
    from dasflow.release.certificate import certificate
    from tests.dag.helpers import release_files
    from tests.dag.test_pipeline import run_all
    from tests.dag.test_products_in_dag import safetab_release

    store, raw = safetab_release(tmp_path, "zcdp")
    if ignore:
        cfg = json.loads(raw["products"][0]["config_text"])
        cfg["ignore_region_granularity"] = True
        raw["products"][0]["config_text"] = json.dumps(cfg)
    ctx = freeze_config(parse_release_config(raw), store)
    run_all(ctx)
    md, _ = certificate(ctx)
    assert ("region granularity off" in md) is ignore
    files = release_files(tmp_path / "store", raw["release_id"])
    t1_name = next(n for n in files if n.startswith("safetab-p/") and "t1" in n)
    t1 = pd.read_csv(io.BytesIO(files[t1_name]), sep="|", dtype=str, keep_default_na=False)
    below = t1[~t1.REGION_TYPE.isin(["USA", "STATE"])]
    detailed_only = set(_flags(TOY_ZCDP).query("DETAILED_ONLY == 'True'").ITERATION_CODE)
    assert len(below) > 0 and bool(set(below.ITERATION_CODE) & detailed_only) is ignore
