"""Builders for the validation tests: a local store from the corpus base (optionally with one case applied), a
release config for one product, and the release driven stage by stage with the CLI's exit-code mapping."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from dasflow.cli import EXIT_BAD_INPUT, EXIT_LEDGER, EXIT_OK, EXIT_OTHER
from dasflow.config import parse_release_config
from dasflow.errors import DasflowError, InputError, LedgerRefusal
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config
from dasflow.release.stage import release_stage
from tests.synthetic import mark_inputs


def _config_text(name: str) -> str:
    """A shipped demo config (the production formats), verbatim."""
    return resources.files("dasflow.demo_data").joinpath(name).read_text(encoding="utf-8")


CORPUS = Path(__file__).resolve().parent / "corpus"
CASES: dict[str, dict[str, Any]] = json.loads((CORPUS / "cases.json").read_text())
CONFIG_FILES = {"phsafe": "phsafe-us-config.json", "safetab-p": "safetab-p-config.json",
                "groupsize": "groupsize-config.json"}
INPUTS = {"phsafe": "confidential/phsafe/", "phsafe_geo": "public/phsafe/",
          "safetab-p": "confidential/safetab-p/", "safetab-p_public": "public/safetab-p/",
          "groupsize": "confidential/groupsize/", "groupsize_public": "public/groupsize/"}


def corpus_store(root: Path, case: str | None = None) -> LocalStore:
    """A local store holding the valid base dataset, with one corpus case's broken object swapped in."""
    shutil.copytree(CORPUS / "base", root, dirs_exist_ok=True)
    if case is not None:
        shutil.copytree(CORPUS / "cases" / case, root, dirs_exist_ok=True)
    return LocalStore(root)


def release_raw(store: LocalStore, products: list[str], release_id: str = "v1",
                config_texts: dict[str, str] | None = None) -> dict[str, Any]:
    texts = config_texts or {}
    return {"release_id": release_id, "universe": "US", "store": str(store.root),
            "inputs": {k: v for k, v in INPUTS.items() if k.split("_")[0] in products},
            "products": [{"name": p, "config_text": texts.get(p, _config_text(CONFIG_FILES[p]))} for p in products],
            "cap": {"rho": "7"}, "rng": {"mode": "test", "seed": 3}}


def run_release(store: LocalStore, raw: dict[str, Any], *, full: bool = False,
                errors: list[BaseException] | None = None) -> int:
    """freeze → plan → validate (every product) [→ preprocess → measure → postprocess → release], with the
    ``dasflow`` CLI's exit codes (0 ok, 2 bad input/config, 3 ledger refusal, 1 other)."""
    try:
        cfg = parse_release_config(raw, source="release.json")
        mark_inputs(store, raw, "validation corpus")
        ctx = freeze_config(cfg, store)
        for p in cfg.products:
            stages.validate_stage(ctx, p.name)
        stages.plan_stage(ctx)
        if full:
            for p in cfg.products:
                stages.preprocess_stage(ctx, p.name)
                stages.measure_stage(ctx, p.name)
                stages.postprocess_stage(ctx, p.name)
            release_stage(ctx)
        return EXIT_OK
    except InputError as exc:
        if errors is not None:
            errors.append(exc)
        return EXIT_BAD_INPUT
    except LedgerRefusal as exc:
        if errors is not None:
            errors.append(exc)
        return EXIT_LEDGER
    except DasflowError as exc:
        if errors is not None:
            errors.append(exc)
        return EXIT_OTHER
