"""The Census-format commands spend from the dataset's account: refused without one, and a second run over an
exhausted account draws nothing (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dasflow.cli import main
from tests.account_helpers import account_args
from tests.safetab_p.helpers import TOY, TOY_ZCDP


def test_safetab_p_execute_spends_from_its_account(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["safetab-p", "execute", str(TOY_ZCDP), str(TOY), str(tmp_path / "none")]) == 3
    assert not (tmp_path / "none").exists()
    flags = account_args(tmp_path, cap_rho="7")  # one toy run plans rho = 6.27 (US)
    assert main(["safetab-p", "execute", str(TOY_ZCDP), str(TOY), str(tmp_path / "a"), *flags]) == 0
    assert main(["safetab-p", "execute", str(TOY_ZCDP), str(TOY), str(tmp_path / "b"), *flags]) == 3
    assert "only 73/100 of the lifetime cap 7 remains; nothing drawn" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    assert main(["account", "show", "cef-us", "--store", str(tmp_path / "account-store"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["spent"] == "627/100" and len(shown["releases"]) == 1
    assert shown["releases"][0]["release_id"].startswith("safetab-p-execute-US-")
    run_id = shown["releases"][0]["release_id"]
    assert main(["account", "abandon", "cef-us", run_id, "--store", str(tmp_path / "account-store")]) == 3
