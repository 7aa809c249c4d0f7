"""One object-store test suite run against every backend: local directory, moto's S3 server, SeaweedFS."""

from __future__ import annotations

import io
import threading
import uuid
from collections.abc import Iterator

import pandas as pd
import pytest

from dasflow.io.store import (
    ForbiddenKey,
    LocalStore,
    ObjectStore,
    S3Store,
    StoreError,
    open_store,
    sha256_bytes,
)
from tests.servers import make_bucket, moto_server, s3_client, seaweedfs_server

pytestmark = pytest.mark.xdist_group("s3servers")


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as ep:
        yield ep


@pytest.fixture(scope="module")
def weed_endpoint() -> Iterator[str]:
    with seaweedfs_server() as ep:
        yield ep


@pytest.fixture(params=["local", "moto", "seaweedfs"])
def store(request: pytest.FixtureRequest, tmp_path) -> ObjectStore:  # type: ignore[no-untyped-def]
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint = request.getfixturevalue("moto_endpoint" if request.param == "moto" else "weed_endpoint")
    bucket = f"dasflow-{uuid.uuid4().hex[:10]}"
    make_bucket(endpoint, bucket)
    return S3Store(f"s3://{bucket}/prefix/a", client=s3_client(endpoint))


def test_put_get_exists_hash(store: ObjectStore) -> None:
    assert not store.exists("runs/r1/config.json")
    sha = store.put("runs/r1/config.json", b'{"a": 1}\n')
    assert sha == sha256_bytes(b'{"a": 1}\n')
    assert store.exists("runs/r1/config.json")
    assert store.get("runs/r1/config.json") == b'{"a": 1}\n'
    assert store.sha256("runs/r1/config.json") == sha
    store.put("runs/r1/config.json", b"replaced")
    assert store.get("runs/r1/config.json") == b"replaced"


def test_head_and_streamed_hash(store: ObjectStore) -> None:
    """A content check reads only a file's head (a ranged GET on S3); hashes never need the whole object in
    memory on a local store; an empty object has an empty head; a restricted view applies its rule to both."""
    data = b"H1|H2\n" + b"1|2\n" * 50_000
    store.put("confidential/x/persons.txt", data)
    store.put("confidential/x/empty.txt", b"")
    assert store.head("confidential/x/persons.txt", 9) == data[:9]
    assert store.head("confidential/x/persons.txt", 10 * len(data)) == data
    assert store.head("confidential/x/empty.txt", 64) == b""
    assert store.sha256("confidential/x/persons.txt") == sha256_bytes(data)
    view = store.restricted(["confidential/"])
    with pytest.raises(StoreError):
        view.head("confidential/x/persons.txt", 4)
    with pytest.raises(StoreError):
        view.sha256("confidential/x/persons.txt")


def test_get_missing_is_a_store_error(store: ObjectStore) -> None:
    with pytest.raises(StoreError, match="no object"):
        store.get("runs/none/x.json")


def test_create_only_put_refuses_second_write(store: ObjectStore) -> None:
    assert store.put_if_absent("runs/r1/ledger/k.reserved.json", b"first")
    assert not store.put_if_absent("runs/r1/ledger/k.reserved.json", b"second")
    assert store.get("runs/r1/ledger/k.reserved.json") == b"first"


def test_create_only_put_under_concurrency_has_one_winner(store: ObjectStore) -> None:
    """Eight threads race to create one key: exactly one wins and its content is what is stored."""
    results: list[tuple[int, bool]] = []
    barrier = threading.Barrier(8)

    def racer(i: int) -> None:
        barrier.wait()
        results.append((i, store.put_if_absent("runs/r1/ledger/race.json", f"writer {i}".encode())))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results if won]
    assert len(winners) == 1
    assert store.get("runs/r1/ledger/race.json") == f"writer {winners[0]}".encode()


def test_list_is_sorted_and_prefix_scoped(store: ObjectStore) -> None:
    for key in ["runs/r1/b.txt", "runs/r1/a/x.txt", "runs/r2/a.txt", "confidential/p.csv"]:
        store.put(key, b"x")
    assert store.list("runs/r1/") == ["runs/r1/a/x.txt", "runs/r1/b.txt"]
    assert store.list("runs/") == ["runs/r1/a/x.txt", "runs/r1/b.txt", "runs/r2/a.txt"]
    assert "confidential/p.csv" in store.list()


def test_parquet_round_trip_is_deterministic(store: ObjectStore) -> None:
    frame = pd.DataFrame({"geo": ["01", "02"], "count": [3, -1]})
    sha1, rows = store.put_parquet("runs/r1/p/a.parquet", frame)
    sha2, _ = store.put_parquet("runs/r1/p/b.parquet", frame.copy())
    assert rows == 2 and sha1 == sha2
    pd.testing.assert_frame_equal(store.get_parquet("runs/r1/p/a.parquet"), frame)


def test_restricted_view_cannot_resolve_confidential_keys(store: ObjectStore) -> None:
    store.put("confidential/persons.csv", b"secret")
    store.put("runs/r1/measurements/k.parquet", b"noisy")
    view = store.restricted(["confidential/"])
    with pytest.raises(ForbiddenKey):
        view.get("confidential/persons.csv")
    with pytest.raises(ForbiddenKey):
        view.exists("confidential/persons.csv")
    with pytest.raises(ForbiddenKey):
        view.list("confidential/")
    assert "confidential/persons.csv" not in view.list()
    assert view.get("runs/r1/measurements/k.parquet") == b"noisy"


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "a//b", "a\\b"])
def test_invalid_keys_are_refused(tmp_path, bad: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StoreError, match="invalid object key"):
        LocalStore(tmp_path).put(bad, b"x")


def test_local_atomic_put_leaves_no_temp_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path)
    store.put("a/b.json", b"1")
    store.put_if_absent("a/c.json", b"2")
    store.put_if_absent("a/c.json", b"3")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.json", "c.json"]


def test_open_store_resolves_uris(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(open_store(tmp_path), LocalStore)
    assert isinstance(open_store(tmp_path.as_uri()), LocalStore)
    with pytest.raises(Exception, match="unsupported store URI"):
        open_store("ftp://x/y")


def test_put_many_writes_every_object_like_put(store: ObjectStore) -> None:
    items = {f"runs/r1/parts/p{i:02d}.parquet": f"part {i}".encode() * (i + 1) for i in range(20)}
    items["runs/r1/parts/sub/x.json"] = b"{}"
    shas = store.put_many(items)
    assert shas == {key: sha256_bytes(data) for key, data in items.items()}
    assert {key: store.get(key) for key in items} == items
    assert store.put_many({"runs/r1/parts/p00.parquet": b"replaced"}) == {
        "runs/r1/parts/p00.parquet": sha256_bytes(b"replaced")}
    assert store.get("runs/r1/parts/p00.parquet") == b"replaced"


def test_put_many_through_a_restricted_view_refuses_before_writing(store: ObjectStore) -> None:
    view = store.restricted(["confidential/"])
    with pytest.raises(ForbiddenKey):
        view.put_many({"runs/r1/a.json": b"1", "confidential/x.csv": b"2"})
    assert not store.exists("runs/r1/a.json") and not store.exists("confidential/x.csv")
    assert view.put_many({"runs/r1/a.json": b"1"}) == {"runs/r1/a.json": sha256_bytes(b"1")}


def test_local_put_many_leaves_no_temp_files_and_fails_loudly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path)
    store.put_many({f"a/{i}.json": b"1" for i in range(30)})
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(f"{i}.json" for i in range(30))
    with pytest.raises(StoreError, match="invalid object key"):
        store.put_many({"a/ok.json": b"1", "a/../bad": b"2"})


def test_streaming_writer_publishes_only_complete_objects(store: ObjectStore) -> None:
    """A streamed put (multipart on S3: 3 parts of a forced 5 MiB part size) appears only when its block ends,
    whole, with the SHA-256 computed on the way; a block that raises leaves the old object (or none) and no temp
    files; a reader returns the bytes without a whole-object get."""
    import dasflow.io.store as store_module

    chunks = [bytes([i]) * (2 * 2**20 + 17) for i in range(6)]  # 12 MiB: multipart with 5 MiB parts
    data = b"".join(chunks)
    old = store_module.S3_PART_BYTES
    store_module.S3_PART_BYTES = 5 * 2**20
    try:
        with store.writer("runs/r1/release/big.csv") as sink:
            for c in chunks:
                sink.write(c)
                assert not store.exists("runs/r1/release/big.csv")
    finally:
        store_module.S3_PART_BYTES = old
    assert (sink.sha256, sink.size) == (sha256_bytes(data), len(data))
    assert store.sha256("runs/r1/release/big.csv") == sink.sha256
    with store.reader("runs/r1/release/big.csv") as fh:
        assert fh.read() == data
    with store.writer("runs/r1/release/small.csv") as sink:
        sink.write(b"a|b\n")
    assert store.get("runs/r1/release/small.csv") == b"a|b\n"
    with pytest.raises(RuntimeError), store.writer("runs/r1/release/small.csv") as sink:
        sink.write(b"x" * (6 * 2**20))
        raise RuntimeError("fails mid-write")
    with pytest.raises(RuntimeError), store.writer("runs/r1/release/none.csv") as sink:
        sink.write(b"partial")
        raise RuntimeError("fails mid-write")
    assert store.get("runs/r1/release/small.csv") == b"a|b\n"
    assert store.list("runs/r1/release/") == ["runs/r1/release/big.csv", "runs/r1/release/small.csv"]
    if isinstance(store, LocalStore):
        assert sorted(p.name for p in (store.root / "runs/r1/release").iterdir()) == ["big.csv", "small.csv"]
    view = store.restricted(["confidential/"])
    with pytest.raises(ForbiddenKey):
        view.writer("confidential/x.csv")
    with pytest.raises(ForbiddenKey):
        view.reader("confidential/x.csv")
    with pytest.raises(StoreError):
        store.reader("runs/r1/release/absent.csv")


def test_write_parquet_streams_row_groups(store: ObjectStore) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [pa.table({"UNIT": pa.array(range(i * 10, i * 10 + 10), pa.int64())}) for i in range(3)]
    sha, rows = store.write_parquet("runs/r1/post/x.parquet", iter(parts))
    assert rows == 30 and store.sha256("runs/r1/post/x.parquet") == sha
    with store.reader("runs/r1/post/x.parquet") as fh:
        f = pq.ParquetFile(fh)
        assert f.metadata.num_row_groups == 3
        assert f.read().column("UNIT").to_pylist() == list(range(30))
    schema = pa.schema([("UNIT", pa.int64())])
    assert store.write_parquet("runs/r1/post/empty.parquet", iter([]), schema)[1] == 0
    assert pq.read_table(io.BytesIO(store.get("runs/r1/post/empty.parquet"))).schema == schema
