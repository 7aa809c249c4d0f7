"""PHSafe's preprocess streamed by state (issue #20 items 1-2): the same synthetic census as one national pair of
files and as one folder per state gives identical prepared tabulations and identical release tables; a
preprocess killed between two states resumes with only the missing states; malformed layouts are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dasflow import synth
from dasflow.config import parse_release_config
from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.prepared import PartitionedPrepared
from dasflow.pipeline.run import RunContext, freeze_config
from dasflow.products.phsafe.checks import state_folders
from dasflow.products.phsafe.inputs import LazyTable, read_rows_of, read_table
from dasflow.products.plugin import sum_counts
from dasflow.release.stage import release_stage

REPO = Path(__file__).resolve().parents[2]
STATES = ["01", "02", "44"]


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic census in both PHSafe layouts (national files; one folder per state)."""
    root = tmp_path_factory.mktemp("census")
    synth.generate(root, persons=6000, seed=3, states=STATES, formats=("phsafe", "phsafe_states"))
    return root


def raw_config(store_dir: Path, layout: str) -> dict[str, object]:
    cfg = json.loads(resources.files("dasflow.demo_data").joinpath("phsafe-us-config.json").read_text())
    cfg["state_filter"] = STATES
    return {"release_id": "ph", "universe": "US", "store": str(store_dir),
            "inputs": {"phsafe": f"confidential/synth/{layout}/", "phsafe_geo": "public/phsafe/"},
            "products": [{"name": "phsafe", "config_text": json.dumps(cfg)}], "cap": {"rho": "2"},
            "rng": {"mode": "test", "seed": 4}}


def make_store(census: Path, tmp: Path, layout: str) -> Path:
    """A store holding the census (``layout``'s files only) and its public geography; the release config."""
    store_dir = tmp / layout / "store"
    root = store_dir / "confidential/synth"
    root.mkdir(parents=True)
    shutil.copy(census / "manifest.json", root / "manifest.json")
    shutil.copytree(census / layout, root / layout, ignore=shutil.ignore_patterns("geo.csv"))
    (store_dir / "public/phsafe").mkdir(parents=True)
    shutil.copy(census / layout / "geo.csv", store_dir / "public/phsafe/geo.csv")
    (tmp / layout / "release.json").write_text(json.dumps(raw_config(store_dir, layout)))
    return store_dir


def context(store_dir: Path) -> RunContext:
    raw = json.loads((store_dir.parent / "release.json").read_text())
    return freeze_config(parse_release_config(raw), LocalStore(store_dir))


def release_tables(store_dir: Path) -> dict[str, bytes]:
    root = store_dir / "runs/ph/release/phsafe"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def prepared_frames(ctx: RunContext) -> dict[str, pd.DataFrame]:
    prepared = stages.load_prepared(ctx, "phsafe")
    return {name: prepared[name] for name in prepared}


@pytest.mark.slow
def test_state_partitions_give_the_national_prepared_tables_and_release(census: Path, tmp_path: Path) -> None:
    out = {}
    for layout in ("phsafe", "phsafe_states"):
        ctx = context(make_store(census, tmp_path, layout))
        stages.validate_stage(ctx, "phsafe")
        stages.plan_stage(ctx)
        manifest = stages.preprocess_stage(ctx, "phsafe")
        stages.measure_stage(ctx, "phsafe")
        stages.postprocess_stage(ctx, "phsafe")
        release_stage(ctx)
        out[layout] = (ctx, manifest)
    (nat, nat_manifest), (st, st_manifest) = out["phsafe"], out["phsafe_states"]
    assert "partitions" not in nat_manifest
    assert st_manifest["partitions"] == STATES and st_manifest["computed_partitions"] == 3
    assert {o["part"] for o in st_manifest["outputs"].values()} == set(STATES)
    assert isinstance(stages.load_prepared(st, "phsafe"), PartitionedPrepared)
    whole, parts = prepared_frames(nat), prepared_frames(st)
    assert list(whole) == list(parts) and len(whole) == len(stages.product_specs(nat, "phsafe"))
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(parts[name], frame, check_exact=True)
    assert sum(int(f["COUNT"].sum()) for f in whole.values()) > 0
    # each state's part holds only its own records: the national rows are sums of three nonzero partial counts
    partial = [int(st.store.get_parquet(k)["COUNT"].sum()) for k, o in st_manifest["outputs"].items()
               if o["name"] == "PH1_num/usa_*"]
    assert len(partial) == 3 and all(c > 0 for c in partial)
    assert sum(partial) == int(whole["PH1_num/usa_*"]["COUNT"].sum())
    tables = release_tables(Path(nat.config.store))
    assert tables and tables == release_tables(Path(st.config.store))


@pytest.mark.slow
def test_a_preprocess_killed_between_states_redoes_only_the_missing_ones(census: Path, tmp_path: Path) -> None:
    store_dir = make_store(census, tmp_path, "phsafe_states")
    script = ("import json, sys\nfrom pathlib import Path\n"
              "from tests.phsafe.test_partitioned_preprocess import context\n"
              "from dasflow.pipeline import stages\n"
              "ctx = context(Path(sys.argv[1]))\n"
              "stages.validate_stage(ctx, 'phsafe')\nstages.plan_stage(ctx)\nstages.preprocess_stage(ctx, 'phsafe')\n")
    env = {**os.environ, "DASFLOW_TEST_MODE": "1", "DASFLOW_FAULT_AT": "stage:preprocess:phsafe:part:02",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script, str(store_dir)], env=env, cwd=REPO, check=False)
    assert proc.returncode == -9  # SIGKILLed at the crash point, after state 02's part manifest
    prepared = store_dir / "runs/ph/prepared/phsafe"
    done = {p: (prepared / f"part={p}/manifest.json").read_bytes() for p in ("01", "02")}
    assert not (prepared / "part=44").exists()
    assert not (store_dir / "runs/ph/manifests/preprocess/phsafe.json").exists()
    ctx = context(store_dir)
    manifest = stages.preprocess_stage(ctx, "phsafe")
    assert manifest["partitions"] == STATES and manifest["computed_partitions"] == 1
    assert {p: (prepared / f"part={p}/manifest.json").read_bytes() for p in ("01", "02")} == done
    # the resumed prepared tables equal an uninterrupted national preprocess of the same census
    nat = context(make_store(census, tmp_path, "phsafe"))
    stages.validate_stage(nat, "phsafe")
    stages.plan_stage(nat)
    stages.preprocess_stage(nat, "phsafe")
    whole, parts = prepared_frames(nat), prepared_frames(ctx)
    assert list(whole) == list(parts)
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(parts[name], frame, check_exact=True)
    # a finished part whose file was tampered with is redone, the others are not
    victim = next(prepared.glob("part=44/PH1_num/*.parquet"))
    victim.write_bytes(b"not parquet")
    (store_dir / "runs/ph/manifests/preprocess/phsafe.json").unlink()
    assert stages.preprocess_stage(ctx, "phsafe")["computed_partitions"] == 1
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(prepared_frames(ctx)[name], frame, check_exact=True)


def test_layouts_are_told_apart_and_malformed_ones_refused(census: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for name in ("persons.csv", "units.csv"):
        store.put(f"in/{name}", (census / "phsafe" / name).read_bytes())
    assert state_folders(store, "in/") is None
    for state in STATES:
        for name in ("persons.csv", "units.csv"):
            store.put(f"st/{state}/{name}", (census / "phsafe_states" / state / name).read_bytes())
    assert state_folders(store, "st/") == STATES
    store.put("st/persons.csv", b"RTYPE|MAFID\n")
    with pytest.raises(InputError, match="one layout only"):
        state_folders(store, "st/")
    store.delete("st/persons.csv")
    store.delete("st/44/units.csv")
    with pytest.raises(InputError, match=r"state folder 44 has no units\.csv"):
        state_folders(store, "st/")


def test_a_household_split_across_two_state_folders_is_refused(census: Path, tmp_path: Path) -> None:
    """A person whose unit sits in another folder would join nationally but not per state: refused, not
    silently dropped."""
    store_dir = make_store(census, tmp_path, "phsafe_states")
    folder = store_dir / "confidential/synth/phsafe_states"
    head, first, *rest = (folder / "01/persons.csv").read_text().splitlines()
    (folder / "01/persons.csv").write_text("\n".join([head, *rest]) + "\n")
    with (folder / "02/persons.csv").open("a") as fh:
        fh.write(first + "\n")
    ctx = context(store_dir)
    plugin = ctx.plugin("phsafe")
    cfg = ctx.product_config("phsafe")
    assert plugin.partitions(ctx.store, ctx.config.inputs, {}, cfg) == STATES
    with pytest.raises(InputError, match="spans two partitions") as info:
        plugin.partition_inputs(ctx.store, ctx.config.inputs, cfg, "02")
    assert "02/persons.csv" in str(info.value)
    with pytest.raises(InputError, match="spans two partitions"):  # validation reads every folder: refused too
        plugin.confidential_inputs(ctx.store, ctx.config.inputs, cfg)


def test_sum_counts_adds_aligned_tabulations_and_refuses_misaligned_ones() -> None:
    a = pd.DataFrame({"REGION_ID": ["01", "02", "1"], "DATA_CELL": [1, 1, 1], "COUNT": np.array([3, 0, 3])})
    b = pd.DataFrame({"REGION_ID": ["01", "02", "1"], "DATA_CELL": [1, 1, 1], "COUNT": np.array([0, 5, 5])})
    out = sum_counts("k", [a, b])
    assert out["COUNT"].tolist() == [3, 5, 8] and out["COUNT"].dtype == np.int64
    assert a["COUNT"].tolist() == [3, 0, 3]  # the parts are not modified
    with pytest.raises(IntegrityError, match="partition 1"):
        sum_counts("k", [a, b.iloc[[1, 0, 2]]])
    with pytest.raises(IntegrityError, match="no partition"):
        sum_counts("k", [])


def test_a_partition_reads_only_its_units_geo_rows_and_the_plan_none(census: Path, tmp_path: Path) -> None:
    """The public geo.csv is read whole only when used (validation); a partition streams the rows of its own
    units' MAFIDs, which are exactly the whole file's rows of those MAFIDs."""
    store_dir = make_store(census, tmp_path, "phsafe_states")
    ctx = context(store_dir)
    plugin, cfg = ctx.plugin("phsafe"), ctx.product_config("phsafe")
    public = plugin.public_inputs(ctx.store, ctx.config.inputs, cfg)
    assert isinstance(public["geo"], LazyTable) and public["geo"]._columns is None
    stages.product_specs(ctx, "phsafe")  # the plan
    assert ctx.post_public("phsafe")["geo"]._columns is None
    whole = read_table(store_dir / "public/phsafe/geo.csv", "geo")
    assert dict(public["geo"]).keys() == whole.keys()
    seen = 0
    for state in STATES:
        part = plugin.partition_inputs(ctx.store, ctx.config.inputs, cfg, state)
        mine = np.isin(whole["MAFID"], part["units"]["MAFID"])
        assert 0 < len(part["geo"]["MAFID"]) == int(mine.sum()) < len(whole["MAFID"])
        for col, values in whole.items():
            np.testing.assert_array_equal(part["geo"][col], values[mine])
            assert part["geo"][col].dtype == values.dtype
        seen += len(part["geo"]["MAFID"])
    assert seen == len(whole["MAFID"])


@pytest.mark.parametrize("layout", ["fixed", "comma", "ragged"])
def test_read_rows_of_gives_the_rows_read_table_gives(census: Path, tmp_path: Path, layout: str) -> None:
    """Fixed-width lines are scanned block by block; any other file (comma-delimited, a line of another width)
    goes through the whole-file reader: the same rows and values either way."""
    text = (census / "phsafe_states/geo.csv").read_text()
    if layout == "comma":
        text = text.replace("|", ",")
    elif layout == "ragged":
        text = text.replace("|0", "| 0", 1)  # not fixed-width, and not a valid value: refused whole
    path = tmp_path / "geo.csv"
    path.write_text(text)
    if layout == "ragged":
        with pytest.raises(InputError):
            read_rows_of(path, "geo", np.zeros(0, dtype=np.int64))
        return
    whole = read_table(path, "geo")
    pick = np.unique(whole["MAFID"])[::7][::-1].copy()
    rows = read_rows_of(path, "geo", pick)
    keep = np.isin(whole["MAFID"], pick)
    assert keep.sum() == len(pick) > 0
    for col, values in whole.items():
        np.testing.assert_array_equal(rows[col], values[keep])
    assert all(len(v) == 0 for v in read_rows_of(path, "geo", np.zeros(0, dtype=np.int64)).values())
