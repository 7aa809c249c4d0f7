"""Privacy-loss accounts: lifetime cap across releases, create-only slot chain, racing processes, abandon."""

from __future__ import annotations

import multiprocessing as mp
import uuid
from fractions import Fraction
from pathlib import Path

import pytest

from dasflow.errors import IntegrityError, LedgerRefusal
from dasflow.io.store import LocalStore, ObjectStore, S3Store
from dasflow.privacy import account
from dasflow.privacy.accounting import gaussian_sigma2
from dasflow.privacy.measurement import MeasurementSpec
from tests.servers import make_bucket, moto_server, s3_client


def spec(rho: Fraction, product: str = "matrix", key: str = "q") -> MeasurementSpec:
    sigma2 = gaussian_sigma2(rho, 1)
    return MeasurementSpec(product=product, key=f"{product}/{key}", level="l", privacy_defn="zcdp",
                           mechanism="discrete_gaussian", budget=rho, sensitivity=Fraction(1), noise=sigma2,
                           cells=4, variance=sigma2)


def reserve(store: ObjectStore, rid: str, rho: Fraction = Fraction(1)) -> account.Slot:
    return account.reserve(store, "cef", release_id=rid, universe="US", config_sha256="c" * 64, specs=[spec(rho)])


def test_lifetime_cap_across_release_ids(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_rho=Fraction(9))
    for i in range(4):
        assert reserve(store, f"r{i}", Fraction(2)).cumulative == 2 * (i + 1)
    assert reserve(store, "r0", Fraction(2)).seq == 0  # idempotent: a resumed release is not charged again
    with pytest.raises(LedgerRefusal, match="only 1 of the lifetime cap 9 remains"):
        reserve(store, "r4", Fraction(2))  # a fresh release id does not get a fresh cap
    with pytest.raises(LedgerRefusal, match="another config or plan"):
        reserve(store, "r1", Fraction(1))
    with pytest.raises(LedgerRefusal, match="universe"):
        account.reserve(store, "cef", release_id="pr", universe="PR", config_sha256="c", specs=[spec(Fraction(1))])
    summary = account.summary(store, "cef")
    assert summary["spent"] == "8" and summary["remaining"] == "1" and len(summary["releases"]) == 4
    assert float(summary["epsilon_at_delta"]) > 0


def test_reopen_with_other_terms_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_rho=Fraction(9))
    account.open_account(store, "cef", "US", cap_rho=Fraction(9))
    with pytest.raises(LedgerRefusal, match="never change"):
        account.open_account(store, "cef", "US", cap_rho=Fraction(90))


def test_a_change_one_person_account_charges_converted_budgets(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_rho=Fraction(9), relation="change_one_person")
    assert reserve(store, "r0", Fraction(1, 2)).amount == 1  # a matrix marginal: rho x 2
    phsafe = account.reserve(store, "cef", release_id="r1", universe="US", config_sha256="c",
                             specs=[spec(Fraction(1, 2), product="phsafe")])
    assert phsafe.amount == 2  # the generic bound: rho x 4


def test_pure_account_refuses_a_zcdp_plan(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_epsilon=Fraction(3))
    with pytest.raises(LedgerRefusal, match="pure-DP"):
        reserve(store, "r0")


def test_abandon_returns_only_when_nothing_was_drawn(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_rho=Fraction(3))
    reserve(store, "a", Fraction(2))
    assert account.abandon(store, "cef", "a").amount == -2
    assert account.summary(store, "cef")["remaining"] == "3"
    with pytest.raises(LedgerRefusal, match="abandoned"):
        reserve(store, "a", Fraction(2))
    reserve(store, "b", Fraction(2))
    store.put("runs/b/ledger/entries/matrix/q.reserved.json", b"{}")
    with pytest.raises(LedgerRefusal, match="charged 2 in full"):
        account.abandon(store, "cef", "b")
    assert store.exists(account.tombstone_key("b"))
    assert account.summary(store, "cef")["spent"] == "2"


def test_a_tampered_chain_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_rho=Fraction(3))
    reserve(store, "a")
    reserve(store, "b")
    key = "accounts/cef/slots/00000000.json"
    store.put(key, store.get(key).replace(b'"amount": "1"', b'"amount": "0"'))
    with pytest.raises(IntegrityError, match="does not add up"):
        account.read_chain(store, "cef")


# ---------------------------------------------------------------------------------------- racing processes
def _race(target: str, endpoint: str | None, rid: str, barrier: mp.synchronize.Barrier,
          out: mp.queues.Queue[tuple[str, str]]) -> None:
    store: ObjectStore = LocalStore(target) if endpoint is None else S3Store(target, client=s3_client(endpoint))
    barrier.wait()
    try:
        slot = reserve(store, rid)
        out.put((rid, f"slot {slot.seq}"))
    except LedgerRefusal as exc:
        out.put((rid, f"refused {exc}"))


def _run_race(target: str, endpoint: str | None, store: ObjectStore, n: int = 8, cap: int = 5) -> None:
    account.open_account(store, "cef", "US", cap_rho=Fraction(cap))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    out: mp.queues.Queue[tuple[str, str]] = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(target, endpoint, f"r{i}", barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    won = sorted(r for r, v in results.items() if v.startswith("slot"))
    assert len(won) == cap, results  # exactly as many as fit: never more, and no winner lost its slot
    chain = account.read_chain(store, "cef")
    assert [s.release_id for s in chain] != [] and sorted(s.release_id for s in chain) == won
    assert chain[-1].cumulative == cap


def test_racing_processes_never_exceed_the_cap_on_disk(tmp_path: Path) -> None:
    _run_race(str(tmp_path / "store"), None, LocalStore(tmp_path / "store"))


@pytest.mark.xdist_group("s3servers")
def test_racing_processes_never_exceed_the_cap_on_s3(tmp_path: Path) -> None:
    with moto_server() as endpoint:
        bucket = f"dasflow-{uuid.uuid4().hex[:10]}"
        make_bucket(endpoint, bucket)
        uri = f"s3://{bucket}/acct"
        _run_race(uri, endpoint, S3Store(uri, client=s3_client(endpoint)))


def test_a_reservation_that_loses_the_race_for_a_slot_checks_the_cap_again(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic version of the race: the reserving process read the chain before a concurrent reservation
    claimed slot 0; its create-only claim of slot 0 fails, it re-reads and is refused by the cap."""
    store = LocalStore(tmp_path)
    account.open_account(store, "cef", "US", cap_rho=Fraction(3, 2))
    reserve(store, "winner")
    real = account.read_chain
    calls: list[int] = []

    def stale_then_real(s: ObjectStore, name: str) -> list[account.Slot]:
        calls.append(1)
        return [] if len(calls) == 1 else real(s, name)  # the stale view (empty chain) first

    monkeypatch.setattr(account, "read_chain", stale_then_real)
    with pytest.raises(LedgerRefusal, match="only 1/2 of the lifetime cap 3/2 remains"):
        reserve(store, "loser")
    assert len(calls) == 2  # the failed claim of slot 0 made it re-read the chain
    assert [s.release_id for s in real(store, "cef")] == ["winner"]


def test_a_slot_overwritten_by_a_racing_writer_is_not_taken(tmp_path: Path) -> None:
    """A store whose create-only write is not atomic: both writers are told they created slot 0, the second's
    bytes replace the first's. The first reads its slot back, sees it lost, and claims slot 1 instead."""

    class LossyCreate(LocalStore):
        raced = False

        def put_if_absent(self, key: str, data: bytes) -> bool:
            if key.endswith("/slots/00000000.json") and not self.raced:
                self.raced = True
                rival = reserve(LocalStore(tmp_path), "rival")  # wins slot 0 while this write is in flight
                assert rival.seq == 0
                return True  # ...and this write is told it succeeded, as a racy server would
            return super().put_if_absent(key, data)

    account.open_account(LocalStore(tmp_path), "cef", "US", cap_rho=Fraction(3))
    slot = reserve(LossyCreate(tmp_path), "late")
    assert slot.seq == 1 and slot.cumulative == 2
    assert [s.release_id for s in account.read_chain(LocalStore(tmp_path), "cef")] == ["rival", "late"]


@pytest.mark.xdist_group("s3servers")
def test_the_test_s3_server_lets_one_racing_create_only_put_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process moto server models S3's atomic conditional PUT (``tests.servers.atomic_conditional_puts``):
    with the write slowed down so that both requests pass moto's existence check first, exactly one wins."""
    import threading
    import time

    from moto.s3.models import S3Backend

    slow = S3Backend.put_object

    def delayed(self: S3Backend, *args: object, **kwargs: object) -> object:
        time.sleep(0.3)
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", delayed)
    with moto_server() as endpoint:
        bucket = f"dasflow-{uuid.uuid4().hex[:10]}"
        make_bucket(endpoint, bucket)
        results: list[bool] = []

        def create(i: int) -> None:
            results.append(S3Store(f"s3://{bucket}/x", client=s3_client(endpoint)).put_if_absent("k", b"%d" % i))

        threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert sorted(results) == [False, False, False, True]
