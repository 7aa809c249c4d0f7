"""Builders for DAG tests: a store with the counts product's inputs and a release config for it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.io.store import LocalStore, ObjectStore
from dasflow.pipeline.inputs import mark_synthetic
from tests.dag import counts_product

STATES = ["01", "02", "06", "48"]
ACCOUNT = "counts-account"


def seed_inputs(store: ObjectStore, persons: int = 500, seed: int = 3) -> None:
    """Write a small persons file and the public state list into ``store``."""
    gen = np.random.default_rng(seed)
    frame = pd.DataFrame({"STATE": gen.choice(STATES, size=persons), "SEX": gen.integers(1, 3, size=persons)})
    store.put(counts_product.PERSONS, frame.to_csv(index=False).encode())
    store.put(counts_product.STATES, pd.DataFrame({"STATE": STATES}).to_csv(index=False).encode())
    mark_synthetic(store, "confidential/counts/", generator_note="tests.dag.helpers.seed_inputs")


def release_dict(store: str, release_id: str = "r1", rho: tuple[str, str] = ("1/2", "1/4"),
                 cap: str = "1", seed: int | None = 11) -> dict[str, Any]:
    return {
        "release_id": release_id,
        "universe": "US",
        "store": store,
        "inputs": {"persons": "confidential/counts/"},
        "products": [{"name": "counts", "config_text": json.dumps({"rho": {"state": rho[0],
                                                                          "state_sex": rho[1]}})}],
        "cap": {"rho": cap},
        "rng": {"mode": "test", "seed": seed} if seed is not None else {"mode": "production"},
        **({} if seed is not None else {"account": ACCOUNT}),
    }


def release_config(store: str, **kw: Any) -> ReleaseConfig:
    return parse_release_config(release_dict(store, **kw))


def open_test_account(store: ObjectStore, name: str = "counts-account", cap_rho: str = "100") -> None:
    """The privacy-loss account a production-mode test release spends from."""
    from dasflow.privacy.account import open_account

    open_account(store, name, "US", cap_rho=Fraction(cap_rho))


def local_release(tmp: Path, **kw: Any) -> tuple[LocalStore, ReleaseConfig]:
    store = LocalStore(tmp / "store")
    seed_inputs(store)
    cfg = release_config(str(tmp / "store"), **kw)
    if cfg.account is not None:
        open_test_account(store, cfg.account)
    return store, cfg


def release_files(store_dir: Path, release_id: str) -> dict[str, bytes]:
    root = store_dir / "runs" / release_id / "release"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def topdown_release(tmp: Path, release_id: str, *, states: Sequence[str] = ("44", "11", "10"), persons: int = 6000,
                    synth_seed: int = 11, strategy: str = "pl94", segment_blocks: int | None = None,
                    bottom_up_max_entries: int | None = None) -> dict[str, Any]:
    """A TopDown release config on the synthetic census under ``tmp/store``: persons as confidential input, the
    synth's public TopDown files (GRF-C, block facts, total/state invariants) as public input
    (``segment_blocks``: the measurement segment and post-processing part bound, 1 draws every county alone;
    ``bottom_up_max_entries``: a small bound makes the parts read the deep levels per measurement segment)."""
    from dasflow import synth

    store = LocalStore(tmp / "store")
    root = store.local_path("confidential/synth")
    synth.generate(root, persons=persons, seed=synth_seed, states=list(states), formats=("topdown",))
    for name in ("GRF-C.txt", "block_facts.csv", "invariants.json"):
        store.put(f"public/topdown/{name}", (root / "topdown" / "public" / name).read_bytes())
    config: dict[str, Any] = {"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1", "privacy_defn": "zcdp",
                              "strategy": strategy}
    if segment_blocks is not None:
        config["segment_blocks"] = segment_blocks
    if bottom_up_max_entries is not None:
        config["bottom_up_max_entries"] = bottom_up_max_entries
    return {"release_id": release_id, "universe": "US", "store": str(tmp / "store"),
            "inputs": {"topdown": "confidential/synth/topdown/persons/", "topdown_public": "public/topdown/"},
            "products": [{"name": "topdown", "config_text": json.dumps(config)}],
            "cap": {"rho": "1"}, "rng": {"mode": "test", "seed": 8}}


def hashed_keys(store: ObjectStore) -> list[str]:
    """Record every key ``store`` hashes from now on (the list grows as it does)."""
    seen: list[str] = []
    sha256 = store.sha256

    def recording(key: str) -> str:
        seen.append(key)
        return sha256(key)

    store.sha256 = recording  # type: ignore[method-assign]
    return seen
