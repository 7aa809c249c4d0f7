"""Stage metrics (wall, CPU, peak RSS) recorded by the release in its stage manifests: plausible, kept out of
``release/``, and no obstacle to skipping a done stage or to byte-identical resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dasflow.pipeline.metrics import StageMeter, stage_metrics
from dasflow.pipeline.run import freeze_config
from tests.dag.helpers import local_release, release_files
from tests.dag.test_pipeline import run_all

STAGE_KEYS = [("validate", "counts"), ("preprocess", "counts"), ("measure", "counts"), ("postprocess", "counts"),
              ("tables", "counts"), ("release", "all")]


def _manifests(store_dir: Path) -> dict[str, bytes]:
    root = store_dir / "runs/r1/manifests"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.json"))}


def test_every_stage_manifest_records_plausible_metrics(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    run_all(ctx)
    for stage, product in STAGE_KEYS:
        m = json.loads(store.get(f"runs/r1/manifests/{stage}/{product}.json"))["metrics"]
        assert m["wall_seconds"] >= 0 and m["cpu_seconds"] >= 0 and m["children_cpu_seconds"] >= 0, (stage, m)
        assert m["rss_start_bytes"] > 0 and m["peak_rss_bytes"] >= m["peak_rss_start_bytes"] > 0, (stage, m)
        assert m["peak_rss_bytes"] >= max(m["rss_start_bytes"], m["rss_end_bytes"]), (stage, m)
    measure = json.loads(store.get("runs/r1/manifests/measure/counts.json"))["metrics"]
    assert measure["cpu_seconds"] > 0
    rows = stage_metrics(ctx)
    assert [(r["stage"], r["product"]) for r in rows] == STAGE_KEYS
    assert all(r["peak RSS MB"] > 0 and r["wall s"] >= 0 for r in rows)


def test_metrics_stay_out_of_the_release_and_resume_keeps_bytes(tmp_path: Path) -> None:
    """A rerun skips every done stage (metrics are not part of the skip test) and rewrites none of their
    manifests; the release files carry no timing and stay byte-identical."""
    store, cfg = local_release(tmp_path)
    run_all(freeze_config(cfg, store))
    files = release_files(tmp_path / "store", "r1")
    manifests = _manifests(tmp_path / "store")
    assert not any(b"wall_seconds" in data or b"peak_rss" in data for data in files.values())
    again = run_all(freeze_config(cfg, store))
    assert again["counts"]["drawn_now"] == 0
    assert release_files(tmp_path / "store", "r1") == files
    now = _manifests(tmp_path / "store")
    assert {k: v for k, v in now.items() if not k.startswith("release/")} == \
        {k: v for k, v in manifests.items() if not k.startswith("release/")}


def test_meter_counts_children_cpu_and_wall() -> None:
    meter = StageMeter.start()
    subprocess.run([sys.executable, "-c", "s = 0\nfor i in range(3_000_000): s += i"], check=True)
    m = meter.read()
    assert m["children_cpu_seconds"] > 0.05
    assert m["cpu_seconds"] >= m["children_cpu_seconds"]
    assert m["wall_seconds"] >= m["children_cpu_seconds"] * 0.5
