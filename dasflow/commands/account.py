"""``dasflow account open|show|abandon``: the privacy-loss account of one confidential dataset and universe.

``open NAME --store URI --universe US (--cap-rho R | --cap-epsilon E) [--relation ...]`` creates the account
(create-only; its terms never change). ``show NAME --store URI [--json]`` lists every release reserved from it,
its plan converted to the account's relation, what it drew, the cumulative spend and what remains.
``abandon NAME RELEASE_ID --store URI`` returns the reservation of a release that drew nothing (exit 3 if it drew
anything: it stays charged in full).
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction

from dasflow.errors import InputError
from dasflow.io.store import open_store
from dasflow.privacy import account, relations


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``account`` sub-command's arguments (called from ``dasflow.cli``)."""
    a = sub.add_parser("account", help="privacy-loss accounts: a lifetime cap per confidential dataset")
    acts = a.add_subparsers(dest="action", required=True)
    o = acts.add_parser("open", help="open an account (once) with its lifetime cap")
    o.add_argument("name")
    o.add_argument("--universe", choices=["US", "PR"], required=True)
    caps = o.add_mutually_exclusive_group(required=True)
    caps.add_argument("--cap-rho", help="lifetime zCDP cap rho (exact decimal or p/q)")
    caps.add_argument("--cap-epsilon", help="lifetime pure-DP cap epsilon (exact decimal or p/q)")
    o.add_argument("--relation", choices=list(relations.RELATIONS), default=relations.ADD_REMOVE)
    s = acts.add_parser("show", help="releases, plans, spend and what remains")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    b = acts.add_parser("abandon", help="return the reservation of a release that drew nothing")
    b.add_argument("name")
    b.add_argument("release_id")
    for p in (o, s, b):
        p.add_argument("--store", required=True, help="the store (directory or s3://bucket/prefix)")


def _exact(text: str | None, flag: str) -> Fraction | None:
    if text is None:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise InputError(f"{text!r} is not an exact number", column=flag) from None


def run(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    if args.action == "open":
        acct = account.open_account(store, args.name, args.universe, relation=args.relation,
                                    cap_rho=_exact(args.cap_rho, "--cap-rho"),
                                    cap_epsilon=_exact(args.cap_epsilon, "--cap-epsilon"))
        print(f"account {acct.name}: universe {acct.universe}, relation {acct.relation}, lifetime cap "
              f"{acct.unit} = {acct.cap} ({store.uri}/accounts/{acct.name}/)")
        return 0
    if args.action == "abandon":
        slot = account.abandon(store, args.name, args.release_id)
        print(f"account {args.name}: reservation of {args.release_id} returned ({-slot.amount}); remaining "
              f"{account.load_account(store, args.name).cap - slot.cumulative}")
        return 0
    summary = account.summary(store, args.name)
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
        return 0
    terms = summary["account"]
    unit = summary["unit"]
    print(f"account {terms['name']}  universe {terms['universe']}  relation {terms['relation']}  "
          f"cap {unit} = {terms['cap'][unit]}")
    print(f"{'release':<40} {'state':<9} {'reserved':>14} {'charged':>14} {'drawn':>14}  drawn keys")
    for r in summary["releases"]:
        drawn = "whole plan" if r["drawn"] is None else r["drawn"]  # no ledger: a standalone run
        print(f"{r['release_id']:<40} {r['state']:<9} {r['reserved']:>14} {r['charged']:>14} {drawn:>14}  "
              f"{r['keys_committed']}/{r['keys_planned']}")
        for name, p in sorted(r["products"].items()):
            print(f"    {name:<12} {p['relation']:<36} own rho {p['own']['rho']} -> {p['converted']['rho']}")
    print(f"spent {unit} = {summary['spent']}, remaining {summary['remaining']}; lifetime epsilon = "
          f"{summary['epsilon_at_delta']} at delta = {summary['delta']} ({summary['conversion']})")
    return 0
