"""``dasflow demo``: a synthetic census and a full release of every demo product on local disk.

The demo products are the registered plugins that declare a ``demo`` entry (``dasflow.products.plugin``); the
demo names none itself. The synthetic data are generated once into the store (``confidential/synth/``, each
product's public files moved to ``public/`` and its derived public files written by its ``demo_public``) and the
release id depends only on the demo's parameters, so running the demo again on the same store resumes the
release instead of measuring anything twice. ``seed`` makes a seeded TEST release (same seed, same bytes);
without it the noise comes from the CSPRNG (OpenSSL's DRBG, seeded by the OS).
"""

from __future__ import annotations

import os
import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

from dasflow import registry, synth
from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.privacy.account import open_account
from dasflow.products.plugin import DemoCensus, DemoEntry, ProductPlugin
from dasflow.synth.reference import states as synth_states

#: data seed of the synthetic census when the demo runs in production-randomness mode
DATA_SEED = 2020
#: the demo release's privacy cap (zCDP ρ), exactly the demo products' plan: PHSafe 1.257281 + SafeTab-P 4.944
#: + group sizes 0.5 + TopDown 1 + matrix 1/2 = 8.201281
DEMO_CAP_RHO = "8.201281"
#: the demo's privacy-loss account (its synthetic CEF, US, add/remove-person): every production-mode demo release
#: over the store's data spends from it. One demo release is charged ρ = 10.701281 (``account.plan_charge``):
#: PHSafe 1.257281, SafeTab-P 4.944 and matrix 1/2 as planned (same relation), group sizes' M_DPC* plan of 0.5
#: × k = 7 = 3.5 (a person forming or dissolving a household), TopDown's change-one-person ρ = 1 × 1/2 = 1/2
#: (add/remove moves one cell by 1). Two releases (21.402562) fit under 30 and a third (32.103843) is refused.
DEMO_ACCOUNT = "demo-cef-us"
DEMO_ACCOUNT_CAP_RHO = "30"
#: where the synthetic census is written in the store
SYNTH_ROOT = "confidential/synth"


def demo_plugins() -> list[tuple[ProductPlugin[Any], DemoEntry]]:
    """The registered products in the demo (registry order), each with its demo entry."""
    return [(p, p.demo) for p in registry.plugins() if p.demo is not None]


def _config_text(name: str) -> str:
    """A packaged demo config (``dasflow/demo_data/``, package data beside this module)."""
    return (Path(__file__).with_name("demo_data") / name).read_text(encoding="utf-8")


def ensure_synthetic_census(store: LocalStore, persons: int, seed: int) -> None:
    """Generate the demo's synthetic census into the store unless it is already there (atomic: the synth
    manifest is written last, so a half-generated dataset is regenerated): the writer formats the demo products
    declare (``synth_format``), then each product's public files moved to ``public/`` and its derived public
    files (``demo_public``)."""
    entries = demo_plugins()
    root = store.local_path(SYNTH_ROOT)
    public = [key for _, demo in entries for key in (*demo.public_files.values(), *demo.derived_files)]
    if (root / "manifest.json").exists() and all(store.exists(k) for k in public):
        return
    if root.exists():
        shutil.rmtree(root)
    us_states = [code for code in sorted(synth_states()) if code != "72"]  # a US release: PR is its own run
    formats = tuple(dict.fromkeys(p.synth_format for p, _ in entries if p.synth_format is not None))
    manifest = synth.generate(root, persons=persons, seed=seed, states=us_states, formats=formats)
    for _, demo in entries:
        for src, dst in demo.public_files.items():
            target = store.local_path(dst)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(root / src, target)
    census = DemoCensus(states=tuple(us_states), totals=manifest.data["totals"])
    for plugin, _ in entries:
        plugin.demo_public(store, census)


def demo_config(store_dir: Path, persons: int, seed: int | None) -> ReleaseConfig:
    """The demo's release config: every demo product with its packaged config, US universe."""
    release_id = f"demo-{persons}" + (f"-seed{seed}" if seed is not None else "")
    entries = demo_plugins()
    raw: dict[str, Any] = {
        "release_id": release_id,
        "universe": "US",
        "store": str(store_dir),
        "inputs": {name: prefix for _, demo in entries for name, prefix in demo.inputs.items()},
        "products": [{"name": plugin.name, "config_text": _config_text(demo.config_file),
                      "source": f"dasflow/demo_data/{demo.config_file}"} for plugin, demo in entries],
        "cap": {"rho": DEMO_CAP_RHO},
        "rng": {"mode": "test", "seed": seed} if seed is not None else {"mode": "production"},
    }
    if seed is None:  # a seeded test release on synthetic data spends from no account (its bytes stay as they were)
        raw["account"] = DEMO_ACCOUNT
    return parse_release_config(raw, source="dasflow demo")


def prepare_demo(store_dir: Path, persons: int, seed: int | None) -> ReleaseConfig:
    """Synthetic inputs in the store plus the demo release config (nothing measured yet)."""
    if persons < 1000:
        raise InputError(f"--persons must be at least 1000 for the demo, got {persons}", column="--persons")
    store_dir = store_dir.absolute()
    store = LocalStore(store_dir)
    ensure_synthetic_census(store, persons, DATA_SEED if seed is None else seed)
    open_account(store, DEMO_ACCOUNT, "US", cap_rho=Fraction(DEMO_ACCOUNT_CAP_RHO))  # once; a no-op afterwards
    return demo_config(store_dir, persons, seed)
