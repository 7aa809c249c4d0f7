"""The architecture holds (issue #19): imports point downward, nothing dodges a loop with a function-level import,
module names appear as strings only in the plugin registry, and no consumer names a product.

The layer contract itself is import-linter's (``[tool.importlinter]`` in pyproject.toml, also run by .ci/run);
this test runs it so that a plain ``pytest`` catches an upward import too.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dasflow import registry

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("dasflow",)
#: the folders ``flows/``, ``tasks/``, ``validation/`` stay at the top level of the checkout (links into the
#: installed namespace: they import as ``dasflow.flows``, ``dasflow.tasks``, ``dasflow.validation``)
NAMESPACED = ("flows", "tasks", "validation")
#: library code (every installed first-party module)
LIBRARY = sorted((ROOT / "dasflow").rglob("*.py"))
#: function-level first-party imports that are deliberate, with the reason (none may break an import loop)
LAZY_ALLOWED: dict[str, str] = {
    "dasflow/flows/cli.py": "Prefect (seconds to import) is loaded only by the commands that run a flow",
    "dasflow/cli.py": "each subcommand's module is loaded only when it runs (`dasflow --help` stays fast)",
}
#: consumers that must reach products through the registry only (never by name)
CONSUMERS = ["dasflow/pipeline", "dasflow/release", "dasflow/commands", "dasflow/experiment", "dasflow/demo.py",
             "dasflow/cli.py", "dasflow/validation", "dasflow/flows", "dasflow/tasks"]
#: strings that look like module names but are not imports
NOT_IMPORTS = {"dasflow.synth": "the format name of a synthetic-data manifest (dasflow.pipeline.inputs, synth)"}
MODULE_STRING = re.compile(r"^(dasflow|validation|flows|tasks)(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _rel(path: Path) -> str:
    return path.resolve().relative_to(ROOT.resolve()).as_posix()


def _files(prefixes: list[str]) -> list[Path]:
    return [p for p in LIBRARY if any(_rel(p) == x or _rel(p).startswith(x.rstrip("/") + "/") for x in prefixes)]


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is not installed (import-linter is a dev dependency)")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken" in out.stdout


def test_no_function_level_first_party_imports() -> None:
    found = []
    for path in LIBRARY:
        rel = _rel(path)
        if rel in LAZY_ALLOWED:
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                found += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] in FIRST_PARTY]
    assert found == [], "function-level first-party imports (move them to module level):\n" + "\n".join(found)


def test_module_names_appear_as_strings_only_in_the_registry() -> None:
    found = []
    for path in LIBRARY:
        if _rel(path) == "dasflow/registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value) \
                    and node.value not in NOT_IMPORTS:
                found.append(f"{_rel(path)}:{node.lineno} {node.value!r}")
    assert found == [], "module names in strings outside dasflow/registry.py:\n" + "\n".join(found)


def test_consumers_never_name_a_product() -> None:
    products = set(registry.PLUGINS)
    found = []
    for path in _files(CONSUMERS):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in products:
                found.append(f"{_rel(path)}:{node.lineno} {node.value!r}")
    assert found == [], "product names outside the products' own packages:\n" + "\n".join(found)


def test_every_registered_plugin_loads_and_declares_itself() -> None:
    for name in registry.PLUGINS:
        plugin = registry.get_plugin(name)
        assert plugin.name == name
        assert plugin.input_declarations, name
        assert any(d.confidential for d in plugin.input_declarations), name


def test_namespaced_packages_are_imported_under_dasflow_only() -> None:
    """``flows``, ``tasks`` and ``validation`` are installed as ``dasflow.flows`` …; importing the top-level
    folder's name (reachable from a checkout's root) would load a second copy of every module."""
    found = []
    for path in [*LIBRARY, *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py")),
                 *sorted((ROOT / "deployments").rglob("*.py")), *sorted((ROOT / "infra").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in NAMESPACED]
    assert found == [], "import them as dasflow.<name>:\n" + "\n".join(found)
    for name in NAMESPACED:
        assert (ROOT / name).resolve() == (ROOT / "dasflow" / name).resolve(), name


def test_the_no_prefect_contract_covers_every_library_package() -> None:
    """A new subpackage of dasflow (other than flows and tasks) must be listed in the no-Prefect contract."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index('name = "The library never imports Prefect'):]
    listed = set(re.findall(r'"dasflow\.([a-z_]+)"', block[:block.index("forbidden_modules")]))
    present = {p.name for p in (ROOT / "dasflow").iterdir() if (p / "__init__.py").exists()} | \
        {p.stem for p in (ROOT / "dasflow").glob("*.py") if p.name != "__init__.py"}
    assert present - {"flows", "tasks"} == listed
