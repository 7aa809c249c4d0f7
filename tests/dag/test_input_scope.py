"""Each product's stages are keyed by, and its measurements bound to, the confidential inputs that product
declares: a stage of one product never hashes another product's files (at national size one pass over every
product's inputs is ≈ 48 GB read per stage process), a changed input invalidates its own products' stages only,
and a product's stored measurements are refused once its own inputs change."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dasflow import demo
from dasflow.errors import InputError, IntegrityError
from dasflow.pipeline import stages
from dasflow.pipeline.inputs import input_layout, inputs_digest
from dasflow.pipeline.run import freeze_config
from dasflow.privacy.ledger import nmf_binding
from tests.dag import counts_product
from tests.dag.helpers import hashed_keys, local_release

PRODUCTS = ("groupsize", "matrix")


def _release(root: Path) -> Any:
    cfg = demo.prepare_demo(root, 1000, 5)
    keep = ("groupsize", "matrix")
    return cfg.model_copy(update={"products": [p for p in cfg.products if p.name in PRODUCTS],
                                  "inputs": {k: v for k, v in cfg.inputs.items() if k.startswith(keep)}})


def test_a_product_hashes_and_is_bound_to_its_own_inputs_only(tmp_path: Path) -> None:
    cfg = _release(tmp_path)
    ctx = freeze_config(cfg)
    own = {p: ctx.layout.confidential_of(p)[p] for p in PRODUCTS}
    assert own["groupsize"] != own["matrix"] and ctx.layout.confidential_of("groupsize") == {
        "groupsize": own["groupsize"]}
    # fail closed: an input the config names that no product declares is every product's
    extra = input_layout(list(PRODUCTS), {**cfg.inputs, "extra": "elsewhere/"})
    assert all(extra.confidential_of(p)["extra"] == "elsewhere/" for p in PRODUCTS)
    for p in PRODUCTS:
        stages.validate_stage(ctx, p)
    planner = freeze_config(cfg)
    seen = hashed_keys(planner.store)
    stages.plan_stage(planner)  # public inputs only: no confidential file is hashed again
    assert seen and not any(k.startswith(tuple(own.values())) for k in seen)
    for p in PRODUCTS:  # every stage in a fresh context (process), as a task runs it
        fresh = freeze_config(cfg)
        seen = hashed_keys(fresh.store)
        stages.preprocess_stage(fresh, p)
        stages.measure_stage(fresh, p)
        other = own[next(q for q in PRODUCTS if q != p)]
        assert any(k.startswith(own[p]) for k in seen) and not any(k.startswith(other) for k in seen)
    for p in PRODUCTS:  # each NMF carries its own product's inputs digest
        digest = inputs_digest(ctx.confidential_hashes(p))
        assert digest != inputs_digest(ctx.confidential_hashes())
        for spec in stages.product_specs(ctx, p):
            commit = ctx.ledger.committed(spec.key)
            assert commit is not None
            data = ctx.store.get(commit.nmf_key)
            assert nmf_binding(data)["inputs_sha256"] == digest
            assert pq.read_metadata(io.BytesIO(data)).num_rows == commit.rows

    # one of groupsize's files changes: groupsize's stages and measurements are stale, matrix's are not
    changed = sorted(ctx.store.list(own["groupsize"]))[-1]
    ctx.store.put(changed, ctx.store.get(changed) + b"\n")
    after = freeze_config(cfg)
    assert stages.manifest_if_current(after, "preprocess", "groupsize", stages.input_hashes(after, "groupsize")) \
        is None
    assert stages.manifest_if_current(after, "preprocess", "matrix", stages.input_hashes(after, "matrix")) \
        is not None
    for p in PRODUCTS:
        after.bind_inputs(p)
    spec = stages.product_specs(after, "groupsize")[0]
    commit = after.ledger.committed(spec.key)
    assert commit is not None
    with pytest.raises(IntegrityError, match="not bound to the current confidential inputs"):
        after.ledger.load(spec, commit)
    for spec in stages.product_specs(after, "matrix"):
        commit = after.ledger.committed(spec.key)
        assert commit is not None and after.ledger.load(spec, commit).spec == spec


def test_an_input_changed_after_its_validation_is_refused_before_anything_is_drawn(tmp_path: Path) -> None:
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    store.put(counts_product.PERSONS, store.get(counts_product.PERSONS) + b"06,1\n")  # still a valid file
    later = freeze_config(cfg, store)
    stages.plan_stage(later)
    with pytest.raises(InputError, match="not passed validation"):
        stages.preprocess_stage(later, "counts")
    with pytest.raises(InputError, match="no current preprocess"):
        stages.measure_stage(later, "counts")
    assert store.list("runs/r1/measurements/") == []
    assert [e for e in store.list("runs/r1/ledger/entries/") if not e.endswith(".reserved.json")] == []
