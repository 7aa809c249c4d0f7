"""Issue #20 item 6: the release flow runs the products' subflows side by side (``product_lanes``, the demo's
two cores). A seeded release through the flow with two lanes is byte-identical to the same release through the
stage functions one product after another (two independent runs of the seeded demo over every product: also the
demo's determinism test); after a product fails no further product starts, and the failure is the one
raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from dasflow import demo
from dasflow.flows.release import run_release
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config
from dasflow.release.stage import release_stage
from tests.dag.helpers import release_files

pytestmark = pytest.mark.slow
PERSONS = 1000


def _stage_functions_release(root: Path, seed: int) -> dict[str, bytes]:
    cfg = demo.prepare_demo(root, PERSONS, seed)
    ctx = freeze_config(cfg)
    for p in cfg.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    for p in cfg.products:
        stages.preprocess_stage(ctx, p.name)
        stages.measure_stage(ctx, p.name)
        stages.postprocess_stage(ctx, p.name)
    release_stage(ctx)
    return release_files(root, cfg.release_id)


def test_two_product_lanes_give_the_stage_functions_release_bytes(tmp_path: Path) -> None:
    expected = _stage_functions_release(tmp_path / "stages", 11)
    cfg = demo.prepare_demo(tmp_path / "flow", PERSONS, 11)
    out = run_release(cfg, product_lanes=2)
    assert set(out["products"]) == {p.name for p in cfg.products}
    assert all(r["measure"]["drawn_now"] > 0 for r in out["products"].values())  # each measured here, once
    got = release_files(tmp_path / "flow", cfg.release_id)
    assert {n.split("/", 1)[0] for n in got if "/" in n} >= {p.name for p, _ in demo.demo_plugins()}
    assert got == expected


class Boom(RuntimeError):
    pass


def test_after_a_failed_product_no_further_product_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = stages.preprocess_stage
    started: list[str] = []

    def preprocess(ctx, product):  # type: ignore[no-untyped-def]
        started.append(product)
        if product == "phsafe":
            raise Boom("phsafe preprocessing failed")
        return real(ctx, product)

    monkeypatch.setattr(stages, "preprocess_stage", preprocess)
    cfg = demo.prepare_demo(tmp_path / "store", PERSONS, 3)
    with pytest.raises(Boom, match="phsafe preprocessing failed"):
        run_release(cfg, product_lanes=1)
    assert started == ["phsafe"]  # the first product failed: none of the four others started
    manifests = tmp_path / "store" / "runs" / cfg.release_id / "manifests"
    assert (manifests / "validate").exists() and not (manifests / "measure").exists()
    assert not (manifests / "release").exists()
