"""Committed measurements read by key: held within a byte budget, else reloaded from the ledger when read."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from dasflow.config import parse_release_config
from dasflow.errors import IntegrityError, LedgerRefusal
from dasflow.pipeline import stages
from dasflow.pipeline.measured import Measured
from dasflow.pipeline.run import freeze_config
from dasflow.privacy.measurement import MeasurementSpec, NoisyMeasurement
from tests.dag.test_products_in_dag import safetab_release


def _spec(key: str, **detail: object) -> MeasurementSpec:
    return MeasurementSpec(product="safetab-p", key=key, level="l", privacy_defn="zcdp", mechanism="none",
                           budget=None, sensitivity=Fraction(1), noise=Fraction(0), cells=1, variance=Fraction(0),
                           detail=detail)


def _m(key: str, rows: int) -> NoisyMeasurement:
    spec = _spec(key)
    return NoisyMeasurement(spec, pd.DataFrame({"NOISY": range(rows)}), "test")


def test_held_within_budget_then_reloaded_one_at_a_time() -> None:
    loads: list[str] = []
    stored = {"a": _m("a", 10), "b": _m("b", 100_000), "c": _m("c", 10)}

    def load(key: str) -> NoisyMeasurement:
        loads.append(key)
        return stored[key]

    size_a = int(stored["a"].table.memory_usage(deep=True).sum())
    earlier = Measured(load, budget_bytes=3 * size_a)
    for key in ("a", "b", "c"):
        earlier.add(key, stored[key])
    assert list(earlier) == ["a", "b", "c"] and len(earlier) == 3 and "b" in earlier and "d" not in earlier
    assert earlier["a"] is stored["a"] and earlier["c"] is stored["c"] and loads == []  # small ones held
    assert earlier["b"] is stored["b"] and earlier["b"] is stored["b"] and loads == ["b"]  # last reload kept
    assert earlier.reloads == 1
    with pytest.raises(KeyError):
        earlier["d"]  # a key not measured before the current one is never visible


def test_safetab_p_stage_two_reads_reloaded_stage_one_tables_identically(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing held (budget 0) every stage-2 key reads its stage-1 table back from the ledger: the
    measurements (query shapes and values) are byte-identical to the run that held them."""
    nmfs = {}
    reloads = {}
    for budget in (None, 0):
        tmp = tmp_path / f"budget-{budget}"
        _, raw = safetab_release(tmp, "zcdp", seed=11)
        raw["release_id"] = "toy-measured"  # the same release id: the NMFs carry it
        ctx = freeze_config(parse_release_config(raw))
        stages.validate_stage(ctx, "safetab-p")
        stages.plan_stage(ctx)
        stages.preprocess_stage(ctx, "safetab-p")
        if budget is not None:
            monkeypatch.setattr(Measured, "BUDGET_BYTES", budget)
        loaded: list[str] = []
        load = ctx.ledger.load
        monkeypatch.setattr(ctx.ledger, "load", lambda spec, commit, _l=load, _d=loaded: (_d.append(spec.key),
                                                                                          _l(spec, commit))[1])
        assert stages.measure_stage(ctx, "safetab-p")["drawn_now"] > 0
        monkeypatch.undo()
        reloads[budget] = loaded
        folder = tmp / "store" / "runs" / "toy-measured" / "measurements"
        nmfs[budget] = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}
    stage2 = [k for k in nmfs[0] if k.endswith("stage2.parquet")]
    assert stage2 and reloads[None] == [] and len(reloads[0]) == len(stage2)
    assert all(k.endswith("/stage1") for k in reloads[0])
    assert nmfs[0] == nmfs[None]


def test_a_tampered_stage_one_table_is_refused_when_reloaded(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage-1 NMF edited after its commit is caught when stage 2 reads it back (verified against the
    commit's SHA-256), before stage 2 draws."""
    _, raw = safetab_release(tmp_path, "zcdp", seed=12)
    ctx = freeze_config(parse_release_config(raw))
    stages.validate_stage(ctx, "safetab-p")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "safetab-p")
    monkeypatch.setattr(Measured, "BUDGET_BYTES", 0)
    pairs = stages.planned(ctx, "safetab-p")
    first = next(spec for spec, native in pairs if native.key.endswith("stage1"))
    original = ctx.ledger.measure_once

    def measure_once(spec: MeasurementSpec, draw, *, attempt: str):  # type: ignore[no-untyped-def]
        out = original(spec, draw, attempt=attempt)
        if spec.key == first.key:  # an attacker edits the committed stage-1 NMF right after its commit
            path = ctx.store.local_path(ctx.ledger.nmf_key(spec.key))
            path.write_bytes(path.read_bytes() + b"\0")
        return out

    monkeypatch.setattr(ctx.ledger, "measure_once", measure_once)
    with pytest.raises(IntegrityError, match="does not match its committed SHA-256"):
        stages.measure_stage(ctx, "safetab-p")
    assert not ctx.ledger.committed(first.key.rsplit("/", 1)[0] + "/stage2")


def test_stage_two_without_its_stage_one_is_refused() -> None:
    from dasflow.products.safetab_p.plugin import PipelineSafeTabP

    spec = _spec("US/STATE/1/stage2", stage=2)
    with pytest.raises(LedgerRefusal, match="stage-1 key US/STATE/1/stage1 is not measured before it"):
        PipelineSafeTabP().measure_adaptive({}, spec, None, Measured(lambda k: _m(k, 1)))
