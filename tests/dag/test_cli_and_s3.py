"""The read-only commands (status, ledger, budget) in-process, and a whole release on an S3 store (moto)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

from dasflow.cli import main
from dasflow.config import parse_release_config
from dasflow.io.store import S3Store, sha256_bytes
from dasflow.pipeline.run import freeze_config
from tests.dag import counts_product  # noqa: F401  (registers the product)
from tests.dag.helpers import local_release, release_dict, seed_inputs
from tests.dag.test_pipeline import run_all
from tests.servers import make_bucket, moto_server, s3_client

REPO = Path(__file__).resolve().parents[2]


def test_status_and_ledger_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, cfg = local_release(tmp_path)
    run_all(freeze_config(cfg, store))
    assert main(["status", "r1", "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "RELEASED" in out and "planned rho = 3/4" in out and "spent rho = 3/4" in out
    assert main(["ledger", "r1", "--store", str(tmp_path / "store"), "--format", "json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [e["key"] for e in record["entries"]] == ["counts/state", "counts/state_sex"]
    assert main(["ledger", "r1", "--store", str(tmp_path / "store"), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("product,key,")


def test_status_of_unknown_release_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "nope", "--store", str(tmp_path)]) == 2
    assert "no release 'nope'" in capsys.readouterr().err


def test_budget_reproduces_phsafe_totals(capsys: pytest.CaptureFixture[str]) -> None:
    """PHSafe Table 10 budgets: US total ρ = 1.257281 (read from the config alone)."""
    assert main(["budget", str(REPO / "dasflow/demo_data/phsafe-us-config.json"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["format"] == "phsafe"
    assert result["totals"]["US"]["rho"] == "1257281/1000000"


def test_budget_of_safetab_config_splits_stages(capsys: pytest.CaptureFixture[str]) -> None:
    """SafeTab-P 2020 production config: US total ρ = 4.944, each level split γ / (1 − γ) between stages."""
    assert main(["budget", str(REPO / "dasflow/demo_data/safetab-p-config.json"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["totals"]["US"]["rho"] == "618/125"  # 4.944
    stage_budgets = {r["key"]: r["budget"] for r in result["rows"] if r["universe"] == "US"}
    assert all(k.endswith(("stage1", "stage2")) for k in stage_budgets)


def test_budget_of_release_config_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local_release(tmp_path)
    path = tmp_path / "release.json"
    path.write_text(json.dumps(release_dict(str(tmp_path / "store"))))
    assert main(["budget", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["US"]["rho"] == "3/4"
    assert main(["budget", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["budget", str(tmp_path / "junk.json")]) == 2


@pytest.mark.xdist_group("s3servers")
def test_a_release_on_an_s3_store_is_the_same_code_path(tmp_path: Path) -> None:
    with moto_server() as endpoint:
        bucket = f"dasflow-{uuid.uuid4().hex[:10]}"
        make_bucket(endpoint, bucket)
        store = S3Store(f"s3://{bucket}/prod", client=s3_client(endpoint))
        seed_inputs(store)
        cfg = parse_release_config(release_dict(f"s3://{bucket}/prod"))
        ctx = freeze_config(cfg, store)
        run_all(ctx)
        again = run_all(freeze_config(cfg, store))
        assert again["counts"]["drawn_now"] == 0
        keys = store.list("runs/r1/")
        assert "runs/r1/release/MANIFEST.json" in keys
        assert sum(k.endswith(".committed.json") for k in keys) == 2
        # the same release on local disk gives byte-identical tables (the store is not part of the release)
        local_store, local_cfg = local_release(tmp_path)
        run_all(freeze_config(local_cfg, local_store))
        for name in ("counts/state.csv", "counts/state_sex.csv"):
            assert store.get(f"runs/r1/release/{name}") == local_store.get(f"runs/r1/release/{name}")


# ---------------------------------------------------------------- operator-facing failures: one line, exit code
class _FlakyClient:
    """An S3 client whose calls fail with ``error`` ``failures`` times before succeeding."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error, self.failures, self.calls = error, failures, 0

    def put_object(self, **_: object) -> dict[str, object]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return {}


def _fast(store: S3Store) -> S3Store:
    store.backoff, store.max_backoff = 0.001, 0.002
    return store


def test_transient_s3_faults_are_retried_with_backoff_then_one_line() -> None:
    from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

    from dasflow.io.store import StoreFault, StoreUnavailable

    for error in (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
                  ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
                  ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
                  ClientError(cast(Any, {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}),
                              "PutObject")):
        healed = _FlakyClient(error, failures=2)
        assert _fast(S3Store("s3://b/p", client=healed)).put("k", b"x") == sha256_bytes(b"x")
        assert healed.calls == 3
        down = _FlakyClient(error, failures=99)
        with pytest.raises(StoreUnavailable, match=r"unavailable .* after 5 attempts") as info:
            _fast(S3Store("s3://b/p", client=down)).put("k", b"x")
        assert down.calls == 5 and "\n" not in str(info.value)
    # a refusal is not transient: no retry
    denied = _FlakyClient(ClientError(cast(Any, {"Error": {"Code": "AccessDenied", "Message": "no"},
                                                 "ResponseMetadata": {"HTTPStatusCode": 403}}), "PutObject"),
                          failures=99)
    with pytest.raises(StoreFault, match="AccessDenied"):
        _fast(S3Store("s3://b/p", client=denied)).put("k", b"x")
    assert denied.calls == 1


def _no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_missing_credentials_and_outage_are_one_line_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _no_aws_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert main(["ledger", "r1", "--store", "s3://b/p"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no S3 credentials" in err and "Traceback" not in err
    # an unreachable endpoint: retried, then one line naming the outage (never "no release")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setattr(S3Store, "backoff", 0.001)
    assert main(["status", "r1", "--store", "s3://b/p"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "S3 endpoint is unavailable (EndpointConnectionError)" in err


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    store, cfg = local_release(tmp_path)
    run_all(freeze_config(cfg, store))
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["ledger", "r1", "--store", str(tmp_path / "store"), "--format", "csv"]) == 0
    assert capsys.readouterr().err == ""


def test_an_unexpected_error_is_one_line_without_its_message(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import dasflow.commands.release as release_commands

    def boom(args: object) -> int:
        raise ValueError("confidential value 123-45-6789")

    monkeypatch.setattr(release_commands, "status_command", boom)
    assert main(["status", "r1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "builtins.ValueError" in err and "123-45" not in err


def test_postprocess_and_publish_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, cfg = local_release(tmp_path)  # a seeded TEST release
    run_all(freeze_config(cfg, store))
    uri = str(tmp_path / "store")
    ledger_before = {k: store.sha256(k) for k in store.list("runs/r1/ledger/")}
    tables = {k: store.get(k) for k in store.list("runs/r1/release/") if k.endswith(".csv")}
    assert main(["postprocess", "r1", "--store", uri]) == 0
    assert "ledger unchanged" in capsys.readouterr().out
    assert {k: store.sha256(k) for k in store.list("runs/r1/ledger/")} == ledger_before
    assert {k: store.get(k) for k in tables} == tables  # same measurements, same post-processing
    # publication: never inside the store, a test release only as a marked test publication
    assert main(["publish", "r1", "--store", uri, "--target", str(tmp_path / "store" / "pub")]) == 1
    assert "TEST release" in capsys.readouterr().err
    assert main(["publish", "r1", "--store", uri, "--target", str(tmp_path / "store" / "pub"),
                 "--test-publication"]) == 1
    err = capsys.readouterr().err
    assert "not separate" in err and err.count("\n") == 1
    assert main(["publish", "r1", "--store", uri, "--target", str(tmp_path / "pub"), "--test-publication"]) == 0
    assert "published (test)" in capsys.readouterr().out
    assert (tmp_path / "pub/test-releases/r1/PUBLICATION.json").is_file()
    assert main(["postprocess", "nope", "--store", uri]) == 2


@pytest.mark.slow
def test_a_refused_run_prints_no_traceback(tmp_path: Path) -> None:
    """A release over its cap, run as an operator would (a subprocess on Prefect's temporary server): exit 3,
    the refusal as the last line, and no traceback on the console (it stays in the Prefect UI)."""
    local_release(tmp_path)
    path = tmp_path / "refused.json"
    path.write_text(json.dumps(release_dict(str(tmp_path / "store"), cap="1/2")))
    env = {**os.environ, "PYTHONPATH": str(REPO), "DASFLOW_PRODUCTS": "counts=tests.plugin_product.plugin",
           "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-m", "dasflow.cli", "run", str(path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 12
    assert "dasflow run: refused by the privacy ledger: plan total rho = 3/4" in done.stderr
    assert not (tmp_path / "store/runs/r1/measurements").exists()
