"""The experiment as a real Prefect flow (ephemeral API): same files as the CLI, artifacts for the UI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.testing.utilities import prefect_test_harness

from dasflow.experiment import COLUMNS
from tests.dag.helpers import release_dict, seed_inputs
from tests.release.helpers import give_counts_truth

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect-harness")]


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_experiment_flow_writes_outputs_and_artifacts(harness: None, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dasflow.flows.experiment import experiment_flow
    from dasflow.io.store import LocalStore

    give_counts_truth(monkeypatch)
    seed_inputs(LocalStore(tmp_path / "store"))
    config = tmp_path / "release.json"
    config.write_text(json.dumps(release_dict(str(tmp_path / "store"), release_id="exp-flow")))
    result = experiment_flow(str(config), runs=3, out=str(tmp_path / "out"), budget_scales="1,2", seed=4)
    metrics = pd.read_csv(result["paths"]["metrics.csv"])
    assert list(metrics.columns) == list(COLUMNS) and set(metrics["budget_scale"]) == {1.0, 2.0}
    assert result["meta"]["runs"] == 3 and not (tmp_path / "store" / "runs").exists()
    with get_client(sync_client=True) as client:
        keys = {a.key: a for a in client.read_artifacts()}
    assert "Accuracy experiment" in str(keys["experiment-exp-flow"].data)
    assert "data:image/png;base64," in str(keys["experiment-exp-flow"].data)
    assert "state_sex.csv" in str(keys["experiment-metrics-exp-flow"].data)
    assert "out/report.html" in str(keys["experiment-report-exp-flow"].data)
