"""SafeTab-P's post-processing in the DAG streams T2 one stage-2 key at a time; the release files are those of
the whole-table path, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.estimates import StoredEstimates
from dasflow.pipeline.run import freeze_config, manifest_if_current
from dasflow.pipeline.stages import write_estimates
from dasflow.privacy import accounting
from dasflow.products.safetab_p import outputs
from dasflow.products.safetab_p.config import parse_config
from dasflow.products.safetab_p.product import SafeTabP
from dasflow.release.stage import write_product_tables
from tests.dag.helpers import release_files
from tests.dag.test_products_in_dag import TOY, safetab_release


def _csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False, sep="|", lineterminator="\n").encode()


def test_streamed_t2_gives_the_whole_path_release_bytes(tmp_path: Path) -> None:
    _, raw = safetab_release(tmp_path, "zcdp", seed=3)
    config = json.loads(raw["products"][0]["config_text"])  # low thresholds: most groups get age/sex detail
    config["thresholds_p"] = {k: [1, 2, 3] for k in config["thresholds_p"]}
    config["allow_negative_counts"] = False  # clamped per stage-2 key as in the whole path
    raw["products"][0]["config_text"] = json.dumps(config)
    ctx = freeze_config(parse_release_config(raw))
    stages.validate_stage(ctx, "safetab-p")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "safetab-p")
    stages.measure_stage(ctx, "safetab-p")
    stages.postprocess_stage(ctx, "safetab-p")
    record = manifest_if_current(ctx, "postprocess", "safetab-p", stages._measurement_hashes(ctx, "safetab-p"))
    assert record is not None
    # the release stage's writer (chunks streamed into the store with their output validation)
    write_product_tables(ctx, "safetab-p", StoredEstimates(ctx.post_store(), record["outputs"]),
                         ctx.ledger.plan_record())
    files = release_files(tmp_path / "store", raw["release_id"])
    product = ctx.plugin("safetab-p").product(ctx.product_config("safetab-p"))
    measurements = stages.load_measurements(ctx, "safetab-p")
    whole = outputs.tables(product.postprocess(measurements, ctx.post_public("safetab-p")))
    stage2 = [k for k in sorted(measurements) if k.endswith("/stage2")]
    assert len(stage2) > 1 and len(whole["t2"]) > 0
    assert files["safetab-p/t1/t1_US.csv"] == _csv(whole["t1"])
    assert files["safetab-p/t2/t2_US.csv"] == _csv(whole["t2"])
    assert (whole["t2"]["COUNT"] >= 0).all() and (whole["t2"]["AGESTART"] != "*").any()
    # stored T2: one row group per stage-2 key (nothing national in memory), rows in key order
    t2_key = next(k for k, o in record["outputs"].items() if o["name"] == "t2")
    with ctx.store.reader(t2_key) as fh:
        assert pq.ParquetFile(fh).metadata.num_row_groups == len(stage2)
    chunks = list(product.table_chunks(StoredEstimates(ctx.store, record["outputs"])))
    assert [name for name, _ in chunks] == ["t1"] + ["t2"] * len(stage2)
    pd.testing.assert_frame_equal(pd.concat([c for n, c in chunks if n == "t2"], ignore_index=True).astype(
        whole["t2"].dtypes.to_dict()), whole["t2"], check_exact=True)


def test_an_empty_t2_streams_as_a_header_only_file(tmp_path: Path) -> None:
    """No stage-2 key: the stream writes no row group and the release's t2 is its header (as the whole path)."""
    cfg = parse_config(accounting.load_json_exact((TOY / "input_dir_zcdp" / "config.json").read_text()))
    store = LocalStore(tmp_path)
    outs = write_estimates(store, "post/", outputs.postprocess_stream({}, cfg))
    chunks = list(SafeTabP().table_chunks(StoredEstimates(store, outs)))
    assert [n for n, _ in chunks] == ["t1", "t2"] and all(c.empty for _, c in chunks)
    assert _csv(chunks[1][1]) == _csv(outputs.tables(outputs.postprocess({}, cfg))["t2"])

