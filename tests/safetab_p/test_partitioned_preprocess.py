"""SafeTab-P's preprocess prepared one state file at a time (issue #20 items 1-2): the same synthetic census as one
national ``person-records.txt`` and as ``person-records/{SS}.txt`` gives identical prepared tabulations (USA rows:
sums of nonzero per-state partial counts) and byte-identical post-processed estimates (the release tables are
a function of them); a preprocess killed between two states
resumes with only the missing states; the combine refuses parts whose public domains differ."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
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
from dasflow.pipeline.inputs import mark_synthetic
from dasflow.pipeline.prepared import PartitionedPrepared
from dasflow.pipeline.run import RunContext, freeze_config
from dasflow.products.safetab_p.plugin import PLUGIN
from dasflow.products.safetab_p.product import slice_geography
from dasflow.products.safetab_p.records import (
    GRFC_COLUMNS,
    PERSON_COLUMNS,
    Geography,
    LazyGeography,
    load_geography,
    read_pipe_file,
)
from dasflow.products.safetab_p.tabulate import SPARSE_COLUMNS, merged, sum_cells

REPO = Path(__file__).resolve().parents[2]
STATES = ["01", "02", "44"]
LAYOUTS = {"safetab_p": "person-records.txt", "safetab_p_states": "person-records"}


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic census in both SafeTab-P layouts (one national file; one file per state)."""
    root = tmp_path_factory.mktemp("census")
    synth.generate(root, persons=6000, seed=3, states=STATES, formats=tuple(LAYOUTS))
    return root


def raw_config(store_dir: Path, layout: str, states: list[str] = STATES) -> dict[str, object]:
    cfg = json.loads(resources.files("dasflow.demo_data").joinpath("safetab-p-config.json").read_text())
    cfg["state_filter_us"] = states
    cfg["thresholds_p"] = {k: [3, 10, 40] for k in cfg["thresholds_p"]}  # every stage-2 detail level occurs
    return {"release_id": "st", "universe": "US", "store": str(store_dir),
            "inputs": {"safetab-p": f"confidential/synth/{layout}/", "safetab-p_public": "public/safetab-p/"},
            "products": [{"name": "safetab-p", "config_text": json.dumps(cfg)}], "cap": {"rho": "100"},
            "rng": {"mode": "test", "seed": 4}}


def make_store(census: Path, tmp: Path, layout: str, states: list[str] = STATES) -> Path:
    """A store holding the census (``layout``'s person records only) and its public GRF-C; the release config."""
    store_dir = tmp / layout / "store"
    root = store_dir / "confidential/synth"
    root.mkdir(parents=True)
    shutil.copy(census / "manifest.json", root / "manifest.json")
    shutil.copytree(census / layout, root / layout, ignore=shutil.ignore_patterns("GRF-C.txt"))
    (store_dir / "public/safetab-p").mkdir(parents=True)
    shutil.copy(census / layout / "GRF-C.txt", store_dir / "public/safetab-p/GRF-C.txt")
    (tmp / layout / "release.json").write_text(json.dumps(raw_config(store_dir, layout, states)))
    return store_dir


def context(store_dir: Path) -> RunContext:
    raw = json.loads((store_dir.parent / "release.json").read_text())
    return freeze_config(parse_release_config(raw), LocalStore(store_dir))


def estimates(store_dir: Path) -> dict[str, bytes]:
    """The post-processed estimates' files (the release tables are a deterministic function of them)."""
    root = store_dir / "runs/st/postprocessed/safetab-p"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def prepared_frames(ctx: RunContext) -> dict[str, pd.DataFrame]:
    prepared = stages.load_prepared(ctx, "safetab-p")
    return {name: prepared[name] for name in prepared}


def assert_national_prepared(census: Path, tmp_path: Path, ctx: RunContext) -> None:
    """``ctx``'s prepared tabulations equal a preprocess of the same census as one national file."""
    nat = context(make_store(census, tmp_path, "safetab_p"))
    stages.validate_stage(nat, "safetab-p")
    stages.plan_stage(nat)
    stages.preprocess_stage(nat, "safetab-p")
    whole, parts = prepared_frames(nat), prepared_frames(ctx)
    assert list(whole) == list(parts)
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(parts[name], frame, check_exact=True)


@pytest.mark.slow
def test_state_files_give_the_national_prepared_tabulations_and_release(census: Path, tmp_path: Path) -> None:
    out = {}
    for layout in LAYOUTS:
        ctx = context(make_store(census, tmp_path, layout))
        stages.validate_stage(ctx, "safetab-p")
        stages.plan_stage(ctx)
        manifest = stages.preprocess_stage(ctx, "safetab-p")
        stages.measure_stage(ctx, "safetab-p")
        stages.postprocess_stage(ctx, "safetab-p")
        out[layout] = (ctx, manifest)
    (nat, nat_manifest), (st, st_manifest) = out["safetab_p"], out["safetab_p_states"]
    assert "partitions" not in nat_manifest
    assert st_manifest["partitions"] == STATES and st_manifest["computed_partitions"] == 3
    assert {o["part"] for o in st_manifest["outputs"].values()} == set(STATES)
    # the public domains (region IDs, iteration lists) are written once, by the first partition
    assert {o["part"] for o in st_manifest["outputs"].values() if not o["name"].startswith("counts/")} == {STATES[0]}
    assert isinstance(stages.load_prepared(st, "safetab-p"), PartitionedPrepared)
    whole, parts = prepared_frames(nat), prepared_frames(st)
    assert list(whole) == list(parts)
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(parts[name], frame, check_exact=True)
        if name.startswith("counts/"):  # one row per (GROUP, CELL), sorted: the tabulation, not records
            key = frame["GROUP"].to_numpy() * 46 + frame["CELL"].to_numpy()
            assert (np.diff(key) > 0).all()
    # each state's part holds only its own persons: the USA counts are sums of three nonzero partial counts
    partial = [st.store.get_parquet(k) for k, o in st_manifest["outputs"].items() if o["name"] == "counts/US/USA/1"]
    assert len(partial) == 3 and all(int(p["COUNT"].sum()) > 0 for p in partial)
    assert sum(int(p["COUNT"].sum()) for p in partial) == int(whole["counts/US/USA/1"]["COUNT"].sum())
    # stage 2 asked for every detail level of the adaptive design
    stat = set()
    for m in stages.load_measurements(st, "safetab-p").values():
        if "STAT_LEVEL" in m.table:
            stat |= set(m.table["STAT_LEVEL"].unique().tolist())
    assert {0, 1, 2, 3} <= stat
    post = estimates(Path(nat.config.store))
    assert any(name.endswith(".parquet") for name in post)
    assert post == estimates(Path(st.config.store))


@pytest.mark.slow
def test_a_preprocess_killed_between_states_redoes_only_the_missing_ones(census: Path, tmp_path: Path) -> None:
    store_dir = make_store(census, tmp_path, "safetab_p_states")
    script = ("import sys\nfrom pathlib import Path\n"
              "from tests.safetab_p.test_partitioned_preprocess import context\n"
              "from dasflow.pipeline import stages\n"
              "ctx = context(Path(sys.argv[1]))\n"
              "stages.validate_stage(ctx, 'safetab-p')\nstages.plan_stage(ctx)\n"
              "stages.preprocess_stage(ctx, 'safetab-p')\n")
    env = {**os.environ, "DASFLOW_TEST_MODE": "1", "DASFLOW_FAULT_AT": "stage:preprocess:safetab-p:part:02",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script, str(store_dir)], env=env, cwd=REPO, check=False)
    assert proc.returncode == -9  # SIGKILLed at the crash point, after state 02's part manifest
    prepared = store_dir / "runs/st/prepared/safetab-p"
    done = {p: (prepared / f"part={p}/manifest.json").read_bytes() for p in ("01", "02")}
    assert not (prepared / "part=44").exists()
    assert not (store_dir / "runs/st/manifests/preprocess/safetab-p.json").exists()
    ctx = context(store_dir)
    manifest = stages.preprocess_stage(ctx, "safetab-p")
    assert manifest["partitions"] == STATES and manifest["computed_partitions"] == 1
    assert {p: (prepared / f"part={p}/manifest.json").read_bytes() for p in ("01", "02")} == done
    # the resumed prepared tabulations equal an uninterrupted national preprocess of the same census
    assert_national_prepared(census, tmp_path, ctx)


def test_files_of_several_states_are_encoded_slice_by_slice_against_their_states(
        census: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A split input whose files are not one state each (``a``: 01 and the first rows of 44; ``b``: 02 and the
    rest of 44), read in slices of 700 rows so that slices name one state, two states or a new one: each slice
    is encoded against the blocks of the states it names, and the prepared tabulations equal the national
    file's."""
    header, *rows = (census / "safetab_p/person-records.txt").read_text().splitlines()
    by_state = {s: [r for r in rows if r.split("|")[3] == s] for s in STATES}
    half = len(by_state["44"]) // 2
    files = {"a": by_state["01"] + by_state["44"][:half], "b": by_state["02"] + by_state["44"][half:]}
    store_dir = make_store(census, tmp_path, "safetab_p_states")
    folder = store_dir / "confidential/synth/safetab_p_states/person-records"
    for f in folder.glob("*.txt"):
        f.unlink()
    for name, rows_of in files.items():
        (folder / f"{name}.txt").write_text("\n".join([header, *rows_of]) + "\n")
    mark_synthetic(LocalStore(store_dir), "confidential/synth/", generator_note="test: the census re-split")
    monkeypatch.setattr("dasflow.products.safetab_p.product.SLICE_ROWS", 700)
    built: list[tuple[int, ...]] = []
    part_of = LazyGeography.part

    def part(self: LazyGeography, states: Sequence[int]) -> Geography:
        built.append(tuple(states))
        return part_of(self, states)

    monkeypatch.setattr(LazyGeography, "part", part)
    ctx = context(store_dir)
    stages.validate_stage(ctx, "safetab-p")
    stages.plan_stage(ctx)
    manifest = stages.preprocess_stage(ctx, "safetab-p")
    assert manifest["partitions"] == ["a", "b"]
    # a geography per change of the slices' states (a slice of one state, slices across two), never all three
    assert {(1,), (1, 44), (2, 44)} <= set(built) and all(len(states) < 3 for states in built)
    assert_national_prepared(census, tmp_path, ctx)


def test_sum_cells_adds_tabulations_and_the_combine_checks_public_domains() -> None:
    a = pd.DataFrame({"GROUP": np.array([0, 0, 5], np.int64), "CELL": np.array([1, 3, 1], np.int16),
                      "COUNT": np.array([2, 1, 4], np.int64)})
    b = pd.DataFrame({"GROUP": np.array([0, 7], np.int64), "CELL": np.array([1, 0], np.int16),
                      "COUNT": np.array([3, 1], np.int64)})
    out = sum_cells([a, b])
    assert list(out.columns) == list(SPARSE_COLUMNS)
    assert out.to_dict("list") == {"GROUP": [0, 0, 5, 7], "CELL": [1, 3, 1, 0], "COUNT": [5, 1, 4, 1]}
    assert out["COUNT"].dtype == np.int64 and out["CELL"].dtype == np.int16
    pd.testing.assert_frame_equal(out, merged(pd.concat([a, b])), check_dtype=False)
    assert PLUGIN.combine_prepared("counts/US/USA/1", [a, b]).equals(out)
    regions = pd.DataFrame({"REGION_ID": ["01", "02"]})
    assert PLUGIN.combine_prepared("regions/US/STATE", [regions, regions.copy()]).equals(regions)
    with pytest.raises(IntegrityError, match="partition 1"):
        PLUGIN.combine_prepared("regions/US/STATE", [regions, regions.iloc[::-1]])
    with pytest.raises(IntegrityError, match="no partition"):
        PLUGIN.combine_prepared("counts/US/USA/1", [])


def test_the_state_layout_holds_the_national_records_one_file_per_state(census: Path) -> None:
    header, *rows = (census / "safetab_p/person-records.txt").read_text().splitlines()
    files = sorted((census / "safetab_p_states/person-records").glob("*.txt"))
    assert [f.stem for f in files] == STATES
    split = []
    for f in files:
        head, *part = f.read_text().splitlines()
        assert head == header and part and {r.split("|")[3] for r in part} == {f.stem}
        split += part
    assert split == rows
    assert (census / "safetab_p_states/GRF-C.txt").read_bytes() == (census / "safetab_p/GRF-C.txt").read_bytes()


def test_the_plan_streams_region_ids_and_a_partition_reads_its_states_blocks(census: Path, tmp_path: Path) -> None:
    """The public geography holds the national region IDs only (one streamed pass over GRF-C; the plan needs
    no block); a partition's geography holds its states' blocks, each with the row the whole GRF-C gives it."""
    store_dir = make_store(census, tmp_path, "safetab_p_states")
    ctx = context(store_dir)
    cfg = ctx.product_config("safetab-p")
    public = PLUGIN.public_inputs(ctx.store, ctx.config.inputs, cfg)
    lazy = public["geography"]
    assert isinstance(lazy, LazyGeography)
    stages.product_specs(ctx, "safetab-p")  # the plan
    assert "block_keys" not in vars(lazy) and "block_keys" not in vars(ctx.post_public("safetab-p")["geography"])
    grfc = store_dir / "public/safetab-p/GRF-C.txt"
    whole = load_geography(read_pipe_file(grfc, GRFC_COLUMNS, extra_columns=True), "US", STATES, str(grfc))
    assert lazy.region_ids.keys() == whole.region_ids.keys()
    for rt, ids in whole.region_ids.items():
        np.testing.assert_array_equal(lazy.region_ids[rt], ids)
    blocks = 0
    for state in STATES:
        part_inputs = PLUGIN.partition_inputs(ctx.store, ctx.config.inputs, cfg, state)
        assert part_inputs["slice_states"] is True  # each slice is encoded against its own states' blocks
        assert part_inputs["public_frames"] == (state == STATES[0])  # one copy of the public domains
        part = slice_geography(part_inputs, public)(read_pipe_file(part_inputs["person_files"][0], PERSON_COLUMNS))
        assert part.region_ids is lazy.region_ids and 0 < len(part.block_keys) < len(whole.block_keys)
        rows = whole.block_index(part.block_keys)
        assert (rows >= 0).all() and (whole.block_keys[rows] // 10 ** 13 == int(state)).all()
        for rt in whole.region_ids:
            np.testing.assert_array_equal(part.region_of[rt], whole.region_of[rt][rows])
        blocks += len(part.block_keys)
    assert blocks == len(whole.block_keys)
    assert len(lazy.part([]).block_keys) == 0
    # read whole when used (validation, an unpartitioned prepare): the same geography as before
    np.testing.assert_array_equal(lazy.block_keys, whole.block_keys)
    for rt in whole.region_ids:
        np.testing.assert_array_equal(lazy.region_of[rt], whole.region_of[rt])


def test_a_partition_refuses_a_duplicate_block_and_a_bad_digit_naming_the_grfc_row(census: Path,
                                                                                  tmp_path: Path) -> None:
    grfc = tmp_path / "GRF-C.txt"
    head, *lines = (census / "safetab_p_states/GRF-C.txt").read_text().splitlines()
    state = [i for i, line in enumerate(lines) if line.startswith("44|")]
    grfc.write_text("\n".join([head, *lines, lines[state[1]]]) + "\n")
    lazy = LazyGeography(grfc, "US", STATES)
    with pytest.raises(InputError, match="duplicate block") as info:
        lazy.part([44])
    assert info.value.row == len(lines) + 2
    assert len(lazy.part([1]).block_keys) > 0  # another state's partition does not hold the duplicate
    lines[state[0]] = "44|" + lines[state[0]][3:].replace("|", "|x", 1)
    grfc.write_text("\n".join([head, *lines]) + "\n")
    with pytest.raises(InputError, match="digits") as info:
        LazyGeography(grfc, "US", STATES)
    assert info.value.row == state[0] + 2
