"""Issue 18: an attacker who reads every published byte and edits every stored object, and a careless operator.

Nothing confidential leaves (no digest, no value under ``release/`` or in an error message), nothing frozen can
be changed (config, plan, commits, NMFs are one chain, verified at open, resume, release, status and publish),
nothing measured is ever drawn again, and bad or unmarked input is refused before anything is frozen.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dasflow.config import parse_release_config
from dasflow.errors import InputError, IntegrityError
from dasflow.io.files import cache_dir, local_file
from dasflow.io.store import ForbiddenKey, LocalStore, ObjectStore
from dasflow.pipeline import stages
from dasflow.pipeline.inputs import inputs_digest, mark_synthetic
from dasflow.pipeline.run import candidate_context, freeze_config, open_run
from dasflow.release.publish import publish
from tests.dag import counts_product
from tests.dag.helpers import local_release, release_dict, seed_inputs
from tests.release.helpers import released_context
from tests.release.test_stage import phsafe_release


def _release_bytes(store_dir: Path, release_id: str) -> bytes:
    root = store_dir / "runs" / release_id / "release"
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_release_carries_no_confidential_digest_and_no_record_value(tmp_path: Path) -> None:
    """Every byte under release/ (tables, estimates, certificate md+html, accuracy report, ledger, manifest) is
    searched for every confidential input's SHA-256 (hex, either case), the inputs digest the NMFs are bound to,
    every MAFID of the person and unit files and every whole person record."""
    ctx = phsafe_release(tmp_path)
    published = _release_bytes(tmp_path / "store", ctx.release_id)
    assert b"PH1" in published and len(published) > 10_000  # the release is really there
    hashes = ctx.confidential_hashes()
    assert {k.rsplit("/", 1)[-1] for k in hashes} >= {"persons.csv", "units.csv"}
    secrets = [h.encode() for h in hashes.values()] + [h.upper().encode() for h in hashes.values()]
    secrets += [inputs_digest(hashes).encode(), inputs_digest(ctx.confidential_hashes("phsafe")).encode()]
    for key in ("confidential/synth/phsafe/persons.csv", "confidential/synth/phsafe/units.csv"):
        header, *rows = ctx.store.get(key).decode().splitlines()
        mafid = header.split("|").index("MAFID") if "|" in header else header.split(",").index("MAFID")
        sep = "|" if "|" in header else ","
        secrets += [r.split(sep)[mafid].encode() for r in rows]
        if key.endswith("persons.csv"):
            secrets += [r.encode() for r in rows]
    assert len(secrets) > 1000
    leaked = [s for s in secrets if s in published]
    assert leaked == []


def test_editing_the_frozen_rng_mode_is_refused_at_every_layer(tmp_path: Path) -> None:
    """A seeded test release edited into a production one: the config hash, then the plan's binding, then every
    commit's and NMF's binding refuse; publish refuses; status refuses."""
    ctx = released_context(tmp_path)
    store_dir = tmp_path / "store"
    uri = str(store_dir)
    raw = json.loads((store_dir / "runs/r1/config.json").read_text())
    raw["rng"] = {"mode": "production", "seed": None}
    raw["account"] = "cef"
    forged = parse_release_config({**raw, "store": uri})
    (store_dir / "runs/r1/config.json").write_text(forged.canonical_json())
    with pytest.raises(IntegrityError, match="does not match its frozen SHA-256"):
        open_run("r1", uri)
    (store_dir / "runs/r1/config.sha256").write_text(forged.sha256() + "\n")
    with pytest.raises(IntegrityError, match="bound to another config"):
        open_run("r1", uri)
    plan_path = store_dir / "runs/r1/ledger/plan.json"
    plan = json.loads(plan_path.read_text())
    plan["binding"] = {"config_sha256": forged.sha256(), "rng_mode": "production"}
    plan_path.write_text(json.dumps(plan, sort_keys=True, indent=1) + "\n")
    forged_ctx = open_run("r1", uri)  # config, hash and plan all forged consistently: the commits still know
    with pytest.raises(IntegrityError, match="commit bound to"):
        stages.status(forged_ctx)
    with pytest.raises(IntegrityError):
        publish(forged_ctx, str(tmp_path / "public"))
    assert not (tmp_path / "public").exists()
    assert ctx.config.is_test


def test_a_deleted_measurement_is_never_drawn_again(tmp_path: Path) -> None:
    """After the release, one NMF and its commit are deleted (the reservation stays): a resume refuses to draw
    the key again, names where its first draw was recorded, and writes nothing."""
    ctx = released_context(tmp_path)
    spec = stages.product_specs(ctx, "counts")[0]
    ctx.store.delete(ctx.ledger.nmf_key(spec.key))
    ctx.store.delete(f"{ctx.ledger.root}/entries/{spec.key}.committed.json")
    again = open_run("r1", str(tmp_path / "store"))
    with pytest.raises(IntegrityError, match="never drawn again"):
        stages.measure_stage(again, "counts")
    assert not ctx.store.exists(ctx.ledger.nmf_key(spec.key))
    # the release manifest removed as well: the measure and post-processing manifests still record the draw
    ctx.store.delete("runs/r1/release/MANIFEST.json")
    with pytest.raises(IntegrityError, match=r"manifests/(measure|postprocess)/counts\.json"):
        stages.measure_stage(open_run("r1", str(tmp_path / "store")), "counts")
    assert not ctx.store.exists(ctx.ledger.nmf_key(spec.key))


def test_a_reservation_that_never_reached_storage_is_redrawn(tmp_path: Path) -> None:
    """The one legitimate redraw: reserved, no NMF, no trace anywhere (the process died before writing)."""
    store, cfg = local_release(tmp_path)
    ctx = freeze_config(cfg, store)
    stages.validate_stage(ctx, "counts")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "counts")
    store.put_if_absent("runs/r1/ledger/entries/counts/state.reserved.json", b'{"attempt": "died"}\n')
    assert stages.measure_stage(ctx, "counts")["drawn_now"] == 2


def test_a_replaced_nmf_and_commit_are_refused_by_the_stage_manifests(tmp_path: Path) -> None:
    """An attacker swaps one key's NMF and rewrites its commit to match: the measure manifest recorded the first
    draw's hash, so status and publish refuse."""
    ctx = released_context(tmp_path)
    a, b = stages.product_specs(ctx, "counts")
    ckey = f"{ctx.ledger.root}/entries/{a.key}.committed.json"
    commit = json.loads(ctx.store.get(ckey))
    table = pq.read_table(io.BytesIO(ctx.store.get(ctx.ledger.nmf_key(a.key))))  # re-encoded with a changed row
    frame = table.to_pandas()
    frame.loc[0, "NOISY"] = int(frame.loc[0, "NOISY"]) + 100
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(table.schema.metadata),
                   out)
    ctx.store.put(ctx.ledger.nmf_key(a.key), out.getvalue())
    commit["sha256"] = hashlib.sha256(out.getvalue()).hexdigest()
    ctx.store.put(ckey, (json.dumps(commit, sort_keys=True, indent=1) + "\n").encode())
    with pytest.raises(IntegrityError, match="no longer has"):
        stages.status(open_run("r1", str(tmp_path / "store")))
    with pytest.raises(IntegrityError):
        publish(open_run("r1", str(tmp_path / "store")), str(tmp_path / "public"))
    assert b.key != a.key


def test_confidential_inputs_are_declared_not_located(tmp_path: Path) -> None:
    """PHSafe's persons and units under ``cef/phsafe/`` (not ``confidential/``): they are hashed into every
    manifest, a change is noticed, and the post-processing view cannot read them."""
    store = LocalStore(tmp_path / "store")
    raw = {"release_id": "x", "universe": "US", "store": str(tmp_path / "store"),
           "inputs": {"phsafe": "cef/phsafe/", "phsafe_geo": "public/phsafe/"},
           "products": [{"name": "phsafe", "config_text": "{}"}], "cap": {"rho": "1"},
           "rng": {"mode": "test", "seed": 1}}
    store.put("cef/phsafe/persons.csv", b"RTYPE|MAFID\n3|100000001\n")
    store.put("cef/phsafe/units.csv", b"RTYPE|MAFID\n2|100000001\n")
    store.put("public/phsafe/geo.csv", b"RTYPE|MAFID|TABBLKST\n2|100000001|01\n")
    ctx = candidate_context(parse_release_config(raw), store)
    assert ctx.layout.confidential == {"phsafe": "cef/phsafe/"}
    assert ctx.layout.public == {"phsafe_geo": "public/phsafe/"}
    hashes = ctx.confidential_hashes()
    assert set(hashes) == {"cef/phsafe/persons.csv", "cef/phsafe/units.csv"}
    post = ctx.post_store()
    with pytest.raises(ForbiddenKey):
        post.get("cef/phsafe/persons.csv")
    with pytest.raises(ForbiddenKey):
        post.get("runs/x/prepared/phsafe/anything.parquet")
    assert post.get("public/phsafe/geo.csv").startswith(b"RTYPE")
    assert "cef/phsafe/persons.csv" not in post.list("")
    store.put("cef/phsafe/persons.csv", b"RTYPE|MAFID\n3|100000002\n")
    again = candidate_context(parse_release_config(raw), store)
    assert again.confidential_hashes() != hashes  # a changed file changes every stage's key
    # an undeclared input is confidential (fail closed); a public input overlapping a confidential one is refused
    raw2 = {**raw, "inputs": {**raw["inputs"], "extra": "elsewhere/"}}
    assert "elsewhere/" in candidate_context(parse_release_config(raw2), store).layout.forbidden
    raw3 = {**raw, "inputs": {"phsafe": "cef/", "phsafe_geo": "cef/public/"}}
    with pytest.raises(InputError, match="overlaps"):
        candidate_context(parse_release_config(raw3), store).layout  # noqa: B018


def test_test_mode_only_on_synthetic_census_inputs(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    seed_inputs(store)
    store.delete("confidential/counts/manifest.json")  # inputs not marked by the synthetic census
    ctx = candidate_context(parse_release_config(release_dict(str(tmp_path / "store"))), store)
    with pytest.raises(InputError, match="test mode") as caught:
        stages.validate_stage(ctx, "counts")
    assert caught.value.column == "rng.mode"
    mark_synthetic(store, "confidential/counts/", generator_note="test")
    stages.validate_stage(ctx, "counts")
    # a file changed after the synthetic census listed it is no longer synthetic
    store.put(counts_product.PERSONS, store.get(counts_product.PERSONS) + b"01,1\n")
    with pytest.raises(InputError, match="test mode"):
        stages.validate_stage(candidate_context(parse_release_config(release_dict(str(tmp_path / "store"))),
                                                store), "counts")
    assert not store.exists("runs/r1/config.json") and not store.list("runs/r1/ledger/")


@pytest.mark.parametrize("content", [b"", b"STATE,SEX\n", b"STATE,SEX\n\n"])
def test_header_only_confidential_file_is_refused_before_freezing(tmp_path: Path, content: bytes) -> None:
    """A lost export (header only, or nothing) would be released as an all-zero census: refused, nothing frozen,
    and the same release id runs once the file is restored."""
    store, cfg = local_release(tmp_path)
    good = store.get(counts_product.PERSONS)
    store.put(counts_product.PERSONS, content)
    mark_synthetic(store, "confidential/counts/", generator_note="test")
    ctx = candidate_context(cfg, store)
    with pytest.raises(InputError, match="confidential input file") as caught:
        stages.validate_stage(ctx, "counts")
    assert caught.value.file == counts_product.PERSONS
    with pytest.raises(InputError):
        stages.plan_stage(ctx)
    assert not store.exists("runs/r1/config.json") and not store.list("runs/r1/ledger/")
    store.put(counts_product.PERSONS, good)
    mark_synthetic(store, "confidential/counts/", generator_note="test")
    ctx = candidate_context(cfg, store)
    stages.validate_stage(ctx, "counts")
    freeze_config(cfg, store)
    stages.plan_stage(ctx)
    assert store.exists("runs/r1/ledger/plan.json")


def test_a_puerto_rico_person_in_a_us_safetab_input_is_refused(tmp_path: Path) -> None:
    from tests.dag.test_products_in_dag import TOY, safetab_release
    from tests.synthetic import mark_inputs

    store, raw = safetab_release(tmp_path, "zcdp")
    store.put("confidential/safetab-p/person-records.txt", (TOY / "person-records.txt").read_bytes())  # US + PR
    mark_inputs(store, raw)
    ctx = candidate_context(parse_release_config(raw), store)
    with pytest.raises(InputError, match="release universe US") as caught:
        stages.validate_stage(ctx, "safetab-p")
    assert caught.value.column == "TABBLKST" and caught.value.row is not None


def test_validation_errors_never_echo_a_confidential_value(tmp_path: Path) -> None:
    """The corpus's duplicate-MAFID and out-of-domain cases: file, row and column named; the MAFID and the
    offending value absent from the message."""
    from tests.validation.helpers import corpus_store, release_raw, run_release

    for case, product in (("phsafe_duplicate_mafid", "phsafe"), ("phsafe_out_of_domain_cenrace", "phsafe"),
                          ("safetab_unknown_race_code", "safetab-p"), ("safetab_age_out_of_domain", "safetab-p")):
        store = corpus_store(tmp_path / case, case)
        errors: list[BaseException] = []
        assert run_release(store, release_raw(store, [product]), errors=errors) == 2
        exc = errors[0]
        assert isinstance(exc, InputError) and exc.file and exc.row, str(exc)
        header, *rows = (tmp_path / case / exc.file.rsplit("/", 1)[-1]).read_text().splitlines() \
            if (tmp_path / case / exc.file.rsplit("/", 1)[-1]).exists() else \
            store.get(next(k for k in store.list("confidential/") if k.endswith(exc.file.rsplit("/", 1)[-1]))
                      ).decode().splitlines()
        sep = "|" if "|" in header else ","
        record = rows[exc.row - 2].split(sep)
        column = header.split(sep).index(exc.column) if exc.column in header.split(sep) else None
        message = str(exc)
        if column is not None:
            assert f"{record[column]}" not in message.replace(exc.file, ""), (case, message)
        if "MAFID" in header:
            assert record[header.split(sep).index("MAFID")] not in message, (case, message)


def test_remote_copies_are_private_and_removed(tmp_path: Path) -> None:
    """Local copies of remote objects live in this process's 0700 cache as 0600 files."""

    class Remote(ObjectStore):  # any store that is not a local directory takes the download path
        def __init__(self, inner: LocalStore) -> None:
            self.inner, self.uri = inner, "remote://x"

        def put(self, key: str, data: bytes) -> str:
            return self.inner.put(key, data)

        def put_if_absent(self, key: str, data: bytes) -> bool:
            return self.inner.put_if_absent(key, data)

        def get(self, key: str) -> bytes:
            return self.inner.get(key)

        def exists(self, key: str) -> bool:
            return self.inner.exists(key)

        def list(self, prefix: str = "") -> list[str]:
            return self.inner.list(prefix)

        def delete(self, key: str) -> None:
            self.inner.delete(key)

    inner = LocalStore(tmp_path / "s")
    inner.put("confidential/x/persons.csv", b"A,B\n1,2\n")
    path = local_file(Remote(inner), "confidential/x/persons.csv")
    assert path.read_bytes() == b"A,B\n1,2\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cache_dir()).st_mode) == 0o700
    assert str(os.getpid()) in cache_dir().name and path.is_relative_to(cache_dir())
