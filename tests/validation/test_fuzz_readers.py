"""Issue 11 item 5, property-based: no malformed line ends in an untyped exception. Every reader of the release
inputs, behind the phase-0 preflight exactly as the validation gate runs it, either returns or raises
``InputError`` (file named; row named for line-level faults) on arbitrary mutations of valid files."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dasflow.errors import InputError
from dasflow.products.phsafe.inputs import SCHEMAS, read_table
from dasflow.products.safetab_p.iterations import ITERATION_FILES, load_iterations
from dasflow.products.safetab_p.records import PERSON_COLUMNS, read_pipe_file
from dasflow.registry import get_plugin
from dasflow.validation.configs import validate_product_config
from dasflow.validation.preflight import check_delimited
from tests.validation.helpers import CORPUS

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BASE = CORPUS / "base"

_bytes = st.binary(min_size=0, max_size=12)
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """A valid file with a few line-level faults: replaced/inserted bytes, cut lines, swapped delimiters,
    dropped or doubled lines, a lost header, stray quotes."""
    lines = original.split(b"\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["bytes", "text", "cut", "delim", "drop", "dup", "quote", "blank"]))
        line = lines[i]
        if kind == "bytes":
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(_bytes) + line[j + 1:]
        elif kind == "text":
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(_text).encode() + line[j:]
        elif kind == "cut":
            lines[i] = line[:draw(st.integers(0, len(line)))]
        elif kind == "delim":
            lines[i] = line.replace(b"|", draw(st.sampled_from([b",", b";", b"\t", b"||", b""])))
        elif kind == "drop":
            del lines[i]
            if not lines:
                lines = [b""]
        elif kind == "dup":
            lines.insert(i, line)
        elif kind == "quote":
            lines[i] = b'"' + line
        else:
            lines[i] = b""
    return b"\n".join(lines)


def _check(path: Path, read: Callable[[Path], Any], columns: list[str] | None, delimiter: str | None,
           extra: bool = False) -> None:
    try:
        check_delimited(path, columns, delimiter, extra_columns=extra)
        read(path)
    except InputError as exc:
        assert exc.file is not None


def _fuzz_file(key: str, data: bytes, read: Callable[[Path], Any], columns: list[str] | None,
               delimiter: str | None, extra: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(key).name
        path.write_bytes(data)
        _check(path, read, columns, delimiter, extra)


def _small(key: str, lines: int = 30) -> bytes:
    return b"\n".join((BASE / key).read_bytes().split(b"\n")[:lines]) + b"\n"


@SETTINGS
@given(data=mutated(_small("confidential/phsafe/persons.csv")), name=st.sampled_from(["persons"]))
def test_phsafe_persons_reader(data: bytes, name: str) -> None:
    _fuzz_file("persons.csv", data, lambda p: read_table(p, name), list(SCHEMAS[name]), None)


@SETTINGS
@given(data=mutated(_small("confidential/phsafe/units.csv")))
def test_phsafe_units_reader(data: bytes) -> None:
    _fuzz_file("units.csv", data, lambda p: read_table(p, "units"), list(SCHEMAS["units"]), None)


@SETTINGS
@given(data=mutated(_small("public/phsafe/geo.csv")))
def test_phsafe_geo_reader(data: bytes) -> None:
    _fuzz_file("geo.csv", data, lambda p: read_table(p, "geo"), list(SCHEMAS["geo"]), None)


@SETTINGS
@given(data=mutated(_small("confidential/safetab-p/person-records.txt")))
def test_safetab_person_reader(data: bytes) -> None:
    _fuzz_file("person-records.txt", data, lambda p: read_pipe_file(p, PERSON_COLUMNS), list(PERSON_COLUMNS), "|")


@SETTINGS
@given(data=mutated(_small("public/safetab-p/GRF-C.txt")))
def test_safetab_grfc_reader(data: bytes) -> None:
    from dasflow.products.safetab_p.records import GRFC_COLUMNS, load_geography

    def read(p: Path) -> Any:
        return load_geography(read_pipe_file(p, GRFC_COLUMNS, extra_columns=True), "US", ["10"], str(p))

    _fuzz_file("GRF-C.txt", data, read, list(GRFC_COLUMNS), "|", extra=True)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(ITERATION_FILES), data=st.data())
def test_iteration_files_reader(name: str, data: st.DataObject) -> None:
    """The four iteration files are read together: mutate one, keep the rest."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in ITERATION_FILES:
            shutil.copyfile(BASE / "public/safetab-p" / f, Path(tmp) / f)
        original = (Path(tmp) / name).read_bytes()
        head = b"\n".join(original.split(b"\n")[:40]) + b"\n" + b"\n".join(original.split(b"\n")[40:])
        (Path(tmp) / name).write_bytes(data.draw(mutated(head)))
        try:
            for f in ITERATION_FILES:
                check_delimited(Path(tmp) / f, None, "|")
            load_iterations(tmp)
        except InputError as exc:
            assert exc.file is not None


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(0, 3000), junk=_bytes)
def test_groupsize_parquet_reader(cut: int, junk: bytes) -> None:
    """Truncated or garbled Parquet part files are rejected by the gate's preflight, never a pyarrow error."""
    from dasflow.io.store import LocalStore

    good = (BASE / "confidential/groupsize/10/part-00000.parquet").read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp))
        store.put("confidential/groupsize/10/part-00000.parquet", good[:cut] + junk + good[cut + len(junk):])
        try:
            get_plugin("groupsize").preflight(store, {"groupsize": "confidential/groupsize/"}, public=False)
            pq.read_table(io.BytesIO(store.get("confidential/groupsize/10/part-00000.parquet")))
        except InputError as exc:
            assert exc.file is not None
        except (pa.ArrowException, OSError):  # pragma: no cover - the property under test
            raise AssertionError("a garbled Parquet file passed the preflight") from None


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                     max_leaves=8)


@settings(max_examples=80, deadline=None)
@given(product=st.sampled_from(["phsafe", "safetab-p", "groupsize"]), key=st.text(max_size=30), value=_json,
       drop=st.booleans())
def test_config_parsers(product: str, key: str, value: Any, drop: bool) -> None:
    """Arbitrary changes to a shipped config are accepted or rejected with ``InputError`` — nothing else."""
    from tests.validation.helpers import CONFIG_FILES, _config_text

    raw = json.loads(_config_text(CONFIG_FILES[product]))
    keys = sorted(raw)
    target = keys[hash(key) % len(keys)] if drop or not key else key
    if drop:
        raw.pop(target)
    else:
        raw[target] = value
    try:
        validate_product_config(get_plugin(product), json.dumps(raw), "US")
    except InputError as exc:
        assert exc.file is not None
