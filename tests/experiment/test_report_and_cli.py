"""The accuracy report's honest labels and the experiment's figures; ``dasflow experiment`` on the demo census."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from dasflow.cli import main
from dasflow.experiment import COLUMNS, method_sha256, run_experiment
from dasflow.experiment.record import recorded, write_outputs
from dasflow.release import accuracy
from dasflow.release.accuracy import accuracy_report
from tests.dag.helpers import release_config
from tests.release.helpers import give_counts_truth, released_context


@pytest.fixture
def counts_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    give_counts_truth(monkeypatch)


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def test_report_labels_and_shows_the_experiment_of_its_method(tmp_path: Path, counts_truth: None) -> None:
    ctx = released_context(tmp_path)
    before = _text(accuracy_report(ctx, accuracy.truth_frames(ctx)))
    assert "Analytic margin of error of the noisy measurements" in before
    assert "not of the published tables" in before
    assert "Observed error against the ground truth of the published tables (this run)" in before
    assert "Not measured: no accuracy experiment is recorded for this method" in before
    exp = run_experiment(ctx.config, runs=5, seed=2)
    write_outputs(exp, tmp_path / "out", ctx.store)
    after = _text(accuracy_report(ctx, accuracy.truth_frames(ctx)))
    assert "Not measured" not in after
    assert "5 seeded runs per budget scale (seed 2) of this exact config" in after
    row = exp.metrics[(exp.metrics["table"] == "state_sex.csv") & (exp.metrics["pop_bin"] == "all")].iloc[0]
    assert f"state_sex.csv all 8 {row['mae']:,.2f} {row['rmse']:,.2f}" in after


def test_production_report_shows_experiment_of_same_method_only(tmp_path: Path, counts_truth: None) -> None:
    ctx = released_context(tmp_path, seed=None)
    other = release_config(str(tmp_path / "store"), rho=("1", "1/4"))    # another budget: another method
    assert method_sha256(other) != method_sha256(ctx.config)
    write_outputs(run_experiment(other, runs=2), tmp_path / "other", ctx.store)
    page = _text(accuracy_report(ctx, None))
    assert "TEST RELEASE" not in page and "Not measured" in page
    synthetic_twin = release_config(str(tmp_path / "store"), release_id="twin")  # same products, test rng
    assert method_sha256(synthetic_twin) == method_sha256(ctx.config)
    write_outputs(run_experiment(synthetic_twin, runs=2), tmp_path / "twin", ctx.store)
    page = _text(accuracy_report(ctx, None))
    assert "of the same product configs on synthetic inputs" in page and "state_sex.csv" in page
    found = recorded(ctx.store, method_sha256(ctx.config))
    assert found is not None and found[0]["release_id"] == "twin"


@pytest.fixture(scope="module")
def demo_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dasflow.demo import prepare_demo

    root = tmp_path_factory.mktemp("demo")
    cfg = prepare_demo(root / "store", 2000, seed=4)
    raw = json.loads(cfg.canonical_json()) | {"store": str(root / "store")}
    path = root / "release.json"
    path.write_text(json.dumps(raw))
    return path


def test_cli_on_the_demo_census(demo_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "exp"
    code = main(["experiment", str(demo_config), "--runs", "2", "--out", str(out), "--budget-scale", "0.5,2",
                 "--products", "groupsize,phsafe", "--seed", "3"])
    assert code == 0, capsys.readouterr().err
    metrics = pd.read_csv(out / "metrics.csv", dtype={"pop_bin": str})
    assert list(metrics.columns) == list(COLUMNS)
    assert set(metrics["product"]) == {"groupsize", "phsafe"} and set(metrics["budget_scale"]) == {0.5, 2.0}
    assert (metrics["runs"] == 2).all() and (metrics["cells"] > 0).all()
    nation = metrics[(metrics["table"] == "groupsize_nation.csv") & (metrics["pop_bin"] == "all")]
    assert list(nation["geolevel"]) == ["nation", "nation"] and nation["within_moe"].notna().all()
    assert set(metrics[metrics["product"] == "phsafe"]["geolevel"]) == {"USA", "STATE"}
    # more budget, less error: the sweep is real
    pooled = metrics[metrics["pop_bin"] == "all"].groupby("budget_scale")["rmse"].mean()
    assert pooled[2.0] < pooled[0.5]
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4      # by size + vs budget, per product
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["products"] == ["groupsize", "phsafe"] and meta["seed"] == 3
    store = Path(json.loads(demo_config.read_text())["store"])
    assert (store / "experiments" / meta["method_sha256"] / "metrics.csv").read_bytes() == \
        (out / "metrics.csv").read_bytes()
    assert not (store / "runs").exists()


def test_cli_bad_input_exits_2(demo_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["experiment", str(demo_config), "--runs", "1", "--out", str(tmp_path), "--budget-scale", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--budget-scale" in err and len(err.strip().splitlines()) == 1
