"""Privacy-loss accounting of the standalone Census-format commands (``dasflow phsafe private``, ``dasflow
safetab-p execute``): a private run outside a release reserves its whole plan from its dataset's account before
any noise is drawn, and refuses without one.

Privacy: each execution draws fresh noise, so each is its own reservation (a new run id) charged in full; the
reservation is the ledger's create-only write, made before the caller measures anything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterable, Sequence

from dasflow.errors import InputError, LedgerRefusal
from dasflow.io.store import new_token, open_store
from dasflow.privacy import account, relations
from dasflow.privacy.measurement import MeasurementSpec


def add_account_arguments(parser: argparse.ArgumentParser) -> None:
    """``--account NAME`` (repeatable: one per universe) and ``--store URI`` (the store holding the accounts)."""
    parser.add_argument("--account", action="append", default=None,
                        help="privacy-loss account to spend from (one per universe; repeat for US and PR)")
    parser.add_argument("--store", default=None, help="the store holding the account")


def spend_standalone(args: argparse.Namespace, command: str,
                     plans: Iterable[tuple[str, Sequence[MeasurementSpec]]]) -> list[str]:
    """Reserve each universe's whole plan from its account (``args.account``, one per universe, in
    ``args.store``) before any noise is drawn; ``LedgerRefusal`` (exit 3) without one. Returns the run ids
    reserved."""
    names = list(getattr(args, "account", None) or [])
    if not names:
        raise LedgerRefusal(f"{command}: a private run spends privacy-loss budget: name the account of its "
                            "confidential dataset (--account NAME --store URI; dasflow account open)")
    if not getattr(args, "store", None):
        raise InputError("--account needs --store (the store holding the account)", column="--store")
    store = open_store(args.store)
    by_universe: dict[str, str] = {}
    for name in names:
        by_universe.setdefault(account.load_account(store, name).universe, name)
    run_ids = []
    for universe, specs in plans:
        name = by_universe.get(universe)
        if name is None:
            raise LedgerRefusal(f"{command}: no account for universe {universe} among {names}; nothing drawn")
        digest = hashlib.sha256(json.dumps(relations.audit_record(list(specs)), sort_keys=True).encode())
        run_id = f"{command.replace(' ', '-')}-{universe}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-" \
                 f"{new_token()[:8]}"
        slot = account.reserve(store, name, release_id=run_id, universe=universe, config_sha256=digest.hexdigest(),
                               specs=specs, standalone=True)
        print(f"{command}: reserved {slot.record['unit']} = {slot.amount} from account {name} as {run_id} "
              f"(remaining {account.load_account(store, name).cap - slot.cumulative})", file=sys.stderr)
        run_ids.append(run_id)
    return run_ids
