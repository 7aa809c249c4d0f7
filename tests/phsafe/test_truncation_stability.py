"""truncate_and_join (R7) and stability by neighbour enumeration on small random households (R8)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from dasflow.products.phsafe import parse_config, truncate_and_join
from dasflow.products.phsafe.product import prepare_exact
from dasflow.products.phsafe.tables import MEASURED
from dasflow.products.phsafe.truncate import content_order, drop_non_unique, record_hash, truncate_persons
from tests.phsafe.builders import Person, Unit, columns, config_with

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("QAGE", "CENHISP", "CENRACE", "RELSHIP")


def random_persons(rng: np.random.Generator, n: int, households: int) -> dict[str, np.ndarray]:
    return {
        "MAFID": rng.integers(0, households, n).astype(np.int64) + 100000001,
        "QAGE": rng.integers(0, 4, n).astype(np.int16),  # few values -> many identical records
        "CENHISP": rng.integers(1, 3, n).astype(np.int16),
        "CENRACE": rng.integers(1, 3, n).astype(np.int16),
        "RELSHIP": rng.integers(20, 22, n).astype(np.int16),
    }


def kept_multiset(p: dict[str, np.ndarray], tau: int) -> Counter[tuple[int, ...]]:
    order = content_order(p["MAFID"], [p[f] for f in FIELDS])
    kept = truncate_persons(p["MAFID"], tau, order)
    return Counter(tuple(int(p[c][i]) for c in ("MAFID", *FIELDS)) for i in kept)


def test_r7_at_most_tau_per_mafid_and_all_of_small_households() -> None:
    rng = np.random.default_rng(1)
    p = random_persons(rng, 3000, 300)
    for tau in (1, 3, 10):
        kept = kept_multiset(p, tau)
        per = Counter[int]()
        for rec, n in kept.items():
            per[rec[0]] += n
        sizes = Counter(int(m) for m in p["MAFID"])
        assert per == Counter({m: min(s, tau) for m, s in sizes.items()})


def test_r7_kept_set_invariant_to_row_order_and_partitioning() -> None:
    rng = np.random.default_rng(2)
    p = random_persons(rng, 2000, 150)
    base = kept_multiset(p, 3)
    for _ in range(5):
        perm = rng.permutation(p["MAFID"].size)
        assert kept_multiset({k: v[perm] for k, v in p.items()}, 3) == base
    # partition by MAFID into 4 shards, truncate each, union: same multiset
    shard = p["MAFID"] % 4
    union: Counter[tuple[int, ...]] = Counter()
    for s in range(4):
        sel = shard == s
        union += kept_multiset({k: v[sel] for k, v in p.items()}, 3)
    assert union == base


def test_r7_identical_records_are_handled_deterministically() -> None:
    p: dict[str, np.ndarray] = {"MAFID": np.full(5, 100000001, np.int64)}
    p.update({f: np.full(5, 7, np.int16) for f in FIELDS})
    assert kept_multiset(p, 2) == Counter({(100000001, 7, 7, 7, 7): 2})


def test_r7_order_is_content_hash_not_age_or_position() -> None:
    # In one large household the kept persons are not simply the youngest/oldest or the first rows.
    n = 60
    p: dict[str, np.ndarray] = {
        "MAFID": np.full(n, 100000001, np.int64), "QAGE": np.arange(n, dtype=np.int16),
        "CENHISP": np.ones(n, np.int16), "CENRACE": np.ones(n, np.int16), "RELSHIP": np.full(n, 25, np.int16)}
    ages = sorted(rec[1] for rec in kept_multiset(p, 10).elements())
    assert ages != list(range(10)) and ages != list(range(50, 60))


def test_r7_hash_is_unsalted_across_processes() -> None:
    code = ("import numpy as np; from dasflow.products.phsafe.truncate import record_hash; "
            "print(record_hash([np.arange(5), np.arange(5) * 3]).tolist())")
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout)
    assert len(outs) == 1
    here = record_hash([np.arange(5), np.arange(5) * 3]).tolist()
    assert outs == {f"{here}\n"}


def test_r7_duplicate_units_dropped_entirely_and_inner_join() -> None:
    u_mafid = np.array([5, 6, 6, 7, 8], dtype=np.int64)
    assert drop_non_unique(u_mafid).tolist() == [0, 3, 4]
    p_mafid = np.array([5, 6, 6, 7, 9, 5], dtype=np.int64)
    ages = np.array([1, 2, 3, 4, 5, 6], dtype=np.int16)
    pr, ur = truncate_and_join(p_mafid, [ages], u_mafid, tau=5)
    pairs = sorted(zip(p_mafid[pr].tolist(), u_mafid[ur].tolist(), strict=True))
    assert pairs == [(5, 5), (5, 5), (7, 7)]  # MAFID 6 duplicated: dropped; 9 has no unit; 8 has no persons


# --- R8: neighbour enumeration ---

def derive_unit(members: Sequence[Person], state: str) -> Unit:
    """The unit record as a deterministic function of its members (the base-person abstraction, Sec. 4)."""
    heads = [m for m in members if m.rel == 20]
    head = heads[0] if heads else min(members, key=lambda m: (m.age, m.race, m.hisp, m.rel))
    rels = {m.rel for m in members}
    kids = any(m.rel in (25, 26, 27) and m.age < 18 for m in members)
    female = head.age % 2 == 0
    relatives = bool(rels & set(range(25, 34)))
    if rels & {21, 23}:
        hht, hht2, cplt = 1, (1 if kids else 2), (1 if 21 in rels else 2)
    elif rels & {22, 24}:
        hht, hht2, cplt = (3 if female else 2) if relatives else (7 if female else 5), (3 if kids else 4), \
            (3 if 22 in rels else 4)
    elif len(members) == 1:
        hht, hht2, cplt = (6 if female else 4), (5 if female else 9), 5
    elif kids:
        hht, hht2, cplt = (3 if female else 2), (6 if female else 10), 5
    elif relatives:
        hht, hht2, cplt = (3 if female else 2), (7 if female else 11), 5
    else:
        hht, hht2, cplt = (7 if female else 5), (8 if female else 12), 5
    ten = 1 + sum(m.age for m in members) % 4
    return Unit(list(members), state=state, ten=ten, hht=hht, hht2=hht2, cplt=cplt, hhrace=head.race,
                hhspan=head.hisp)


def random_person(rng: np.random.Generator) -> Person:
    return Person(age=int(rng.choice([2, 4, 10, 17, 18, 40, 41])), race=int(rng.choice([1, 2, 4, 9])),
                  hisp=int(rng.integers(1, 3)), rel=int(rng.choice([20, 21, 22, 24, 25, 27, 30, 33, 34])))


Households = list[tuple[str, list[Person]]]


def household_columns(households: Households) -> tuple[dict[str, np.ndarray], ...]:
    """Columns of the non-empty households; a household keeps its MAFID (position) when others change."""
    keep = [h for h, (_, m) in enumerate(households) if m]
    units = [derive_unit(households[h][1], households[h][0]) for h in keep]
    return columns(units, mafids=[100000001 + h for h in keep])


def vectors(households: Households, cfg_tau: int) -> dict[str, np.ndarray]:
    p, u, g = household_columns(households)
    cfg = parse_config(config_with(budget=1, states=["01", "02"],
                                   tau={t: cfg_tau for t in ("PH1_num", "PH2", "PH3", "PH4", "PH6", "PH7")}))
    prepared = prepare_exact(p, u, g, cfg)
    return {k: v["COUNT"].to_numpy() for k, v in prepared.items()}


def joined(households: Households, tau: int) -> Counter[tuple[int, ...]]:
    p, u, _ = household_columns(households)
    pr, ur = truncate_and_join(p["MAFID"], [p[c] for c in ("QAGE", "CENHISP", "CENRACE", "RELSHIP")],
                               u["MAFID"], tau)
    return Counter(tuple(int(p[c][i]) for c in p) + tuple(int(u[c][j]) for c in u)
                   for i, j in zip(pr, ur, strict=True))


def neighbours(households: Households, rng: np.random.Generator) -> list[Households]:
    """All remove-one-person neighbours and a sample of add-one-person neighbours (into every household)."""
    out: list[Households] = []
    for h, (_, members) in enumerate(households):
        for i in range(len(members)):
            nb = [(s, list(m)) for s, m in households]
            del nb[h][1][i]
            out.append(nb)
        nb = [(s, list(m)) for s, m in households]
        nb[h][1].append(random_person(rng))
        out.append(nb)
    out.append([*[(s, list(m)) for s, m in households], ("02", [random_person(rng)])])  # a new household
    return out


def random_households(rng: np.random.Generator) -> Households:
    return [(str(rng.choice(["01", "02"])), [random_person(rng) for _ in range(int(rng.integers(1, 6)))])
            for _ in range(4)]


@pytest.mark.parametrize("tau", [1, 2, 3])
def test_r8_unbounded_neighbours_join_and_unit_tables(tau: int) -> None:
    """|J Δ J'| <= 2tau+2 and per-level ||x - x'||_2 <= 2tau+2 (join), <= 2 (unit), add/remove one person."""
    rng = np.random.default_rng(100 + tau)
    worst: dict[str, float] = {}
    for _ in range(6):
        hh = random_households(rng)
        base, jbase = vectors(hh, tau), joined(hh, tau)
        for nb in neighbours(hh, rng):
            jn = joined(nb, tau)
            assert sum(((jbase - jn) + (jn - jbase)).values()) <= 2 * tau + 2
            vn = vectors(nb, tau)
            for key, x in base.items():
                table = key.split("/")[0]
                c = 2 * tau + 2 if MEASURED[table].kind == "join" else 2
                d = float(np.linalg.norm(x - vn[key]))
                assert d <= c + 1e-9, (key, d, c)
                worst[table] = max(worst.get(table, 0.0), d)
    assert worst["PH1_denom"] > 0 and worst["PH7"] > 1  # the enumeration actually moved the vectors


def test_r8_bounded_neighbours_delete_plus_add() -> None:
    """Change one person (delete + add): ||x - x'||_2 <= sqrt(2)(2tau+2) (join) and 2 sqrt(2) (unit)."""
    tau = 2
    rng = np.random.default_rng(7)
    for _ in range(2):
        hh = random_households(rng)
        base = vectors(hh, tau)
        for h, (_, members) in enumerate(hh):
            for i in range(len(members)):
                for target in range(len(hh)):
                    nb = [(s, list(m)) for s, m in hh]
                    del nb[h][1][i]
                    nb[target][1].append(random_person(rng))
                    vn = vectors(nb, tau)
                    for key, x in base.items():
                        table = key.split("/")[0]
                        c = 2 * tau + 2 if MEASURED[table].kind == "join" else 2
                        assert float(np.linalg.norm(x - vn[key])) <= np.sqrt(2) * c + 1e-9, key


def test_record_hash_is_a_function_of_content_only() -> None:
    a = record_hash([np.array([1, 2, 3]), np.array([4, 5, 6])])
    b = record_hash([np.array([3, 2, 1]), np.array([6, 5, 4])])
    assert a.tolist() == b[::-1].tolist() and len(set(a.tolist())) == 3


def test_r7_hash_collisions_fall_back_to_the_full_record_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """If two different records of a household collided on the 64-bit hash, ties are broken by the fields."""
    import dasflow.products.phsafe.truncate as tr
    monkeypatch.setattr(tr, "record_hash", lambda fields, key=tr.TRUNCATION_KEY: np.zeros(len(fields[0]),
                                                                                          dtype=np.uint64))
    mafid = np.array([2, 1, 2, 1, 2], dtype=np.int64)
    age = np.array([9, 5, 3, 7, 3], dtype=np.int16)
    order = tr.content_order(mafid, [age])
    assert list(zip(mafid[order].tolist(), age[order].tolist(), strict=True)) == \
        [(1, 5), (1, 7), (2, 3), (2, 3), (2, 9)]


def test_r7_production_path_equals_reference_truncate_and_join() -> None:
    """The shared-sort tabulation path gives the same joined records as ``truncate_and_join`` (duplicated unit
    MAFIDs, orphans and large households included)."""
    from dasflow.products.phsafe.tabulate import build_universe, join_records
    rng = np.random.default_rng(5)
    n, h = 4000, 600
    persons: dict[str, np.ndarray] = {
               "RTYPE": np.full(n, 3, np.int16), "MAFID": rng.integers(0, h + 20, n).astype(np.int64) + 1,
               "QAGE": rng.integers(0, 90, n).astype(np.int16), "CENHISP": rng.integers(1, 3, n).astype(np.int16),
               "CENRACE": rng.integers(1, 64, n).astype(np.int16), "RELSHIP": rng.integers(20, 37, n).astype(np.int16)}
    umafid = np.concatenate([np.arange(1, h + 1), rng.integers(1, h + 1, 30)]).astype(np.int64)  # 30 dups
    rng.shuffle(umafid)
    m = umafid.size
    units: dict[str, np.ndarray] = {
             "RTYPE": np.full(m, 2, np.int16), "MAFID": umafid, "HHSPAN": rng.integers(1, 3, m).astype(np.int16),
             "HHRACE": rng.integers(1, 64, m).astype(np.int16), "TEN": rng.integers(1, 5, m).astype(np.int16),
             "HHT": np.ones(m, np.int16), "HHT2": np.ones(m, np.int16), "CPLT": np.ones(m, np.int16)}
    geo: dict[str, np.ndarray] = {"RTYPE": np.full(h, 2, np.int16), "MAFID": np.arange(1, h + 1, dtype=np.int64),
           "TABBLKST": rng.choice(np.array([1, 2], np.int16), h)}
    uni = build_universe(persons, units, geo, ("01", "02"))
    rec = join_records(uni, "PH1_num", 3)
    pr, ur = truncate_and_join(persons["MAFID"], [persons[c] for c in ("RTYPE", "QAGE", "CENHISP", "CENRACE",
                                                                       "RELSHIP")], units["MAFID"], 3)
    ref = Counter(zip(np.where(persons["QAGE"][pr] < 18, 2, 3).tolist(),
                      (geo["TABBLKST"][units["MAFID"][ur] - 1] - 1).tolist(), strict=True))
    got = Counter(zip(rec.cell.tolist(), rec.state.tolist(), strict=True))
    assert got == ref and sum(ref.values()) > 1000
