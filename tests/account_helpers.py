"""Privacy-loss accounts for tests of the standalone Census-format commands (they refuse to spend without one)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from dasflow.io.store import LocalStore
from dasflow.privacy.account import open_account


def account_args(tmp: Path, cap_rho: str = "1000") -> list[str]:
    """Open a US and a PR account in ``tmp/account-store``; the command-line flags that spend from them."""
    store = LocalStore(tmp / "account-store")
    open_account(store, "cef-us", "US", cap_rho=Fraction(cap_rho))
    open_account(store, "cef-pr", "PR", cap_rho=Fraction(cap_rho))
    return ["--account", "cef-us", "--account", "cef-pr", "--store", str(tmp / "account-store")]
