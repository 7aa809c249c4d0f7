"""Adding a product is one package and one registry line: the ``counts`` plugin package (this directory), which
no dasflow file names, runs through the whole release and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dasflow import registry
from dasflow.io.store import LocalStore
from dasflow.pipeline.run import freeze_config
from tests.dag.helpers import release_config, release_dict, seed_inputs
from tests.dag.test_pipeline import run_all
from tests.plugin_product.plugin import INVARIANTS

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.plugin_product.plugin"


@pytest.fixture
def counts_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.PLUGINS, "counts", MODULE)  # the one line (here undone after the test)


def test_no_dasflow_file_names_the_test_product() -> None:
    for top in ("dasflow", "validation", "flows", "tasks"):
        for path in (ROOT / top).rglob("*.py"):
            assert "plugin_product" not in path.read_text(), path


def test_whole_release_of_a_registered_plugin(tmp_path: Path, counts_registered: None) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    ctx = freeze_config(release_config(str(tmp_path / "store")), store)
    summary = run_all(ctx)  # validate, plan, preprocess, measure, post-process, release
    assert summary["counts"]["keys"] == 2 and summary["counts"]["drawn_now"] == 2
    release = tmp_path / "store/runs/r1/release"
    assert (release / "counts/state.csv").exists() and (release / "counts/state_sex.csv").exists()
    certificate = (release / "CERTIFICATE.md").read_text()
    assert all(line in certificate for line in INVARIANTS)  # the plugin's invariants hook reached the certificate
    assert "counts" in (release / "ACCURACY.html").read_text()  # the accuracy report ran over the product


def test_cli_sees_a_plugin_named_in_the_environment(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    config = tmp_path / "release.json"
    config.write_text(json.dumps(release_dict(str(tmp_path / "store"))))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DASFLOW_PRODUCTS": f"counts={MODULE}"}
    done = subprocess.run([sys.executable, "-m", "dasflow.cli", "budget", str(config), "--json"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert {r["key"] for r in plan["rows"] if r["product"] == "counts"} == {"counts/state", "counts/state_sex"}
    assert plan["totals"]["US"]["rho"] == "3/4"
    without = subprocess.run([sys.executable, "-m", "dasflow.cli", "budget", str(config)],
                             env={**env, "DASFLOW_PRODUCTS": ""}, capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
    assert without.returncode == 2 and "unknown product 'counts'" in without.stderr
