"""The privacy ledger: a data-independent plan checked against the cap, and measure-once per planned key.

Store layout under ``runs/{release_id}/ledger/``:

``plan.json``                    the frozen plan (every key, mechanism, sensitivity, budget, noise, variance) and
                                 its exact composed total; create-only. A resume recomputes the plan and refuses
                                 to go on if it differs.
``entries/{key}.reserved.json``  create-only: "this key is being measured" (attempt, time).
``entries/{key}.committed.json`` create-only: the key's noisy measurement file (NMF) and its SHA-256.

Measure-once protocol for one key (DESIGN.md §2):

1. committed → return the stored NMF (its hash verified); nothing is drawn.
2. reserve (create-only; losing the race to a concurrent process is fine, see 4).
3. NMF present (a previous attempt died after writing it) → verify it belongs to this key, commit it.
4. no NMF → nothing was ever observable: draw, then write the NMF **create-only**. If another process wrote one
   first, our draw is discarded unseen and theirs is used. Only one NMF per key can ever exist, so only one
   noisy answer per key can ever be released: a key is spent at most once, whatever crashes or races.
5. commit (create-only; an existing identical commit is accepted).

Privacy argument: the released data are a post-processing of the set of NMFs; the ledger guarantees at most one
NMF per planned key, each produced by the planned mechanism with the planned noise, so the release's privacy
loss is the composition of the plan's entries, which ``freeze_plan`` checked against the cap before any noise.

Segmented keys (``measure_segmented``; TopDown's levels below the state, one segment per state). A key whose
measured units fall into disjoint public segments is drawn segment by segment, so only one segment's counts and
noise are in memory at a time. The key, its spec, budget and sensitivity are unchanged: the segments are
disjoint units of the one planned query (the same function of the data), each unit gets its own independent
noise exactly as in one draw. Store layout of such a key:

``measurements/{key}/seg={s}.parquet``        create-only: segment s's NMF (binding, key and segment in its
                                              metadata).
``entries/{key}.segments/{s}.json``           create-only: segment s's SHA-256 and rows, written right after it.
``measurements/{key}.parquet``                the key's NMF is an *index* (one row per segment: object,
                                              SHA-256, rows; the key's binding in its metadata); the commit records
                                              the index's SHA-256, so every segment is bound transitively.

Measure-once per segment: a stored segment is reused, never redrawn (a resume after a crash mid-key draws only
the missing segments); a segment whose entry exists but whose object is gone is an ``IntegrityError`` (it was
drawn; it is never drawn again). ``load`` and ``verify(deep=True)`` check every segment against the index.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import IntegrityError, LedgerRefusal
from dasflow.io.store import ObjectStore, StoreError, sha256_bytes
from dasflow.privacy import faults, relations
from dasflow.privacy.composition import PlanTotal, compose_plan
from dasflow.privacy.measurement import MeasurementSpec, NoisyMeasurement


def frac_str(x: Fraction | None) -> str:
    """Exact text of a budget: "p/q", an integer, or "Infinity" for an infinite budget."""
    if x is None:
        return "Infinity"
    return str(x)


def spec_record(spec: MeasurementSpec) -> dict[str, Any]:
    """The JSON record of one planned measurement (exact values as strings)."""
    return {
        "product": spec.product,
        "key": spec.key,
        "level": spec.level,
        "privacy_defn": spec.privacy_defn,
        "mechanism": spec.mechanism,
        "budget": frac_str(spec.budget),
        "sensitivity": str(spec.sensitivity),
        "noise": str(spec.noise),
        "variance": str(spec.variance) if isinstance(spec.variance, Fraction) else repr(float(spec.variance)),
        "cells": spec.cells,
    }


#: column order of the audit export (plan fields, then the key's state and its NMF hash)
AUDIT_COLUMNS = ("product", "key", "level", "privacy_defn", "mechanism", "sensitivity", "budget", "noise",
                 "variance", "cells")


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode("utf-8")


@dataclass(frozen=True)
class Cap:
    """The release's privacy cap: total zCDP ρ (pure-DP ε composes as ε²/2), and optionally a pure-DP ε cap
    that applies when every planned entry is pure DP. ``None`` = no cap of that kind (test releases only)."""

    rho: Fraction | None
    epsilon: Fraction | None = None


def check_plan(specs: Sequence[MeasurementSpec], cap: Cap) -> PlanTotal:
    """The one cap check (freezing, ``dasflow validate`` and every command use it): unique keys, and the exact
    composed total within the cap. Raises ``LedgerRefusal``; returns the total."""
    keys = [s.key for s in specs]
    dupes = sorted(k for k, n in Counter(keys).items() if n > 1)
    if dupes:
        raise LedgerRefusal(f"the plan lists keys more than once: {dupes[:5]}")
    total = compose_plan(specs)
    if cap.rho is not None and (total.rho is None or total.rho > cap.rho):
        raise LedgerRefusal(
            f"plan total rho = {frac_str(total.rho)} exceeds the release cap rho = {cap.rho}; nothing measured"
        )
    if cap.epsilon is not None and total.all_pure and (total.epsilon is None or total.epsilon > cap.epsilon):
        raise LedgerRefusal(
            f"plan total epsilon = {frac_str(total.epsilon)} exceeds the release cap epsilon = {cap.epsilon}"
        )
    return total


#: a segment id is one path segment of the store
SEGMENT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

#: the columns of a segmented key's index (its NMF)
INDEX_COLUMNS = ("SEGMENT", "OBJECT", "SHA256", "ROWS")


@dataclass(frozen=True)
class Segment:
    """One stored segment of a segmented key: its id, object key, SHA-256 and rows."""

    segment: str
    nmf_key: str
    sha256: str
    rows: int


@dataclass(frozen=True)
class Commit:
    """A committed measurement: where its NMF is and the NMF's SHA-256."""

    key: str
    nmf_key: str
    sha256: str
    rows: int


class Ledger:
    """The ledger of one release in a store (see the module docstring)."""

    def __init__(self, store: ObjectStore, release_id: str, binding: Mapping[str, str] | None = None) -> None:
        self.store = store
        self.release_id = release_id
        self.root = f"runs/{release_id}/ledger"
        #: what every NMF and commit of this release is bound to: ``config_sha256``, ``rng_mode`` and (during
        #: measurement, where the confidential inputs are readable) ``inputs_sha256``
        self.binding: dict[str, str] = dict(binding or {})
        #: product → digest of its confidential inputs (:meth:`bind_inputs`), which replaces ``inputs_sha256`` in
        #: the binding of that product's keys
        self.inputs: dict[str, str] = {}
        self._plan: dict[str, dict[str, Any]] | None = None
        self._traces: dict[str, str] | None = None

    def bind_inputs(self, product: str, digest: str) -> None:
        """Bind the product's measurements to the digest of its confidential inputs: its NMFs and commits record
        it, and a stored NMF of the product carrying another digest (drawn from other inputs) is refused. Keys of
        different products may be bound to different digests in one process at once."""
        self.inputs[product] = digest

    def binding_of(self, spec: MeasurementSpec) -> dict[str, str]:
        """What ``spec``'s NMF and commit are bound to: the release's binding, with its product's inputs digest
        when :meth:`bind_inputs` set one."""
        digest = self.inputs.get(spec.product)
        return self.binding if digest is None else {**self.binding, "inputs_sha256": digest}

    # ----------------------------------------------------------------------------------------------- plan
    def freeze_plan(self, specs: Sequence[MeasurementSpec], cap: Cap,
                    public: Mapping[str, Any] | None = None) -> PlanTotal:
        """Check the plan against the cap and freeze it (create-only); on resume, verify it is unchanged.
        ``public`` (the pipeline's): the SHA-256 of every public input and stored derived object the plan was
        made from, frozen with it (later stages read them only as frozen: ``io.store.FrozenStore``).

        Raises ``LedgerRefusal`` for an over-cap plan, duplicate keys, or a plan that differs from the frozen one.
        """
        total = check_plan(specs, cap)
        record: dict[str, Any] = {
            "release_id": self.release_id,
            "cap": {"rho": frac_str(cap.rho), "epsilon": frac_str(cap.epsilon) if cap.epsilon else None},
            "entries": [spec_record(s) for s in specs],
            "total": total.as_record(),
            "binding": {k: self.binding[k] for k in ("config_sha256", "rng_mode") if k in self.binding},
            "audit": relations.audit_record(list(specs)),  # per key: relation, whole-vector sensitivity, noise
        }
        if public is not None:
            record["public"] = dict(public)
        data = _dumps(record)
        key = f"{self.root}/plan.json"
        if not self.store.put_if_absent(key, data):
            existing = json.loads(self.store.get(key))
            if existing != json.loads(data):
                raise LedgerRefusal(
                    f"release {self.release_id}: the plan differs from the frozen plan in {self.store.uri}/{key} "
                    "(changed config or code); a release's plan can never change once frozen"
                )
        self._plan = {e["key"]: e for e in record["entries"]}
        return total

    def plan(self) -> dict[str, dict[str, Any]]:
        """The frozen plan's entries by key."""
        if self._plan is None:
            try:
                record = json.loads(self.store.get(f"{self.root}/plan.json"))
            except StoreError:
                raise LedgerRefusal(
                    f"release {self.release_id} has no frozen plan: nothing may be measured") from None
            self._plan = {e["key"]: e for e in record["entries"]}
        return self._plan

    def plan_record(self) -> dict[str, Any]:
        return dict(json.loads(self.store.get(f"{self.root}/plan.json")))

    # --------------------------------------------------------------------------------------- measure once
    def _entry(self, key: str, state: str) -> str:
        return f"{self.root}/entries/{key}.{state}.json"

    def nmf_key(self, key: str) -> str:
        return f"runs/{self.release_id}/measurements/{key}.parquet"

    def committed(self, key: str) -> Commit | None:
        try:
            rec = json.loads(self.store.get(self._entry(key, "committed")))
        except StoreError:
            return None
        return Commit(key=key, nmf_key=rec["nmf"], sha256=rec["sha256"], rows=int(rec["rows"]))

    def measure_once(
        self, spec: MeasurementSpec, draw: Callable[[], NoisyMeasurement], *, attempt: str
    ) -> tuple[NoisyMeasurement, bool]:
        """Run the protocol for one key; return (measurement, drawn_now).

        ``draw`` is called at most once, and only if no NMF for the key exists. Refuses unplanned keys and specs
        that differ from the frozen plan.
        """
        planned = self.plan().get(spec.key)
        if planned is None:
            raise LedgerRefusal(f"unplanned measurement {spec.key!r}: refused before any noise")
        if planned != spec_record(spec):
            raise LedgerRefusal(f"measurement {spec.key!r} differs from its frozen plan entry: refused")
        commit = self.committed(spec.key)
        if commit is not None:
            return self.load(spec, commit), False
        faults.point(f"measure:before-reserve:{spec.key}")
        self.store.put_if_absent(
            self._entry(spec.key, "reserved"),
            _dumps({"key": spec.key, "attempt": attempt, "host": socket.gethostname(), "pid": os.getpid(),
                    "time": time.time()}),
        )
        faults.point(f"measure:after-reserve:{spec.key}")
        nmf_key = self.nmf_key(spec.key)
        drawn = False
        if not self.store.exists(nmf_key):
            if self.store.exists(f"{self.root}/abandoned.json"):  # after our reserved entry (privacy.account)
                raise LedgerRefusal(f"release {self.release_id} was abandoned: nothing is drawn")
            self.check_never_drawn(spec.key)
            fresh = draw()
            data = encode_nmf(fresh, spec, self.binding_of(spec))
            drawn = self.store.put_if_absent(nmf_key, data)  # a concurrent winner's NMF is used instead
            faults.point(f"measure:after-nmf:{spec.key}")
        if drawn:
            # the stored NMF is exactly ``data`` (create-only put): commit the hash of those bytes and return the
            # measurement they encode, without reading and decoding the file back
            measurement = _as_stored(fresh, spec)
        else:  # a previous attempt's or a concurrent winner's NMF: read, check it belongs to this key, use it
            data = self.store.get(nmf_key)
            measurement = decode_nmf(data, spec)
        self._check_binding(spec, nmf_binding(data), nmf_key)
        rows = len(measurement.table)
        commit_rec = _dumps({"key": spec.key, "nmf": nmf_key, "sha256": sha256_bytes(data), "rows": rows,
                             "budget": planned["budget"], "mechanism": planned["mechanism"],
                             "rng_mode": measurement.rng_mode, "binding": self.binding_of(spec)})
        if not self.store.put_if_absent(self._entry(spec.key, "committed"), commit_rec):
            existing = self.committed(spec.key)
            if existing is None or existing.sha256 != sha256_bytes(data):
                raise LedgerRefusal(f"conflicting commit for {spec.key!r}: refused")
        faults.point(f"measure:after-commit:{spec.key}")
        return measurement, drawn

    # ------------------------------------------------------------------------------ segmented measurement
    def segment_key(self, key: str, segment: str) -> str:
        return f"runs/{self.release_id}/measurements/{key}/seg={segment}.parquet"

    def _segment_entry(self, key: str, segment: str) -> str:
        return f"{self.root}/entries/{key}.segments/{segment}.json"

    def measure_segmented(
        self, spec: MeasurementSpec, segments: Sequence[str], draw: Callable[[str], NoisyMeasurement], *,
        attempt: str
    ) -> tuple[list[Segment], int]:
        """The measure-once protocol for a key drawn segment by segment (module docstring); returns the key's
        segments and how many were drawn now.

        ``draw(s)`` is called at most once per segment, only for a segment never stored (and never recorded as
        drawn), and its result is written and dropped before the next segment is drawn. A committed key returns
        its index (verified against the commit) without reading a segment. Privacy: the segments partition the
        key's measured units, each unit's noise is drawn once, so the key spends its planned budget once."""
        planned = self._planned_segments(spec, segments)
        commit = self.committed(spec.key)
        if commit is not None:
            found = self.segments(spec, commit)
            if found is None:
                raise IntegrityError(f"{self.store.uri}/{commit.nmf_key}: {spec.key!r} was committed unsegmented")
            return found, 0
        self._reserve_segmented(spec, segments, attempt)
        index_key = self.nmf_key(spec.key)
        drawn = 0
        written = False
        if not self.store.exists(index_key):
            entries: list[Segment] = []
            modes: set[str] = set()
            for segment in segments:
                entry, mode, fresh = self._segment_once(spec, segment, draw)
                entries.append(entry)
                modes.add(mode)
                drawn += int(fresh)
            if len(modes) != 1:
                raise IntegrityError(f"{spec.key!r}: segments drawn under different RNG modes {sorted(modes)}")
            data = encode_index(entries, spec, modes.pop(), self.binding_of(spec))
            written = self.store.put_if_absent(index_key, data)
            faults.point(f"measure:after-nmf:{spec.key}")
        if not written:  # a previous attempt's or a concurrent winner's index: its segments exist and match it
            data = self.store.get(index_key)
            self._check_binding(spec, nmf_binding(data), index_key)
            entries = decode_index(data, spec, f"{self.store.uri}/{index_key}")
            if [e.segment for e in entries] != list(segments):
                raise IntegrityError(f"{self.store.uri}/{index_key}: lists segments other than the key's")
            for entry in entries:
                self._segment_bytes(spec, entry)
        commit_rec = _dumps({"key": spec.key, "nmf": index_key, "sha256": sha256_bytes(data),
                             "rows": sum(e.rows for e in entries), "segments": len(entries),
                             "budget": planned["budget"], "mechanism": planned["mechanism"],
                             "rng_mode": nmf_binding(data)["rng_mode"], "binding": self.binding_of(spec)})
        if not self.store.put_if_absent(self._entry(spec.key, "committed"), commit_rec):
            existing = self.committed(spec.key)
            if existing is None or existing.sha256 != sha256_bytes(data):
                raise LedgerRefusal(f"conflicting commit for {spec.key!r}: refused")
        faults.point(f"measure:after-commit:{spec.key}")
        return entries, drawn

    def draw_segments(
        self, spec: MeasurementSpec, segments: Sequence[str], subset: Sequence[str],
        draw: Callable[[str], NoisyMeasurement], *, attempt: str
    ) -> int:
        """Draw some of a segmented key's segments ahead of its commit (several workers, each its own subset);
        returns how many were drawn now. Each segment follows the same measure-once protocol as in
        :meth:`measure_segmented` (reused if stored, refused if drawn but gone, else drawn and written
        create-only with its entry); nothing is committed: :meth:`measure_segmented` later finds the segments
        stored and commits the key's index. A committed key draws nothing. Privacy: unchanged — one stored
        object per segment whoever draws it (a concurrent loser's draw is discarded unseen), so each unit of the
        key is noised once and the key spends its planned budget once."""
        self._planned_segments(spec, segments)
        unknown = sorted(set(subset) - set(segments))
        if unknown:
            raise LedgerRefusal(f"{spec.key!r}: {unknown[:3]} are not segments of the key: refused before any noise")
        if self.committed(spec.key) is not None:
            return 0
        self._reserve_segmented(spec, segments, attempt)
        return sum(int(self._segment_once(spec, segment, draw)[2]) for segment in subset)

    def _planned_segments(self, spec: MeasurementSpec, segments: Sequence[str]) -> dict[str, Any]:
        """The key's frozen plan entry, checked against ``spec``; ``segments`` checked as distinct path segments."""
        planned = self.plan().get(spec.key)
        if planned is None:
            raise LedgerRefusal(f"unplanned measurement {spec.key!r}: refused before any noise")
        if planned != spec_record(spec):
            raise LedgerRefusal(f"measurement {spec.key!r} differs from its frozen plan entry: refused")
        bad = [s for s in segments if not SEGMENT_ID.fullmatch(s)]
        if bad or len(set(segments)) != len(segments) or not segments:
            raise LedgerRefusal(f"{spec.key!r}: segments must be distinct path segments, at least one: {bad[:3]}")
        return planned

    def _reserve_segmented(self, spec: MeasurementSpec, segments: Sequence[str], attempt: str) -> None:
        """Reserve a segmented key (create-only; an earlier reservation, or a concurrent worker's, stands)."""
        faults.point(f"measure:before-reserve:{spec.key}")
        self.store.put_if_absent(
            self._entry(spec.key, "reserved"),
            _dumps({"key": spec.key, "attempt": attempt, "host": socket.gethostname(), "pid": os.getpid(),
                    "time": time.time(), "segments": list(segments)}),
        )
        faults.point(f"measure:after-reserve:{spec.key}")

    def _segment_once(self, spec: MeasurementSpec, segment: str, draw: Callable[[str], NoisyMeasurement]
                      ) -> tuple[Segment, str, bool]:
        """Measure-once for one segment: reuse the stored segment (checked against its entry), refuse one that
        was drawn but is gone, else draw, write create-only, and record its entry. Returns (segment, RNG mode,
        drawn now)."""
        skey = self.segment_key(spec.key, segment)
        ekey = self._segment_entry(spec.key, segment)
        recorded = stored_record(self.store, ekey, "segment entry")
        drawn = False
        if not self.store.exists(skey):
            if recorded is not None:
                raise IntegrityError(f"{self.store.uri}/{skey}: segment {segment!r} of {spec.key!r} was drawn "
                                     f"(recorded in {ekey}) but is missing; it is never drawn again (restore it "
                                     "from a backup)")
            if self.store.exists(f"{self.root}/abandoned.json"):
                raise LedgerRefusal(f"release {self.release_id} was abandoned: nothing is drawn")
            self.check_never_drawn(spec.key)
            fresh = draw(segment)
            data = encode_nmf(fresh, spec, self.binding_of(spec), segment=segment)
            del fresh
            drawn = self.store.put_if_absent(skey, data)  # a concurrent winner's segment is used instead
            faults.point(f"measure:after-segment:{spec.key}:{segment}")
        if not drawn:
            data = self.store.get(skey)
        sha = sha256_bytes(data)
        if recorded is not None and recorded.get("sha256") != sha:
            raise IntegrityError(f"{self.store.uri}/{skey}: does not match the SHA-256 recorded in {ekey} "
                                 "(tampered or corrupt)")
        meta = pq.read_schema(io.BytesIO(data)).metadata or {}
        self._check_segment_meta(spec.key, segment, meta, skey)
        self._check_binding(spec, nmf_binding(data), skey)
        entry = Segment(segment, skey, sha, pq.read_metadata(io.BytesIO(data)).num_rows)
        if recorded is None:
            self.store.put_if_absent(ekey, _dumps({"key": spec.key, "segment": segment, "nmf": skey,
                                                   "sha256": sha, "rows": entry.rows}))
        return entry, meta.get(b"dasflow.rng_mode", b"").decode(), drawn

    def _check_segment_meta(self, key: str, segment: str, meta: Mapping[bytes, bytes], where: str) -> None:
        if meta.get(b"dasflow.key", b"").decode() != key or meta.get(b"dasflow.segment", b"").decode() != segment:
            raise IntegrityError(f"{self.store.uri}/{where}: is not segment {segment!r} of {key!r}")

    def segments(self, spec: MeasurementSpec, commit: Commit) -> list[Segment] | None:
        """The segments of a committed key from its index (verified against the commit's SHA-256 and the
        binding); None if the key's NMF is not segmented."""
        data = self._committed_bytes(spec, commit)
        if not is_index(data):
            return None
        return decode_index(data, spec, f"{self.store.uri}/{commit.nmf_key}")

    def _segment_bytes(self, spec: MeasurementSpec, entry: Segment) -> bytes:
        """One segment's bytes, checked against its index row and the binding (``IntegrityError`` naming it)."""
        try:
            data = self.store.get(entry.nmf_key)
        except StoreError:
            raise IntegrityError(f"{self.store.uri}/{entry.nmf_key}: segment {entry.segment!r} of {spec.key!r} is "
                                 "missing; it is never drawn again (restore it from a backup)") from None
        if sha256_bytes(data) != entry.sha256:
            raise IntegrityError(f"{self.store.uri}/{entry.nmf_key}: segment {entry.segment!r} of {spec.key!r} "
                                 "does not match the SHA-256 in its index (tampered or corrupt)")
        self._check_segment_meta(spec.key, entry.segment, pq.read_schema(io.BytesIO(data)).metadata or {},
                                 entry.nmf_key)
        self._check_binding(spec, nmf_binding(data), entry.nmf_key)
        return data

    def load_segment(self, spec: MeasurementSpec, entry: Segment) -> NoisyMeasurement:
        """One segment of a committed key (an entry of :meth:`segments`), verified against the index."""
        return decode_nmf(self._segment_bytes(spec, entry), spec)

    def _committed_bytes(self, spec: MeasurementSpec, commit: Commit) -> bytes:
        try:
            data = self.store.get(commit.nmf_key)
        except StoreError:
            raise IntegrityError(f"{self.store.uri}/{commit.nmf_key}: the committed measurement of {spec.key!r} is "
                                 "missing; it is never drawn again (restore it from a backup)") from None
        if sha256_bytes(data) != commit.sha256:
            raise IntegrityError(f"{self.store.uri}/{commit.nmf_key}: does not match its committed SHA-256 "
                                 "(tampered or corrupt)")
        self._check_binding(spec, nmf_binding(data), commit.nmf_key)
        return data

    def load(self, spec: MeasurementSpec, commit: Commit) -> NoisyMeasurement:
        """The committed NMF of ``spec``, verified against its commit's SHA-256 and the release's binding (of a
        segmented key: its segments in index order, each verified against the index, as one table)."""
        data = self._committed_bytes(spec, commit)
        if not is_index(data):
            return decode_nmf(data, spec)
        parts = [self.load_segment(spec, e) for e in decode_index(data, spec, f"{self.store.uri}/{commit.nmf_key}")]
        table = pd.concat([p.table for p in parts], ignore_index=True)
        return NoisyMeasurement(spec=spec, table=table, rng_mode=nmf_binding(data)["rng_mode"])

    # ------------------------------------------------------------------------------------------ integrity
    def _check_binding(self, spec: MeasurementSpec, bound: Mapping[str, str], where: str) -> None:
        """An NMF (or commit) must carry the release's config hash, RNG mode and — when known here — the hash
        of its product's confidential inputs it was drawn from."""
        key = spec.key
        mine_all = self.binding_of(spec)
        for field in ("config_sha256", "rng_mode", "inputs_sha256"):
            mine = mine_all.get(field)
            if mine is None:
                continue
            if bound.get(field) != mine:
                what = {"config_sha256": "the frozen config", "rng_mode": "the release's RNG mode",
                        "inputs_sha256": "the current confidential inputs (changed since it was measured)"}[field]
                raise IntegrityError(f"{self.store.uri}/{where}: measurement {key!r} is not bound to {what}: "
                                     f"{field} {bound.get(field)!r} != {mine!r}")

    def refresh(self) -> None:
        """Forget the trace index (rebuilt at the next draw): a process that draws again later — a Dask worker
        kept between tasks, a resumed release — must see the manifests written since, or a draw deleted after
        they recorded it would look never drawn."""
        self._traces = None

    def _trace_index(self) -> dict[str, str]:
        """Ledger key → where a hash of its NMF was recorded outside the ledger: the measure, post-processing and
        release stage manifests (built once per ledger object, on the first draw)."""
        if self._traces is None:
            traces: dict[str, str] = {}
            run = f"runs/{self.release_id}"
            for mkey in sorted(self.store.list(f"{run}/manifests/")):
                if not mkey.endswith(".json") or "/validate/" in mkey or "/preprocess/" in mkey:
                    continue
                try:
                    record = json.loads(self.store.get(mkey))
                except (StoreError, ValueError):
                    traces["*"] = mkey  # an unreadable manifest may have recorded anything
                    continue
                for key in record.get("inputs", {}):
                    traces.setdefault(key, mkey)
            release_manifest = f"{run}/release/MANIFEST.json"
            if self.store.exists(release_manifest):
                traces["*"] = release_manifest  # a release was built from every planned key
            self._traces = traces
        return self._traces

    def check_never_drawn(self, key: str) -> None:
        """Refuse to draw ``key`` if a draw of it was ever persisted or used: its NMF hash is recorded in a stage
        manifest, or a release was built. Only a reservation whose noise provably never reached storage may be
        redrawn (DESIGN.md §2)."""
        traces = self._trace_index()
        where = traces.get(key) or traces.get("*")
        if where is not None:
            raise IntegrityError(
                f"measurement {key!r} was drawn before (recorded in {self.store.uri}/{where}) but its NMF or "
                "commit is missing: it is never drawn again; restore runs/"
                f"{self.release_id}/measurements/ and ledger/entries/ from a backup, or abandon the release")

    def verify(self, *, deep: bool = True) -> list[str]:
        """Check the frozen chain of the ledger: the plan's binding, every commit against its plan entry and the
        binding, and (``deep``) every committed NMF against its SHA-256 and binding. Returns the committed keys;
        raises ``IntegrityError`` naming the first object that does not match."""
        plan_key = f"{self.root}/plan.json"
        record = self.plan_record()
        bound = record.get("binding", {})
        for field in ("config_sha256", "rng_mode"):
            if field in self.binding and bound.get(field) != self.binding[field]:
                raise IntegrityError(f"{self.store.uri}/{plan_key}: the frozen plan is not bound to this release's "
                                     f"{field} ({bound.get(field)!r} != {self.binding[field]!r})")
        plan = {e["key"]: e for e in record["entries"]}
        committed = []
        for key, entry in plan.items():
            ckey = self._entry(key, "committed")
            rec = stored_record(self.store, ckey, "commit")
            if rec is None:
                continue
            if rec.get("key") != key or rec.get("budget") != entry["budget"] or \
                    rec.get("mechanism") != entry["mechanism"] or rec.get("nmf") != self.nmf_key(key):
                raise IntegrityError(f"{self.store.uri}/{ckey}: the commit does not match its frozen plan entry")
            binding = {k: v for k, v in self.binding.items() if k != "inputs_sha256"}
            cb = rec.get("binding", {})
            for field, mine in binding.items():
                if cb.get(field) != mine:
                    raise IntegrityError(f"{self.store.uri}/{ckey}: commit bound to {field} {cb.get(field)!r}, "
                                         f"the release has {mine!r}")
            if deep:  # every NMF's bytes (of a segmented key: the index and every segment, one at a time)
                spec = spec_from_record(entry)
                commit = Commit(key=key, nmf_key=rec["nmf"], sha256=rec["sha256"], rows=int(rec["rows"]))
                data = self._committed_bytes(spec, commit)
                if is_index(data):
                    for seg in decode_index(data, spec, f"{self.store.uri}/{commit.nmf_key}"):
                        self._segment_bytes(spec, seg)
                else:
                    decode_nmf(data, spec)
            committed.append(key)
        return committed

    # ---------------------------------------------------------------------------------------------- audit
    def audit(self) -> list[dict[str, Any]]:
        """One row per planned key: the plan entry plus its state (planned / reserved / committed)."""
        rows = []
        for key, entry in self.plan().items():
            state = "planned"
            commit = self.committed(key)
            if commit is not None:
                state = "committed"
            elif self.store.exists(self._entry(key, "reserved")):
                state = "reserved"
            row = {col: entry[col] for col in AUDIT_COLUMNS if col in entry}
            row["state"] = state
            row["nmf_sha256"] = commit.sha256 if commit else ""
            rows.append(row)
        return rows

    def spent(self) -> PlanTotal:
        """Exact composition of the committed entries (what has actually been spent)."""
        committed = {r["key"] for r in self.audit() if r["state"] == "committed"}
        return compose_plan([spec_from_record(e) for k, e in self.plan().items() if k in committed])


def stored_record(store: ObjectStore, key: str, what: str) -> dict[str, Any] | None:
    """A JSON record of the frozen chain: ``None`` if absent, ``IntegrityError`` if it does not parse."""
    try:
        record: dict[str, Any] = json.loads(store.get(key))
    except StoreError:
        return None
    except ValueError:
        raise IntegrityError(f"{store.uri}/{key}: unreadable {what}") from None
    return record


def spec_from_record(rec: Mapping[str, Any]) -> MeasurementSpec:
    """Rebuild a MeasurementSpec from its plan record (for accounting of committed entries)."""
    variance: Fraction | float
    try:
        variance = Fraction(rec["variance"])
    except ValueError:
        variance = float(rec["variance"])
    return MeasurementSpec(
        product=rec["product"], key=rec["key"], level=rec["level"], privacy_defn=rec["privacy_defn"],
        mechanism=rec["mechanism"], budget=None if rec["budget"] == "Infinity" else Fraction(rec["budget"]),
        sensitivity=Fraction(rec["sensitivity"]), noise=Fraction(rec["noise"]), cells=int(rec["cells"]),
        variance=variance,
    )


def nmf_binding(data: bytes) -> dict[str, str]:
    """What an NMF is bound to (config hash, RNG mode, confidential inputs hash), from its schema metadata."""
    meta = pq.read_schema(io.BytesIO(data)).metadata or {}
    bound: dict[str, str] = json.loads(meta.get(b"dasflow.binding", b"{}"))
    bound.setdefault("rng_mode", meta.get(b"dasflow.rng_mode", b"").decode())
    return bound


def _fraction_text(values: npt.NDArray[np.object_]) -> npt.NDArray[np.object_]:
    """``str`` of every Fraction in ``values``, computed once per distinct object: a variance column holds one
    Fraction object per γ, shared by its rows (TopDown: ≈ 5,500 rows per object), so this formats a handful of
    values, not one per row. Distinct objects are found by identity (``id``; each is alive in ``values``)."""
    ids = np.fromiter(map(id, values), dtype=np.uint64, count=values.size)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    text = np.empty(first.size, dtype=object)
    text[:] = [str(values[i]) for i in first.tolist()]  # over distinct objects, not rows
    return text[inverse.reshape(-1)]


def encode_nmf(m: NoisyMeasurement, spec: MeasurementSpec | None = None,
               binding: Mapping[str, str] | None = None, *, segment: str | None = None) -> bytes:
    """Parquet bytes of a noisy measurement, with its ledger key, spec, RNG mode and binding (config hash, RNG
    mode, confidential inputs hash) in the schema metadata (``spec``: the ledger's spec of the key, when it
    differs from the product's own; ``segment``: the segment of a segmented key it holds)."""
    spec = spec or m.spec
    frame = m.table
    exact = [c for c in frame.columns if frame[c].dtype == object and len(frame)
             and all(issubclass(t, Fraction) for t in set(map(type, frame[c].to_numpy(dtype=object))))]
    if exact:  # exact rationals (e.g. a variance per answer) are stored as "p/q" text and read back exactly
        frame = frame.assign(**{c: _fraction_text(frame[c].to_numpy(dtype=object)) for c in exact})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = {b"dasflow.key": spec.key.encode(), b"dasflow.rng_mode": m.rng_mode.encode(),
            b"dasflow.spec": json.dumps(spec_record(spec), sort_keys=True).encode(),
            b"dasflow.fraction_columns": json.dumps(exact).encode(),
            b"dasflow.binding": json.dumps({**(binding or {}), "rng_mode": m.rng_mode}, sort_keys=True).encode()}
    if segment is not None:
        meta[b"dasflow.segment"] = segment.encode()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    buf = io.BytesIO()
    # LZ4 with dictionary pages: ~4x faster to read back than zstd for the multi-million-row SafeTab-P NMFs, at
    # ~2.4x the size (measured on the demo's largest NMF: 9.3 M rows, 49 MB vs 20 MB). Column statistics only
    # for numeric columns: min/max of the text (dictionary) columns was over half of the encode (demo's 6.8 M-row
    # NMF: 1.69 -> 0.87 CPU-s, benchmarks/demo.py --mode threads), and no reader prunes an NMF's row groups by
    # them (NMFs are read whole)
    # Wide integer columns (row keys such as SafeTab-P's GROUP, noisy counts) are delta-encoded without a
    # dictionary: building a dictionary of millions of distinct keys only to fall back to plain pages cost more
    # than the rest of the encode (demo's 2.8 M-row segment: 0.37-0.54 -> 0.22 CPU-s, 14.7 -> 2.8 MB)
    # Integer answer vectors (a list column: TopDown's NOISY) are delta-encoded (DELTA_BINARY_PACKED: bit-packed
    # differences, ≈ 6.5 bits per noisy block count), uncompressed: without the leaf's path Parquet wrote them
    # plain (TopDown's largest segment at 100 M persons, 25,000 blocks × 2,016 cells: 77.3 MB). Against the
    # dictionary + ZSTD encoding used before, on three 10 M-person block-level segments (53,134 blocks):
    # 1.60 → 1.29 CPU-s to encode, 1.03 → 0.89 to decode, 84.7 → 86.4 MB (BENCHMARKS.md, session 20)
    numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    wide = [f.name for f in table.schema if pa.types.is_int32(f.type) or pa.types.is_int64(f.type)]
    vectors = [f"{f.name}.list.element" for f in table.schema
               if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type)]
    codecs: dict[str, str] = {f.name: "lz4" for f in table.schema if f"{f.name}.list.element" not in vectors}
    pq.write_table(table, buf, compression={**codecs, **dict.fromkeys(vectors, "none")}, write_statistics=numeric,
                   use_dictionary=[f.name for f in table.schema if f.name not in wide],
                   column_encoding=dict.fromkeys([*wide, *vectors], "DELTA_BINARY_PACKED"))
    return buf.getvalue()


def _as_stored(m: NoisyMeasurement, spec: MeasurementSpec) -> NoisyMeasurement:
    """``m`` as ``decode_nmf`` would read back the NMF ``encode_nmf`` wrote of it: the ledger's spec, a fresh
    row index (the NMF stores none); column values and dtypes are those the Parquet file round-trips."""
    table = m.table if isinstance(m.table.index, pd.RangeIndex) and m.table.index.start == 0 \
        and m.table.index.step == 1 else m.table.reset_index(drop=True)
    return NoisyMeasurement(spec=spec, table=table, rng_mode=m.rng_mode)


def decode_nmf(data: bytes, spec: MeasurementSpec) -> NoisyMeasurement:
    """Read an NMF back, checking it belongs to ``spec``."""
    table = pq.read_table(io.BytesIO(data))
    meta = table.schema.metadata or {}
    if meta.get(b"dasflow.key", b"").decode() != spec.key:
        raise LedgerRefusal(f"NMF for {spec.key!r} carries key {meta.get(b'dasflow.key')!r}")
    frame: pd.DataFrame = table.replace_schema_metadata(None).to_pandas()
    for column in json.loads(meta.get(b"dasflow.fraction_columns", b"[]")):
        # one Fraction per distinct value (a variance column has one per γ), not one per cell
        codes, uniques = pd.factorize(frame[column].to_numpy(dtype=object))
        values = np.empty(len(uniques), dtype=object)
        values[:] = [Fraction(str(u)) for u in uniques]
        frame[column] = pd.Series(values[codes], index=frame.index, dtype=object)
    return NoisyMeasurement(spec=spec, table=frame, rng_mode=meta.get(b"dasflow.rng_mode", b"").decode())


def encode_index(entries: Sequence[Segment], spec: MeasurementSpec, rng_mode: str,
                 binding: Mapping[str, str] | None = None) -> bytes:
    """Parquet bytes of a segmented key's NMF: one row per segment (``INDEX_COLUMNS``), with the key, spec, RNG
    mode and binding in the schema metadata as :func:`encode_nmf` writes them (deterministic bytes)."""
    table = pa.table({"SEGMENT": pa.array([e.segment for e in entries], type=pa.string()),
                      "OBJECT": pa.array([e.nmf_key for e in entries], type=pa.string()),
                      "SHA256": pa.array([e.sha256 for e in entries], type=pa.string()),
                      "ROWS": pa.array([e.rows for e in entries], type=pa.int64())})
    meta = {b"dasflow.key": spec.key.encode(), b"dasflow.rng_mode": rng_mode.encode(),
            b"dasflow.spec": json.dumps(spec_record(spec), sort_keys=True).encode(),
            b"dasflow.segmented": b"1",
            b"dasflow.binding": json.dumps({**(binding or {}), "rng_mode": rng_mode}, sort_keys=True).encode()}
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), buf, compression="lz4")
    return buf.getvalue()


def is_index(data: bytes) -> bool:
    """Whether NMF bytes are a segmented key's index."""
    return (pq.read_schema(io.BytesIO(data)).metadata or {}).get(b"dasflow.segmented") == b"1"


def decode_index(data: bytes, spec: MeasurementSpec, where: str) -> list[Segment]:
    """A segmented key's segments from its index bytes, checking the index belongs to ``spec``."""
    table = pq.read_table(io.BytesIO(data))
    meta = table.schema.metadata or {}
    if meta.get(b"dasflow.key", b"").decode() != spec.key or tuple(table.column_names) != INDEX_COLUMNS:
        raise IntegrityError(f"{where}: is not the segment index of {spec.key!r}")
    cols = [table.column(c).to_pylist() for c in INDEX_COLUMNS]
    return [Segment(str(s), str(k), str(h), int(r)) for s, k, h, r in zip(*cols, strict=True)]


def audit_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """The audit rows as CSV text."""
    frame = pd.DataFrame(list(rows))
    return str(frame.to_csv(index=False))
