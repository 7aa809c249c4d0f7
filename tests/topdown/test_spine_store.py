"""Spine storage: ``spine_bytes`` / ``spine_from_bytes`` (exact, deterministic, no pickle) and the build cache."""

from __future__ import annotations

import io
import json
import logging
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import fields
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dasflow.products.topdown.spine as spine_mod
from dasflow.errors import IntegrityError
from dasflow.products.topdown.spine import (
    SPINE_FORMAT,
    PrivacyInvariantError,
    Spine,
    SpineConfig,
    build_spine,
    preset,
    spine_bytes,
    spine_from_bytes,
)

from .helpers import make_spine, small_geography

F = Fraction
BETA6 = [F(v, 4099) for v in (104, 1440, 447, 687, 1256, 165)]
SOURCE = "s3://bucket/spine.npz"


def _inputs(name: str) -> tuple[pd.DataFrame, SpineConfig]:
    """The block table and config of the presets built in test_spine.py (plus Alg 2's tract groups)."""
    geo = small_geography(seed=3, states=("01", "09"), counties=2, tracts=5)
    if name == "dhc":
        g = geo.assign(PRIM=np.where(geo["PLACEFP"] == "99999", "R", geo["PLACEFP"]), SDUNI="00100")
        return g, preset("dhc", [F(1, 8)] * 8, 2)
    if name == "pr":
        return small_geography(seed=5, states=("72",), counties=2, tracts=3), preset("pr", BETA6, 3)
    if name == "tract_groups":
        return geo, SpineConfig(beta=tuple([F(1, 7)] * 7), fanout_cutoff=1, tract_groups=True)
    return geo, preset(name, BETA6, 2)


PRESETS = ("pl94_persons", "pl94_units", "dhc", "pr", "tract_groups")


@pytest.fixture(scope="module")
def spines() -> dict[str, Spine]:
    return {name: build_spine(*_inputs(name)) for name in PRESETS}


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No spine held in this process: ``build_spine`` reads its cache or builds."""
    monkeypatch.setattr(spine_mod, "_BUILT", {})


def assert_same_spine(a: Spine, b: Spine) -> None:
    """Every field equal, arrays with identical dtypes, text as Python str, diagnostics exactly."""
    for f in fields(Spine):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("parent", "gamma_num", "labels"):
            assert len(x) == len(y)
            for u, v in zip(x, y, strict=True):
                assert u.dtype == v.dtype and u.dtype in (np.int64, object)
                assert np.array_equal(u, v)
        elif f.name in ("block_geoid", "block_source_row"):
            assert x.dtype == y.dtype and np.array_equal(x, y)
        elif f.name == "diagnostics":
            assert list(x) == list(y)
            for k in x:
                if isinstance(x[k], pd.DataFrame):
                    pd.testing.assert_frame_equal(x[k], y[k], check_exact=True)
                else:
                    assert x[k] == y[k]
        else:
            assert x == y and type(x) is type(y)
    for lab in [*b.labels, b.block_geoid]:
        assert all(type(s) is str for s in lab.tolist())
    assert all(type(v) is Fraction for v in b.beta)
    for rec in b.diagnostics.get("levels", []):
        assert all(type(k) is int for k in rec.get("fanout_hist", {}))


@pytest.mark.parametrize("name", PRESETS)
def test_round_trip_is_exact_and_bytes_deterministic(name: str, spines: dict[str, Spine], fresh: None) -> None:
    sp = spines[name]
    data = spine_bytes(sp)
    assert spine_bytes(sp) == data
    back = spine_from_bytes(data, SOURCE)
    assert_same_spine(sp, back)
    assert spine_bytes(back) == data
    assert set(sp.diagnostics) == {"certificate", "levels", "tract_group_merges", "osed"}
    rebuilt = build_spine(*_inputs(name))  # a second build of the same inputs (nothing held in the process)
    assert rebuilt is not sp and spine_bytes(rebuilt) == data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        assert {z[k].dtype for k in z.files} == {np.dtype(np.int64), np.dtype(np.uint8)}


def test_hand_made_spine_without_diagnostics_round_trips() -> None:
    sp = make_spine([[0, 0], [0, 0, 1, 1]], [F(1, 3)] * 3)
    assert_same_spine(sp, spine_from_bytes(spine_bytes(sp), SOURCE))


def test_spine_bytes_refuses_what_it_cannot_hold_exactly(spines: dict[str, Spine]) -> None:
    sp = make_spine([[0, 0], [0, 0, 1, 1]], [F(1, 3)] * 3)
    sp.parent[1] = sp.parent[1].astype(np.int32)
    with pytest.raises(ValueError, match="int64"):
        spine_bytes(sp)
    sp = make_spine([[0, 0], [0, 0, 1, 1]], [F(1, 3)] * 3)
    sp.diagnostics = {"other": {1: 2}}
    with pytest.raises(ValueError, match="JSON"):
        spine_bytes(sp)
    sp.diagnostics = {"certificate": {"blocks_checked": np.int64(4)}}
    with pytest.raises(ValueError, match="JSON"):
        spine_bytes(sp)


def _resave(data: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The stored arrays after ``change``, written again with plain ``np.savez`` (pickles object arrays)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _header(arrays: dict[str, Any], **edit: Any) -> None:
    h = json.loads(arrays["header"].tobytes())
    h.update(edit)
    arrays["header"] = np.frombuffer(json.dumps(h).encode(), dtype=np.uint8)


def _set(name: str, index: int, value: int) -> Callable[[dict[str, Any]], None]:
    def change(arrays: dict[str, Any]) -> None:
        arrays[name] = arrays[name].copy()
        arrays[name][index] = value
    return change


def test_tampered_gamma_is_refused_by_the_privacy_invariant(spines: dict[str, Spine]) -> None:
    data = spine_bytes(spines["pl94_persons"])

    def plus_one(arrays: dict[str, Any]) -> None:
        arrays["gamma_num_3"] = arrays["gamma_num_3"] + np.eye(1, arrays["gamma_num_3"].size, dtype=np.int64)[0]

    assert spine_from_bytes(_resave(data, lambda a: None), SOURCE).input_hash  # re-saving alone is harmless
    with pytest.raises(PrivacyInvariantError, match="path sum"):
        spine_from_bytes(_resave(data, plus_one), SOURCE)
    with pytest.raises(PrivacyInvariantError, match="negative"):
        spine_from_bytes(_resave(data, _set("gamma_num_2", 0, -1)), SOURCE)


def _object_array(arrays: dict[str, Any]) -> None:
    arrays["labels_1_data"] = np.array(["a", "b"], dtype=object)


MALFORMED: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "truncated": (lambda d: d[: len(d) // 2], "not a readable spine object"),
    "truncated tail": (lambda d: d[:-10], "not a readable spine object"),
    "empty": (lambda d: b"", "not a readable spine object"),
    "pickle": (lambda d: pickle.dumps({"header": 1}), "not a readable spine object"),
    "plain npy": (lambda d: _npy(np.arange(3)), "not an npz archive"),
    "wrong format tag": (lambda d: _resave(d, lambda a: _header(a, format="dasflow-topdown-spine-v0")),
                         "not a dasflow-topdown-spine-v1 object"),
    "header not JSON": (lambda d: _resave(d, lambda a: a.update(header=np.frombuffer(b"{x", np.uint8))),
                        "not JSON"),
    "header field type": (lambda d: _resave(d, lambda a: _header(a, denominator="7")), "denominator"),
    "beta not exact": (lambda d: _resave(d, lambda a: _header(a, beta=["0.5"] * 6)), "beta"),
    "missing array": (lambda d: _resave(d, lambda a: a.pop("parent_2")), "missing arrays \\['parent_2'\\]"),
    "unexpected array": (lambda d: _resave(d, lambda a: a.update(extra=np.zeros(1, np.int64))),
                         "unexpected arrays \\['extra'\\]"),
    "float array": (lambda d: _resave(d, lambda a: a.update(gamma_num_1=a["gamma_num_1"].astype(float))),
                    "'gamma_num_1' is float64"),
    "big-endian int": (lambda d: _resave(d, lambda a: a.update(parent_2=a["parent_2"].astype(">i8"))),
                       "'parent_2' is >i8"),
    "2-D array": (lambda d: _resave(d, lambda a: a.update(block_source_row=a["block_source_row"][None, :])),
                  "'block_source_row' is int64 with shape"),
    "object array": (lambda d: _resave(d, _object_array), "not a readable spine object: ValueError"),
    "parent out of range": (lambda d: _resave(d, _set("parent_2", -1, 10**6)),
                            "parent index 1000000 out of range"),
    "negative parent": (lambda d: _resave(d, _set("parent_3", 0, -5)), "parent index -5 out of range"),
    "root not one unit": (lambda d: _resave(d, lambda a: a.update(parent_0=np.array([-1, -1]))),
                          "one root unit"),
    "gamma length": (lambda d: _resave(d, lambda a: a.update(gamma_num_2=a["gamma_num_2"][:-1])), "γ for"),
    "labels length": (lambda d: _resave(d, lambda a: a.update(labels_2_offsets=a["labels_2_offsets"][:-1])),
                      "labels_2: .* strings for"),
    "offsets not monotone": (lambda d: _resave(d, _set("labels_4_offsets", 3, 10**9)), "offsets are not"),
    "offsets past data": (lambda d: _resave(d, lambda a: a.update(
        block_geoid_data=a["block_geoid_data"][:-1])), "offsets are not"),
    "not UTF-8": (lambda d: _resave(d, _set("block_geoid_data", 0, 0xFF)), "block_geoid: .*UTF8"),
    "source rows": (lambda d: _resave(d, lambda a: a.update(block_source_row=a["block_source_row"][1:])),
                    "block source rows"),
    "fanout keys": (lambda d: _resave(d, lambda a: _header(a, diagnostics={"levels": [
        {"fanout_hist": {"x": 1}}], "osed": None})), "fanout_hist keys"),
}


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_object_is_refused_naming_the_source(case: str, spines: dict[str, Spine]) -> None:
    damage, message = MALFORMED[case]
    data = damage(spine_bytes(spines["pl94_persons"]))
    with pytest.raises(IntegrityError, match=f"^{SOURCE}: .*{message}"):
        spine_from_bytes(data, SOURCE)


def test_cache_is_read_instead_of_rebuilt(tmp_path: Path, fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process reads the stored spine (no build); the file is the spine's exact bytes, never a pickle."""
    geo, cfg = _inputs("pl94_persons")
    sp = build_spine(geo, cfg, cache_dir=tmp_path)
    (path,) = tmp_path.iterdir()
    assert path.name == f"spine-{sp.input_hash}.npz" and path.read_bytes() == spine_bytes(sp)
    monkeypatch.setattr(spine_mod, "_BUILT", {})

    def no_build(*args: Any) -> Spine:
        raise AssertionError("rebuilt although the cache holds the spine")

    monkeypatch.setattr(spine_mod, "_build", no_build)
    again = build_spine(geo, cfg, cache_dir=tmp_path)
    assert again is not sp
    assert_same_spine(sp, again)
    assert build_spine(geo, cfg) is again  # held in the process from now on


class _Payload:
    """Unpickling this object records that it happened (a cache file must never be unpickled)."""

    ran = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_mark_unpickled, ())


def _mark_unpickled() -> None:
    _Payload.ran = True


def _tampered_gamma(data: bytes) -> bytes:
    return _resave(data, _set("gamma_num_4", 0, 0))


@pytest.mark.parametrize("garbage", ["random", "pickle", "tampered γ", "other inputs", "truncated"])
def test_untrusted_cache_file_is_rebuilt_and_overwritten(garbage: str, tmp_path: Path, fresh: None,
                                                         spines: dict[str, Spine],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    geo, cfg = _inputs("pl94_persons")
    sp = spines["pl94_persons"]
    good = spine_bytes(sp)
    path = tmp_path / f"spine-{sp.input_hash}.npz"
    path.write_bytes({
        "random": lambda: np.random.default_rng(0).bytes(5000),
        "pickle": lambda: pickle.dumps(_Payload()),
        "tampered γ": lambda: _tampered_gamma(good),
        "other inputs": lambda: spine_bytes(spines["pl94_units"]),
        "truncated": lambda: good[:-100],
    }[garbage]())
    with caplog.at_level(logging.WARNING, logger=spine_mod.__name__):
        out = build_spine(geo, cfg, cache_dir=tmp_path)
    assert not _Payload.ran
    assert "spine cache not used" in caplog.text
    assert_same_spine(sp, out)
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == [path.name]
    monkeypatch.setattr(spine_mod, "_BUILT", {})
    assert_same_spine(sp, build_spine(geo, cfg, cache_dir=tmp_path))


def test_format_tag_is_in_the_header(spines: dict[str, Spine]) -> None:
    with np.load(io.BytesIO(spine_bytes(spines["pr"])), allow_pickle=False) as z:
        header = json.loads(z["header"].tobytes())
    assert header["format"] == SPINE_FORMAT == "dasflow-topdown-spine-v1"
    assert header["beta"] == [str(b) for b in spines["pr"].beta]
