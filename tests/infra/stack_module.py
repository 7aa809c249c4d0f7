"""``infra/local/stack.py`` imported as a module (``infra`` is not a package: it is a script for operators)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
STACK_PY = REPO / "infra/local/stack.py"


def stack_module() -> ModuleType:
    existing = sys.modules.get("dasflow_local_stack")
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location("dasflow_local_stack", STACK_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module
