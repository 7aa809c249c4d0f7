"""The deployment definitions resolve: every prefect.yaml entry point is a flow whose parameter schema accepts
the deployment's parameters (what the UI form renders), and serve.py builds the same deployments."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from prefect import Flow
from prefect.utilities.callables import parameter_schema

from dasflow.errors import InputError

REPO = Path(__file__).resolve().parents[2]
NAMES = ["release", "release-from-file", "resume-release", "rerun-postprocess", "ledger-report", "publish",
         "accuracy-experiment"]


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
    assert names == NAMES
    release = next(d for d in spec["deployments"] if d["name"] == "release")
    assert release["schedules"] == [{"cron": "0 2 * * *", "timezone": "America/New_York", "active": False}]
    assert all(s["active"] is False for d in spec["deployments"] for s in d.get("schedules", []))


def test_release_form_is_typed_with_working_defaults(tmp_path: Path) -> None:
    """The UI form: every release parameter is a typed field; its defaults build a valid release config (the
    packaged Census production configs of PHSafe and SafeTab-P, the synthetic census layout, an account)."""
    from dasflow.flows.release_form import ProductChoice, ReleaseParameters, release_from_form

    schema = parameter_schema(release_from_form.fn).model_dump()
    form = schema["definitions"]["ReleaseParameters"]["properties"]
    assert {"release_id", "universe", "account", "store", "inputs", "products", "cap_rho", "rng_mode",
            "seed"} <= set(form)
    assert form["universe"]["enum"] == ["US", "PR"] and form["rng_mode"]["enum"] == ["production", "test"]
    assert schema["definitions"]["ProductChoice"]["properties"]["name"]["enum"][:2] == ["phsafe", "safetab-p"]
    cfg = ReleaseParameters().release_config(REPO)
    assert cfg.release_id == "synth-us-v1" and cfg.account == "synth-us" and cfg.rng.mode == "production"
    assert [p.name for p in cfg.products] == ["phsafe", "safetab-p"] and cfg.cap.rho == "7"
    assert cfg.products[0].config_text == (REPO / "dasflow/demo_data/phsafe-us-config.json").read_text()
    with pytest.raises(InputError, match=r"products\[0\].config_file"):
        ReleaseParameters(products=[ProductChoice(name="phsafe", config_file="nope.json")]).release_config(tmp_path)
    with pytest.raises(ValueError, match="cap_rho"):
        ReleaseParameters(cap_rho="0.1e3")


def test_serve_builds_the_same_deployments_with_inactive_schedules() -> None:
    import sys

    sys.path.insert(0, str(REPO / "deployments"))
    try:
        serve = importlib.import_module("serve")
    finally:
        sys.path.pop(0)
    built = serve.deployments()
    spec = yaml.safe_load((REPO / "deployments/prefect.yaml").read_text())
    assert [d.name for d in built] == NAMES
    for dep, entry in zip(built, spec["deployments"], strict=True):
        path, func = entry["entrypoint"].split(":")
        assert dep.flow_name == getattr(importlib.import_module(path[:-3].replace("/", ".")), func).name
        assert (dep.parameters or {}) == (entry["parameters"] or {})
        assert [(s.schedule.cron, s.active) for s in dep.schedules or []] == \
            [(s["cron"], s["active"]) for s in entry.get("schedules", [])]


def test_task_runner_follows_the_execution_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Threads by default; "dask" attaches to the configured scheduler (run_release starts a local cluster
    when none is given, see tests/dag/test_scale_out.py); never a silent fallback to threads."""
    import pytest
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask.task_runners import DaskTaskRunner

    from dasflow.config import parse_release_config
    from dasflow.errors import InputError
    from dasflow.flows.release import task_runner
    from tests.dag.helpers import release_dict

    raw = release_dict(str(tmp_path / "store"))
    assert isinstance(task_runner(parse_release_config(raw)), ThreadPoolTaskRunner)
    dask = task_runner(parse_release_config(raw | {"task_runner": "dask", "dask_address": "tcp://10.1.2.3:8786"}))
    assert isinstance(dask, DaskTaskRunner) and dask.address == "tcp://10.1.2.3:8786"
    with pytest.raises(InputError, match="dask_address"):
        task_runner(parse_release_config(raw | {"task_runner": "dask"}))


def test_release_form_defaults_validate_on_the_seeded_stack_store(tmp_path: Path) -> None:
    """`infra/local/stack seed` writes what the form's defaults name (the synthetic census, the account); with it
    the default release validates: inputs pass, the plan fits the cap."""
    from dasflow.cli import main
    from dasflow.flows.release_form import ReleaseParameters
    from dasflow.io.store import LocalStore
    from tests.infra.stack_module import stack_module

    stack_module().seed_store(LocalStore(tmp_path / "store"), persons=2000)
    cfg = ReleaseParameters(store=str(tmp_path / "store")).release_config(REPO)
    path = tmp_path / "release.json"
    path.write_text(cfg.model_dump_json())
    assert main(["validate", str(path)]) == 0
    assert (tmp_path / "store/accounts/synth-us/account.json").is_file()
