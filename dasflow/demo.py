"""``dasflow demo``: a synthetic census and a full release of every product on local disk.

The synthetic data are generated once into the store (``confidential/synth/``, the public geography files
moved to ``public/``) and the release id depends only on the demo's parameters, so running the demo again on
the same store resumes the release instead of measuring anything twice. ``seed`` makes a seeded TEST release
(same seed, same bytes); without it the noise comes from the OS CSPRNG.
"""

from __future__ import annotations

import json
import os
from fractions import Fraction
from importlib import resources
from pathlib import Path

from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.privacy.account import open_account

#: data seed of the synthetic census when the demo runs in production-randomness mode
DATA_SEED = 2020
#: the demo release's privacy cap (zCDP ρ): PHSafe 1.257281 + SafeTab-P 4.944 + group sizes 0.5 planned
DEMO_CAP_RHO = "7"
#: the demo's privacy-loss account (its synthetic CEF, US): every production-mode demo release over the store's
#: data spends from it. One demo release costs ρ = 9.701281 under add/remove-person (group sizes' M_DPC* plan of
#: 0.5 is charged × k = 7 for a person forming or dissolving a household), so two fit and a third is refused.
DEMO_ACCOUNT = "demo-cef-us"
DEMO_ACCOUNT_CAP_RHO = "20"


def _config_text(name: str) -> str:
    return resources.files("dasflow.demo_data").joinpath(name).read_text(encoding="utf-8")


def ensure_synthetic_census(store: LocalStore, persons: int, seed: int) -> None:
    """Generate the demo's synthetic census into the store unless it is already there (atomic: the synth
    manifest is written last, so a half-generated dataset is regenerated)."""
    from dasflow import synth
    from dasflow.synth.reference import counties as county_list
    from dasflow.synth.reference import states as synth_states

    root = store.local_path("confidential/synth")
    public = ("public/phsafe/geo.csv", "public/safetab-p/GRF-C.txt", "public/groupsize/invariants.json")
    if (root / "manifest.json").exists() and all(store.exists(k) for k in public):
        return
    if root.exists():
        import shutil

        shutil.rmtree(root)
    us_states = [code for code in sorted(synth_states()) if code != "72"]  # a US release: PR is its own run
    manifest = synth.generate(root, persons=persons, seed=seed, states=us_states,
                              formats=("phsafe", "safetab_p", "groupsize"))
    for src, dst in (("phsafe/geo.csv", "public/phsafe/geo.csv"), ("safetab_p/GRF-C.txt",
                                                                   "public/safetab-p/GRF-C.txt")):
        target = store.local_path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(root / src, target)
    # group sizes: the public nation > state > county tree, and the occupied-unit invariant n (public in the
    # DAS, like every housing-unit count from the MAF)
    rows = [f"{st},{county:03d}" for st, (codes, _names) in sorted(county_list().items()) if st in us_states
            for county in codes]
    store.put("public/groupsize/geography.csv", ("STATE,COUNTY\n" + "\n".join(rows) + "\n").encode())
    occupied = int(manifest.data["totals"]["occupied_units"])
    store.put("public/groupsize/invariants.json", (json.dumps({"occupied_units": occupied}) + "\n").encode())


def demo_config(store_dir: Path, persons: int, seed: int | None) -> ReleaseConfig:
    """The demo's release config: PHSafe and SafeTab-P with their production configs, US universe."""
    release_id = f"demo-{persons}" + (f"-seed{seed}" if seed is not None else "")
    raw = {
        "release_id": release_id,
        "universe": "US",
        "store": str(store_dir),
        "inputs": {
            "phsafe": "confidential/synth/phsafe/",
            "phsafe_geo": "public/phsafe/",
            "safetab-p": "confidential/synth/safetab_p/",
            "safetab-p_public": "public/safetab-p/",
            "groupsize": "confidential/synth/groupsize/",
            "groupsize_public": "public/groupsize/",
        },
        "products": [
            {"name": "phsafe", "config_text": _config_text("phsafe-us-config.json"),
             "source": "dasflow/demo_data/phsafe-us-config.json"},
            {"name": "safetab-p", "config_text": _config_text("safetab-p-config.json"),
             "source": "dasflow/demo_data/safetab-p-config.json"},
            {"name": "groupsize", "config_text": _config_text("groupsize-config.json"),
             "source": "dasflow/demo_data/groupsize-config.json"},
        ],
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
