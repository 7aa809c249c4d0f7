"""Issue #20 item 6: the release flow runs the products' subflows side by side (``product_lanes``, the demo's
two cores). A seeded release through the flow with two lanes is byte-identical to the same release through the
stage functions one product after another (two independent runs of the seeded demo over every product: also the
demo's determinism test); after a product fails no further product starts, and the failure is the one
raised."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from dasflow import demo
from dasflow.config import ReleaseConfig
from dasflow.flows.release import run_release
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config
from dasflow.registry import get_plugin
from dasflow.release.stage import release_stage
from tests.dag.helpers import release_files

pytestmark = pytest.mark.slow
PERSONS = 1000
#: SafeTab-P is left out of the two releases compared here: its measurement over the full public domain is a third
#: of a demo's work, and CI's 30-minute budget is thin; its seeded determinism through the flow is the demo
#: resume test's (tests/dag/test_fault_injection.py), with every product
LEFT_OUT = "safetab-p"


def _demo(root: Path, seed: int) -> ReleaseConfig:
    cfg = demo.prepare_demo(root, PERSONS, seed)
    return cfg.model_copy(update={"products": [p for p in cfg.products if p.name != LEFT_OUT],
                                  "inputs": {k: v for k, v in cfg.inputs.items() if not k.startswith(LEFT_OUT)}})


def _stage_functions_release(root: Path, seed: int) -> dict[str, bytes]:
    cfg = _demo(root, seed)
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
    cfg = _demo(tmp_path / "flow", 11)
    out = run_release(cfg, product_lanes=2)
    assert set(out["products"]) == {p.name for p in cfg.products} and len(cfg.products) == 4
    assert all(r["measure"]["drawn_now"] > 0 for r in out["products"].values())  # each measured here, once
    got = release_files(tmp_path / "flow", cfg.release_id)
    assert {n.split("/", 1)[0] for n in got if "/" in n} >= {p.name for p, _ in demo.demo_plugins()} - {LEFT_OUT}
    assert got == expected


class Boom(RuntimeError):
    pass


def test_after_a_failed_product_no_further_product_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = stages.preprocess_stage
    started: list[str] = []

    def preprocess(ctx, product):  # type: ignore[no-untyped-def]
        started.append(product)
        if product == "safetab-p":
            raise Boom("safetab-p preprocessing failed")
        return real(ctx, product)

    monkeypatch.setattr(stages, "preprocess_stage", preprocess)
    cfg = demo.prepare_demo(tmp_path / "store", PERSONS, 3)
    assert cfg.products[0].name != "safetab-p"  # started first as the largest plan, not as the first in config
    with pytest.raises(Boom, match="safetab-p preprocessing failed"):
        run_release(cfg, product_lanes=1)
    assert started == ["safetab-p"]  # the first product started failed: none of the four others started
    manifests = tmp_path / "store" / "runs" / cfg.release_id / "manifests"
    assert (manifests / "validate").exists() and not (manifests / "measure").exists()
    assert not (manifests / "release").exists()


def test_products_validate_side_by_side_and_a_refusal_freezes_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With two lanes the first two validations run at once (a barrier both must reach, which serial runs never
    pass); the second one's refusal is the failure raised, and no plan is frozen."""
    real = stages.validate_stage
    both = threading.Barrier(2, timeout=60)
    started: list[str] = []

    def validate(ctx, product):  # type: ignore[no-untyped-def]
        started.append(product)
        if len(started) <= 2:
            both.wait()  # BrokenBarrierError unless the other validation is running too
        if len(started) == 2:
            raise Boom(f"{product} refused")
        return real(ctx, product)

    monkeypatch.setattr(stages, "validate_stage", validate)
    cfg = demo.prepare_demo(tmp_path / "store", PERSONS, 3)
    second = stages.validation_order(cfg)[1]
    with pytest.raises(Boom):
        run_release(cfg, product_lanes=2)
    assert len(started) >= 2 and not both.broken
    assert not (tmp_path / "store" / "runs" / cfg.release_id / "ledger" / "plan.json").exists()
    assert second in started


def test_after_a_refused_input_no_further_validation_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []

    def validate(ctx, product):  # type: ignore[no-untyped-def]
        started.append(product)
        raise Boom(f"{product} refused")

    monkeypatch.setattr(stages, "validate_stage", validate)
    cfg = demo.prepare_demo(tmp_path / "store", PERSONS, 3)
    first = stages.validation_order(cfg)[0]
    assert first != cfg.products[0].name  # started first as the costliest validation, not as the first in config
    with pytest.raises(Boom, match=f"{first} refused"):
        run_release(cfg, product_lanes=1)
    assert started == [first]  # one lane: the refusal is final, nothing else is read


def test_products_start_largest_plan_first_ties_in_config_order() -> None:
    entries = [("a", 10), ("b", 7), ("b", 7), ("c", 100), ("d", 14), ("e", 0)]
    plan = {f"k{i}": {"product": name, "cells": cells} for i, (name, cells) in enumerate(entries)}
    ctx = SimpleNamespace(ledger=SimpleNamespace(plan=lambda: plan),
                          config=SimpleNamespace(products=[SimpleNamespace(name=n) for n in "abcdef"]))
    assert stages.largest_first(ctx) == ["c", "b", "d", "a", "e", "f"]  # type: ignore[arg-type]


def test_validations_start_costliest_first_ties_in_config_order(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """By the plugins' declared ``validation_cost`` (never by the inputs): SafeTab-P's person files first and the
    matrix product (a small count over TopDown's persons) last, whatever the config's order; equal costs keep it."""
    cfg = demo.prepare_demo(tmp_path / "store", PERSONS, 3)
    names = [p.name for p in cfg.products]
    order = stages.validation_order(cfg)
    assert sorted(order) == sorted(names) and order[0] == "safetab-p" and order[-1] == "matrix"
    costs = [get_plugin(n).validation_cost for n in order]
    assert costs == sorted(costs, reverse=True)
    reversed_cfg = cfg.model_copy(update={"products": cfg.products[::-1]})
    assert stages.validation_order(reversed_cfg) == order
    for name in names:
        monkeypatch.setattr(type(get_plugin(name)), "validation_cost", 1.0)
    assert stages.validation_order(cfg) == names and stages.validation_order(reversed_cfg) == names[::-1]
