"""Group sizes' and the matrix product's preprocess streamed by state folder (issue #20): the same synthetic census
with every Parquet file directly under the input prefix (one pass) and in its state folder (one partition at a
time) gives identical prepared frames and identical release tables; a preprocess killed between two states
resumes with only the missing states; malformed folder layouts are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from dasflow import synth
from dasflow.config import parse_release_config
from dasflow.errors import InputError
from dasflow.io.files import parquet_folders
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.prepared import PartitionedPrepared
from dasflow.pipeline.run import RunContext, freeze_config
from dasflow.products.groupsize.plugin import PLUGIN as GROUPSIZE
from dasflow.products.plugin import DemoCensus
from dasflow.release.stage import release_stage

REPO = Path(__file__).resolve().parents[2]
STATES = ["01", "02", "44"]
PRODUCTS = ("groupsize", "matrix")
#: synthetic-census folder of each product's Parquet files -> the store prefix the release reads
INPUTS = {"groupsize": ("groupsize/units", "confidential/synth/groupsize/"),
          "matrix": ("topdown/persons", "confidential/synth/topdown/persons/")}


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("census")
    synth.generate(root, persons=6000, seed=3, states=STATES, formats=("groupsize", "topdown"))
    return root


def demo_config(name: str) -> str:
    return resources.files("dasflow.demo_data").joinpath(name).read_text()


def make_store(census: Path, tmp: Path, layout: str) -> Path:
    """A store holding both products' Parquet files, in state folders (``states``) or all directly under the
    input prefix (``flat``, renamed ``{SS}-part-*.parquet``), and the group sizes' public files."""
    store_dir = tmp / layout / "store"
    manifest = json.loads((census / "manifest.json").read_text())
    renamed = {}
    for src, prefix in INPUTS.values():
        target = store_dir / prefix
        if layout == "states":
            shutil.copytree(census / src, store_dir / "confidential/synth" / src)
        else:
            target.mkdir(parents=True)
            for f in sorted((census / src).glob("*/*.parquet")):
                shutil.copy(f, target / f"{f.parent.name}-{f.name}")
                renamed[f.relative_to(census).as_posix()] = f"{src.split('/')[0]}/{f.parent.parent.name}/" \
                    if src.startswith("topdown") else f"{src.split('/')[0]}/"
    # the synthetic census's manifest, with the flat layout's names (seeded test releases need it)
    for entry in manifest["files"]:
        if entry["path"] in renamed:
            name = entry["path"].rsplit("/", 2)
            entry["path"] = renamed[entry["path"]] + f"{name[1]}-{name[2]}"
    (store_dir / "confidential/synth/manifest.json").write_text(json.dumps(manifest))
    store = LocalStore(store_dir)
    totals = manifest["totals"]
    GROUPSIZE.demo_public(store, DemoCensus(states=tuple(STATES), totals=totals))
    raw = {"release_id": "gm", "universe": "US", "store": str(store_dir),
           "inputs": {"groupsize": INPUTS["groupsize"][1], "groupsize_public": "public/groupsize/",
                      "matrix": INPUTS["matrix"][1]},
           "products": [{"name": "groupsize", "config_text": demo_config("groupsize-config.json")},
                        {"name": "matrix", "config_text": demo_config("matrix-config.json")}],
           "cap": {"rho": "1"}, "rng": {"mode": "test", "seed": 5}}
    (tmp / layout / "release.json").write_text(json.dumps(raw))
    return store_dir


def context(store_dir: Path) -> RunContext:
    raw = json.loads((store_dir.parent / "release.json").read_text())
    return freeze_config(parse_release_config(raw), LocalStore(store_dir))


def prepared_frames(ctx: RunContext, product: str) -> dict[str, pd.DataFrame]:
    prepared = stages.load_prepared(ctx, product)
    return {name: prepared[name] for name in prepared}


def release_tables(store_dir: Path) -> dict[str, bytes]:
    root = store_dir / "runs/gm/release"
    return {p.relative_to(root).as_posix(): p.read_bytes() for product in PRODUCTS
            for p in sorted((root / product).rglob("*")) if p.is_file()}


def validate_and_plan(ctx: RunContext) -> None:
    for product in PRODUCTS:
        stages.validate_stage(ctx, product)
    stages.plan_stage(ctx)


@pytest.mark.slow
def test_state_folders_give_the_one_pass_prepared_frames_and_release(census: Path, tmp_path: Path) -> None:
    out = {}
    for layout in ("flat", "states"):
        ctx = context(make_store(census, tmp_path, layout))
        validate_and_plan(ctx)
        manifests = {p: stages.preprocess_stage(ctx, p) for p in PRODUCTS}
        for product in PRODUCTS:
            stages.measure_stage(ctx, product)
            stages.postprocess_stage(ctx, product)
        release_stage(ctx)
        out[layout] = (ctx, manifests)
    (flat, flat_manifests), (st, st_manifests) = out["flat"], out["states"]
    for product in PRODUCTS:
        assert "partitions" not in flat_manifests[product]
        assert st_manifests[product]["partitions"] == STATES
        assert st_manifests[product]["computed_partitions"] == 3
        assert isinstance(stages.load_prepared(st, product), PartitionedPrepared)
        whole, parts = prepared_frames(flat, product), prepared_frames(st, product)
        assert list(whole) == list(parts) and len(whole) == len(stages.product_specs(flat, product))
        for name, frame in whole.items():
            pd.testing.assert_frame_equal(parts[name], frame, check_exact=True)
    # each state's part holds its own households only: the nation's answers are sums of nonzero partial ones
    nation = next(k for k in prepared_frames(flat, "groupsize") if k.endswith("/nation"))
    partial = [st.store.get_parquet(k)["VALUE"] for k, o in st_manifests["groupsize"]["outputs"].items()
               if o["name"] == nation]
    assert len(partial) == 3 and all(int(v.iloc[-1]) > 0 for v in partial)
    assert sum(int(v.iloc[-1]) for v in partial) == int(prepared_frames(flat, "groupsize")[nation]["VALUE"].iloc[-1])
    tables = release_tables(Path(flat.config.store))
    assert len(tables) >= 6 and tables == release_tables(Path(st.config.store))


@pytest.mark.slow
@pytest.mark.parametrize("product", PRODUCTS)
def test_a_preprocess_killed_between_states_redoes_only_the_missing_ones(census: Path, tmp_path: Path,
                                                                         product: str) -> None:
    store_dir = make_store(census, tmp_path, "states")
    script = ("import sys\nfrom pathlib import Path\n"
              "from tests.groupsize.test_partitioned_preprocess import context, validate_and_plan\n"
              "from dasflow.pipeline import stages\n"
              "ctx = context(Path(sys.argv[1]))\nvalidate_and_plan(ctx)\n"
              f"stages.preprocess_stage(ctx, {product!r})\n")
    env = {**os.environ, "DASFLOW_TEST_MODE": "1", "DASFLOW_FAULT_AT": f"stage:preprocess:{product}:part:02",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script, str(store_dir)], env=env, cwd=REPO, check=False)
    assert proc.returncode == -9  # SIGKILLed at the crash point, after state 02's part manifest
    prepared = store_dir / f"runs/gm/prepared/{product}"
    done = {p: (prepared / f"part={p}/manifest.json").read_bytes() for p in ("01", "02")}
    assert not (prepared / "part=44").exists()
    assert not (store_dir / f"runs/gm/manifests/preprocess/{product}.json").exists()
    ctx = context(store_dir)
    manifest = stages.preprocess_stage(ctx, product)
    assert manifest["partitions"] == STATES and manifest["computed_partitions"] == 1
    assert {p: (prepared / f"part={p}/manifest.json").read_bytes() for p in ("01", "02")} == done
    flat = context(make_store(census, tmp_path, "flat"))
    validate_and_plan(flat)
    stages.preprocess_stage(flat, product)
    whole, parts = prepared_frames(flat, product), prepared_frames(ctx, product)
    assert list(whole) == list(parts)
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(parts[name], frame, check_exact=True)
    # a finished part whose file was tampered with is redone, the others are not
    victim = next(prepared.glob("part=44/**/*.parquet"))
    victim.write_bytes(b"not parquet")
    (store_dir / f"runs/gm/manifests/preprocess/{product}.json").unlink()
    assert stages.preprocess_stage(ctx, product)["computed_partitions"] == 1
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(prepared_frames(ctx, product)[name], frame, check_exact=True)


def test_parquet_folders_tell_layouts_apart_and_refuse_malformed_ones(census: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    part = next((census / "groupsize/units/01").glob("*.parquet")).read_bytes()
    with pytest.raises(InputError, match="no unit files"):
        parquet_folders(store, "in/", "unit files")
    store.put("in/a.parquet", part)
    store.put("in/b.parquet", part)
    assert parquet_folders(store, "in/", "unit files") is None
    for state in STATES:
        store.put(f"st/units/{state}/part-00000.parquet", part)
        store.put(f"st/units/{state}/part-00001.parquet", part)
    folders = parquet_folders(store, "st/", "unit files")
    assert folders is not None and list(folders) == STATES
    assert folders["02"] == ["st/units/02/part-00000.parquet", "st/units/02/part-00001.parquet"]
    store.put("st/loose.parquet", part)
    with pytest.raises(InputError, match="one layout only"):
        parquet_folders(store, "st/", "unit files")
    store.delete("st/loose.parquet")
    store.put("st/more/02/part-00000.parquet", part)
    with pytest.raises(InputError, match="same name '02'"):
        parquet_folders(store, "st/", "unit files")


def test_a_partition_skips_only_the_whole_input_invariant(census: Path, tmp_path: Path) -> None:
    """A state's households do not sum to the nation's n, which only the whole input is held to: the partition
    is tabulated over the whole public tree, the unpartitioned input still refuses a wrong n."""
    ctx = context(make_store(census, tmp_path, "states"))
    cfg = ctx.product_config("groupsize")
    public = GROUPSIZE.public_inputs(ctx.store, ctx.config.inputs, cfg)
    product = GROUPSIZE.product(cfg)
    part = GROUPSIZE.partition_inputs(ctx.store, ctx.config.inputs, cfg, "44")
    assert part["households_source"].endswith("units/44/")
    frames = product.prepare(part, public)
    county = frames[next(k for k in frames if k.endswith("/county"))]
    assert county["REGION"].nunique() == len(public["geography"])
    whole = GROUPSIZE.confidential_inputs(ctx.store, ctx.config.inputs, cfg)
    assert 0 < len(part["households"]) < len(whole["households"])
    with pytest.raises(InputError, match="public invariant n"):
        product.prepare(whole, {**public, "n_groups": public["n_groups"] + 1})
    with pytest.raises(InputError, match="no unit files in a folder '99'"):
        GROUPSIZE.partition_inputs(ctx.store, ctx.config.inputs, cfg, "99")
