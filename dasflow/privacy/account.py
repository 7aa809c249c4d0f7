"""Privacy-loss accounts: one lifetime cap per confidential dataset and universe, across every release.

Store layout (create-only objects only; nothing here is ever overwritten or deleted)::

    accounts/{NAME}/account.json        universe, neighbouring relation, lifetime cap (ρ, or pure ε)
    accounts/{NAME}/slots/{seq}.json     the account's history: one slot per reservation or return, numbered
                                         0, 1, 2, ...; each records its predecessor's SHA-256 and the
                                         cumulative spend after it

A release naming the account reserves its whole plan, converted to the account's relation
(``dasflow.privacy.relations``), before any noise: the reserving process reads the chain up to its head n−1,
checks head cumulative + plan ≤ cap, and claims slot n with a create-only write (``put_if_absent``). Two racing
reservations cannot both claim slot n; the loser re-reads the chain (now including the winner) and checks again.
Every slot's cumulative was checked against the cap by its claimer with full knowledge of all earlier slots, so
the account can never exceed its cap, whatever the interleaving (the test races processes on disk and on S3).

A reservation is charged in full unless it is returned by ``abandon``, which first writes the release's
tombstone ``runs/{id}/ledger/abandoned.json`` (create-only; the ledger refuses to draw once it exists) and only
then checks that no ledger entry or noisy measurement of the release exists. The ledger writes a key's reserved
entry before it checks the tombstone and draws, so either abandon sees that entry (no return: charged in full)
or the ledger sees the tombstone (nothing drawn): a return is never granted for a release that drew anything.

Privacy argument: every release's noise is a mechanism of the reserved budget under the account's relation
(conversion proofs in ``relations``); the releases over the same dataset compose sequentially (zCDP ρ add; a
pure-DP account adds ε), so the account's cumulative is a bound on the total loss, and it never exceeds the cap.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dasflow.errors import InputError, IntegrityError, LedgerRefusal
from dasflow.io.store import ObjectStore, StoreError, sha256_bytes
from dasflow.privacy import accounting, relations
from dasflow.privacy.composition import DELTA, compose_plan
from dasflow.privacy.ledger import Ledger, spec_from_record
from dasflow.privacy.measurement import MeasurementSpec

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: retries of a reservation that lost a race (each retry re-reads the chain; a loser only retries because some
#: other reservation was appended, so this bounds contention, not correctness)
MAX_ATTEMPTS = 1000


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode("utf-8")


def _opt(text: str | None) -> Fraction | None:
    return None if text is None else Fraction(text)


@dataclass(frozen=True)
class Account:
    """An account's fixed terms (``account.json``)."""

    name: str
    universe: str
    relation: str
    cap_rho: Fraction | None
    cap_epsilon: Fraction | None

    @property
    def unit(self) -> str:
        """What the account adds up: ``epsilon`` (pure-DP account) or ``rho`` (zCDP)."""
        return "epsilon" if self.cap_epsilon is not None else "rho"

    @property
    def cap(self) -> Fraction:
        cap = self.cap_epsilon if self.cap_epsilon is not None else self.cap_rho
        assert cap is not None
        return cap

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "universe": self.universe, "relation": self.relation,
                "cap": {"rho": None if self.cap_rho is None else str(self.cap_rho),
                        "epsilon": None if self.cap_epsilon is None else str(self.cap_epsilon)},
                "format": 1}


@dataclass(frozen=True)
class Slot:
    """One entry of an account's chain: a reservation (amount > 0) or a return (amount < 0) of a release."""

    seq: int
    kind: str
    release_id: str
    amount: Fraction
    cumulative: Fraction
    sha256: str
    record: dict[str, Any]


def _root(name: str) -> str:
    if not NAME.match(name):
        raise InputError(f"account name {name!r} must match {NAME.pattern}", column="account")
    return f"accounts/{name}"


def _slot_key(name: str, seq: int) -> str:
    return f"{_root(name)}/slots/{seq:08d}.json"


def tombstone_key(release_id: str) -> str:
    """The create-only marker of an abandoned release: the ledger never draws for it once it exists."""
    return f"runs/{release_id}/ledger/abandoned.json"


def open_account(store: ObjectStore, name: str, universe: str, *, relation: str = relations.ADD_REMOVE,
                 cap_rho: Fraction | None = None, cap_epsilon: Fraction | None = None) -> Account:
    """Create the account (create-only). Re-opening with identical terms is a no-op; different terms are
    refused: an account's cap and relation never change."""
    if (cap_rho is None) == (cap_epsilon is None):
        raise InputError("an account needs exactly one lifetime cap: --cap-rho or --cap-epsilon")
    cap = cap_rho if cap_rho is not None else cap_epsilon
    if cap is None or cap <= 0:
        raise InputError(f"the lifetime cap must be positive, got {cap}")
    if relation not in relations.RELATIONS:
        raise InputError(f"relation {relation!r} is not one of {list(relations.RELATIONS)}")
    if universe not in ("US", "PR"):
        raise InputError(f"universe {universe!r} is not US or PR")
    account = Account(name, universe, relation, cap_rho, cap_epsilon)
    key = f"{_root(name)}/account.json"
    if not store.put_if_absent(key, _dumps(account.record())):
        existing = load_account(store, name)
        if existing != account:
            raise LedgerRefusal(f"account {name!r} already exists in {store.uri} with other terms "
                                f"({existing.record()}); an account's terms never change")
    return account


def load_account(store: ObjectStore, name: str) -> Account:
    key = f"{_root(name)}/account.json"
    try:
        rec = json.loads(store.get(key))
    except StoreError:
        raise LedgerRefusal(f"no privacy-loss account {name!r} in {store.uri} (open it first: dasflow account "
                            "open)") from None
    except ValueError:
        raise IntegrityError(f"{store.uri}/{key}: unreadable account") from None
    return Account(rec["name"], rec["universe"], rec["relation"], _opt(rec["cap"]["rho"]),
                   _opt(rec["cap"]["epsilon"]))


def read_chain(store: ObjectStore, name: str) -> list[Slot]:
    """The account's slots in order, each verified against its predecessor (hash link, cumulative)."""
    account = load_account(store, name)
    prefix = f"{_root(name)}/slots/"
    n = len([k for k in store.list(prefix) if k.endswith(".json")])
    while store.exists(_slot_key(name, n)):  # a listing may lag a concurrent claim
        n += 1
    chain: list[Slot] = []
    prev_sha, cumulative = "", Fraction(0)
    for seq in range(n):
        key = _slot_key(name, seq)
        try:
            data = store.get(key)
            rec = json.loads(data)
        except (StoreError, ValueError):
            raise IntegrityError(f"{store.uri}/{key}: missing or unreadable account slot") from None
        amount = Fraction(rec["amount"])
        cumulative += amount
        if rec.get("seq") != seq or rec.get("prev_sha256") != prev_sha or Fraction(rec["cumulative"]) != cumulative \
                or cumulative > account.cap or cumulative < 0:
            raise IntegrityError(f"{store.uri}/{key}: the account chain does not add up at slot {seq}")
        prev_sha = sha256_bytes(data)
        chain.append(Slot(seq, rec["kind"], rec["release_id"], amount, cumulative, prev_sha, rec))
    return chain


def require_fits(account: Account, head: Fraction, amount: Fraction, who: str) -> Fraction:
    """The one lifetime-cap check: ``head + amount`` within the account's cap, or ``LedgerRefusal`` (nothing is
    drawn). Returns the new cumulative."""
    cumulative = head + amount
    if cumulative > account.cap:
        raise LedgerRefusal(
            f"account {account.name!r}: {who} needs {account.unit} = {amount} but only {account.cap - head} of the "
            f"lifetime cap {account.cap} remains; nothing drawn")
    return cumulative


def _append(store: ObjectStore, account: Account, build: Any) -> Slot:
    """Claim the next slot: ``build(chain)`` returns the slot's record fields (or a Slot already in the chain,
    or raises); the cap check and the create-only claim are repeated until this process wins a slot."""
    for _ in range(MAX_ATTEMPTS):
        chain = read_chain(store, account.name)
        fields = build(chain)
        if isinstance(fields, Slot):
            return fields
        amount = Fraction(fields["amount"])
        head = chain[-1].cumulative if chain else Fraction(0)
        cumulative = require_fits(account, head, amount, f"release {fields['release_id']!r}")
        seq = len(chain)
        record = {**fields, "amount": str(amount), "seq": seq, "cumulative": str(cumulative),
                  "prev_sha256": chain[-1].sha256 if chain else "", "time": time.time()}
        data = _dumps(record)
        # Read back: on a store whose create-only write is not atomic, a racing writer may have replaced the slot;
        # then this process did not win it and tries again (``require_reserved`` re-checks before any noise).
        key = _slot_key(account.name, seq)
        if store.put_if_absent(key, data) and store.get(key) == data:
            return Slot(seq, record["kind"], record["release_id"], amount, cumulative, sha256_bytes(data), record)
    raise LedgerRefusal(f"account {account.name!r}: could not claim a slot after {MAX_ATTEMPTS} attempts")


def reservation(chain: Sequence[Slot], release_id: str) -> tuple[Slot | None, Slot | None]:
    """The release's reservation and its return (if any)."""
    res = next((s for s in chain if s.kind == "reserve" and s.release_id == release_id), None)
    ret = next((s for s in chain if s.kind == "return" and s.release_id == release_id), None)
    return res, ret


def plan_charge(account: Account, specs: Sequence[MeasurementSpec]) -> tuple[Fraction, dict[str, Any]]:
    """The plan's charge in the account's unit (converted to its relation) and a per-product breakdown."""
    converted = relations.convert_specs(list(specs), account.relation)
    total = compose_plan(converted)
    if account.unit == "epsilon":
        if not total.all_pure:
            raise LedgerRefusal(f"account {account.name!r} has a pure-DP (epsilon) cap: a zCDP plan cannot spend "
                                "from it")
        amount = total.epsilon
    else:
        amount = total.rho
    if amount is None:
        raise LedgerRefusal(f"account {account.name!r}: an infinite budget cannot spend from an account")
    products: dict[str, Any] = {}
    for name in dict.fromkeys(s.product for s in specs):
        own = [s for s in specs if s.product == name]
        conv = [s for s in converted if s.product == name]
        decl = relations.require(name)
        t_own, t_conv = compose_plan(own), compose_plan(conv)
        products[name] = {
            "relation": decl.relation,
            "own": {"rho": str(t_own.rho), "epsilon_pure": str(t_own.epsilon) if t_own.all_pure else None},
            "converted": {"rho": str(t_conv.rho), "epsilon_pure": str(t_conv.epsilon) if t_conv.all_pure else None},
            "conversions": sorted({decl.convert(s, account.relation).argument for s in own}),
            "invariants": list(decl.invariants),
        }
    return amount, products


def reserve(store: ObjectStore, name: str, *, release_id: str, universe: str, config_sha256: str,
            specs: Sequence[MeasurementSpec], standalone: bool = False) -> Slot:
    """Reserve a release's whole converted plan from the account before any noise (idempotent for the same
    release and config). Refuses (``LedgerRefusal``, exit 3) a plan that does not fit the remaining budget, another
    universe, a changed config for a reserved release, and an abandoned release."""
    account = load_account(store, name)
    if account.universe != universe:
        raise LedgerRefusal(f"account {name!r} is for universe {account.universe}, the release is {universe}")
    amount, products = plan_charge(account, specs)

    def build(chain: list[Slot]) -> dict[str, Any] | Slot:
        res, ret = reservation(chain, release_id)
        if ret is not None or store.exists(tombstone_key(release_id)):
            raise LedgerRefusal(f"release {release_id!r} was abandoned on account {name!r}; use a new release id")
        if res is not None:
            if res.record.get("config_sha256") != config_sha256 or res.amount != amount:
                raise LedgerRefusal(f"release {release_id!r} reserved {res.amount} from account {name!r} for "
                                    "another config or plan; its reservation never changes")
            return res
        return {"kind": "reserve", "release_id": release_id, "config_sha256": config_sha256, "amount": amount,
                "unit": account.unit, "relation": account.relation, "products": products,
                **({"standalone": True} if standalone else {})}

    return _append(store, account, build)


def check_fits(store: ObjectStore, name: str, universe: str, specs: Sequence[MeasurementSpec],
               release_id: str) -> Fraction:
    """``dasflow validate``: whether the plan would fit the account now (nothing reserved; a release that
    already holds its reservation fits); returns the charge."""
    acct = load_account(store, name)
    if acct.universe != universe:
        raise LedgerRefusal(f"account {name!r} is for universe {acct.universe}, the release is {universe}")
    amount, _ = plan_charge(acct, specs)
    chain = read_chain(store, name)
    res, ret = reservation(chain, release_id)
    if res is not None and ret is None and res.amount == amount:
        return amount
    require_fits(acct, chain[-1].cumulative if chain else Fraction(0), amount, "the plan")
    return amount


def require_reserved(store: ObjectStore, name: str | None, release_id: str) -> None:
    """Before measuring: a release naming an account must hold a live reservation on it."""
    if name is None:
        return
    res, ret = reservation(read_chain(store, name), release_id)
    if res is None or ret is not None:
        raise LedgerRefusal(f"release {release_id!r} holds no live reservation on account {name!r}; nothing drawn")


def abandon(store: ObjectStore, name: str, release_id: str) -> Slot:
    """Return the reservation of a release that drew nothing (see the module docstring); the release can never
    measure afterwards. A release that drew anything stays charged in full (``LedgerRefusal``)."""
    account = load_account(store, name)
    res, ret = reservation(read_chain(store, name), release_id)
    if res is None:
        raise InputError(f"release {release_id!r} holds no reservation on account {name!r}")
    if ret is not None:
        return ret
    if res.record.get("standalone"):  # no ledger: nothing proves it drew nothing
        raise LedgerRefusal(f"{release_id!r} is a standalone Census-format run (it draws right after reserving): "
                            f"it stays charged {res.amount} in full")
    store.put_if_absent(tombstone_key(release_id), _dumps({"release_id": release_id, "account": name,
                                                            "time": time.time()}))
    drew = [k for k in (*store.list(f"runs/{release_id}/ledger/entries/"),
                        *store.list(f"runs/{release_id}/measurements/"))]
    if drew:
        raise LedgerRefusal(f"release {release_id!r} drew noise ({len(drew)} ledger entries / measurements): it "
                            f"stays charged {res.amount} in full; it is now closed and will never draw again")

    def build(chain: list[Slot]) -> dict[str, Any] | Slot:
        r, back = reservation(chain, release_id)
        if back is not None:
            return back
        assert r is not None
        return {"kind": "return", "release_id": release_id, "amount": -r.amount, "unit": account.unit}

    return _append(store, account, build)


def lifetime_epsilon(account: Account, chain: Sequence[Slot]) -> tuple[Decimal | None, str]:
    """ε at δ = 1e-10 of the account's cumulative spend by the tightest sound conversion the accountant offers
    (each live reservation is one spend; a pure-DP account's spends are pure)."""
    live = _live(chain)
    if not live:
        return Decimal(0), "nothing spent"
    definition: accounting.Definition = "puredp" if account.unit == "epsilon" else "zcdp"
    spends = [accounting.Spend(definition=definition, budget=s.amount, label=s.release_id) for s in live]
    total = accounting.compose(spends, DELTA, rdp=False)
    best = total.best
    return (None, "") if best is None else (best.epsilon, best.method)


def _opt_budget(text: str) -> Fraction | None:
    return None if text == "Infinity" else Fraction(text)


def _live(chain: Sequence[Slot]) -> list[Slot]:
    returned = {s.release_id for s in chain if s.kind == "return"}
    return [s for s in chain if s.kind == "reserve" and s.release_id not in returned]


def summary(store: ObjectStore, name: str) -> dict[str, Any]:
    """``dasflow account show``: terms, every release with its plan (converted), its state and what it drew,
    the cumulative spend and what remains."""
    account = load_account(store, name)
    chain = read_chain(store, name)
    returned = {s.release_id for s in chain if s.kind == "return"}
    releases = []
    for s in chain:
        if s.kind != "reserve":
            continue
        drawn = planned = 0
        drawn_amount: str | None = None  # no ledger: a standalone Census-format run (it drew its whole plan)
        try:
            ledger = Ledger(store, s.release_id)
            rows = ledger.audit()
            planned = len(rows)
            committed = {r["key"] for r in rows if r["state"] == "committed"}
            drawn = len(committed)
            record = ledger.plan_record()
            conversions = record.get("audit", {})
            specs = [dataclasses.replace(spec_from_record(e), budget=_opt_budget(
                conversions[e["key"]]["conversions"][account.relation]["budget"]))
                for e in record["entries"] if e["key"] in committed]
            total = compose_plan(specs)
            drawn_amount = str(total.epsilon if account.unit == "epsilon" else total.rho)
        except (LedgerRefusal, StoreError, KeyError):  # no ledger, or a plan frozen without conversions
            pass
        releases.append({"release_id": s.release_id, "slot": s.seq, "charged": "0" if s.release_id in returned
                         else str(s.amount), "reserved": str(s.amount),
                         "state": "returned" if s.release_id in returned else "charged",
                         "keys_committed": drawn, "keys_planned": planned, "drawn": drawn_amount,
                         "products": s.record.get("products", {})})
    spent = chain[-1].cumulative if chain else Fraction(0)
    eps, method = lifetime_epsilon(account, chain)
    return {"account": account.record(), "unit": account.unit, "spent": str(spent),
            "remaining": str(account.cap - spent), "epsilon_at_delta": None if eps is None else f"{eps:.6f}",
            "delta": str(DELTA), "conversion": method, "releases": releases}


def reserve_for_release(store: ObjectStore, name: str | None, *, release_id: str, universe: str,
                        config_sha256: str, specs: Sequence[MeasurementSpec]) -> Slot | None:
    """The pipeline's hook (``plan_stage``, right after the plan is frozen and before any noise): reserve the
    whole converted plan from the release's account; a release without an account (test mode only, enforced
    by ``ReleaseConfig``) reserves nothing."""
    if name is None:
        return None
    return reserve(store, name, release_id=release_id, universe=universe, config_sha256=config_sha256,
                   specs=specs)
