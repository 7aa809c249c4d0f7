"""The deployment definitions resolve: every prefect.yaml entry point is a flow whose parameter schema accepts
the deployment's parameters (what the UI form renders), and serve.py builds the same deployments."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml
from prefect import Flow
from prefect.utilities.callables import parameter_schema

REPO = Path(__file__).resolve().parents[2]


def test_prefect_yaml_entrypoints_are_flows_with_matching_parameters() -> None:
    spec = yaml.safe_load((REPO / "deployments/prefect.yaml").read_text())
    names = []
    for dep in spec["deployments"]:
        path, func = dep["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, func)
        assert isinstance(flow, Flow), dep["name"]
        schema = parameter_schema(flow.fn)
        assert set(dep["parameters"]) <= set(schema.properties), dep["name"]
        assert set(schema.required or []) <= set(dep["parameters"]), dep["name"]
        assert dep["work_pool"]["name"] == "dasflow-process"
        names.append(dep["name"])
    assert names == ["scheduled-release", "resume-release", "rerun-postprocess", "ledger-report", "publish"]
    release = next(d for d in spec["deployments"] if d["name"] == "scheduled-release")
    assert release["schedules"][0]["cron"] == "0 2 * * *"


def test_release_form_is_typed() -> None:
    from flows.release import release_from_file

    schema = parameter_schema(release_from_file.fn).model_dump()
    definitions = schema["definitions"]
    assert definitions["ReleaseRequest"]["properties"]["config_path"]["type"] == "string"


def test_serve_builds_the_same_deployments() -> None:
    import sys

    sys.path.insert(0, str(REPO / "deployments"))
    try:
        serve = importlib.import_module("serve")
    finally:
        sys.path.pop(0)
    built = serve.deployments()
    assert [d.name for d in built] == ["scheduled-release", "resume-release", "rerun-postprocess", "ledger-report",
                                       "publish"]


def test_task_runner_follows_the_execution_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Threads by default; "dask" attaches to the configured scheduler (run_release starts a local cluster
    when none is given, see tests/dag/test_scale_out.py); never a silent fallback to threads."""
    import pytest
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask.task_runners import DaskTaskRunner

    from dasflow.config import parse_release_config
    from dasflow.errors import InputError
    from flows.release import task_runner
    from tests.dag.helpers import release_dict

    raw = release_dict(str(tmp_path / "store"))
    assert isinstance(task_runner(parse_release_config(raw)), ThreadPoolTaskRunner)
    dask = task_runner(parse_release_config(raw | {"task_runner": "dask", "dask_address": "tcp://10.1.2.3:8786"}))
    assert isinstance(dask, DaskTaskRunner) and dask.address == "tcp://10.1.2.3:8786"
    with pytest.raises(InputError, match="dask_address"):
        task_runner(parse_release_config(raw | {"task_runner": "dask"}))
