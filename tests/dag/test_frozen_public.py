"""Public inputs and the stored TopDown spine are frozen with the plan.

The plan stage records the SHA-256 of every public input and stores each product's derived public objects
(TopDown's spine) with their SHA-256 in ``plan.json``. Every later stage, in any process, reads them only as
frozen (``io.store.FrozenStore``): a changed, added or removed public file and an edited stored spine are refused
with ``IntegrityError`` naming the object, and no later process builds the spine again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dasflow.config import parse_release_config
from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import ForbiddenKey, FrozenStore, LocalStore, sha256_bytes
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config, open_run
from dasflow.products.topdown import spine as spine_module
from dasflow.release.stage import release_stage
from tests.dag.helpers import release_files, topdown_release

RID = "frozen"
SPINE_KEY = f"runs/{RID}/derived/topdown/spine.npz"
GRFC_KEY = "public/topdown/GRF-C.txt"


def _validated(tmp: Path, *, plan: bool) -> Path:
    """A TopDown release validated (and planned), nothing measured."""
    ctx = freeze_config(parse_release_config(topdown_release(tmp, RID)), LocalStore(tmp / "store"))
    for p in ctx.config.products:
        stages.validate_stage(ctx, p.name)
    if plan:
        stages.plan_stage(ctx)
    return tmp / "store"


@pytest.fixture(scope="module")
def planned_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TopDown release validated and planned (nothing measured), shared read-only by the tests."""
    return _validated(tmp_path_factory.mktemp("frozen"), plan=True)


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / "store"
    shutil.copytree(src, dst)
    return dst


def _no_rebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a spine in this process fails: every stage must load the stored one."""
    monkeypatch.setattr(spine_module, "_BUILT", {})

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the spine was built again instead of loaded from the store")

    monkeypatch.setattr(spine_module, "_build", refuse)


def test_the_plan_freezes_every_public_input_and_the_stored_spine(planned_store: Path) -> None:
    store = LocalStore(planned_store)
    plan = json.loads(store.get(f"runs/{RID}/ledger/plan.json"))
    public = plan["public"]
    assert set(public["inputs"]) == {f"public/topdown/{n}" for n in ("GRF-C.txt", "block_facts.csv",
                                                                      "invariants.json")}
    assert all(public["inputs"][k] == store.sha256(k) for k in public["inputs"])
    assert public["derived"] == {SPINE_KEY: store.sha256(SPINE_KEY)}
    assert not any("confidential" in k for k in public["inputs"])


def test_later_processes_load_the_stored_spine_and_release_the_same_bytes(planned_store: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stage in a fresh context with spine building disabled gives the release a single process gives
    (where the plan stage's own spine is reused)."""
    one = _copy(planned_store, tmp_path / "one")
    ctx = open_run(RID, str(one))
    for stage in (stages.preprocess_stage, stages.measure_stage, stages.postprocess_stage):
        stage(ctx, "topdown")
    release_stage(ctx)
    many = _copy(planned_store, tmp_path / "many")
    _no_rebuild(monkeypatch)
    for stage in (stages.preprocess_stage, stages.measure_stage, stages.postprocess_stage):
        stage(open_run(RID, str(many)), "topdown")
    release_stage(open_run(RID, str(many)))
    stages.plan_stage(open_run(RID, str(many)))  # a resumed plan stage reuses the frozen spine too
    assert release_files(one, RID) == release_files(many, RID)
    cert = release_files(many, RID)["CERTIFICATE.md"].decode()
    assert sha256_bytes((many / GRFC_KEY).read_bytes()) in cert  # the certificate lists the frozen digests


@pytest.mark.parametrize("edit", ["changed", "added", "removed"])
def test_a_public_input_edited_after_the_freeze_is_refused(planned_store: Path, tmp_path: Path, edit: str) -> None:
    store_dir = _copy(planned_store, tmp_path)
    if edit == "changed":  # one block moved to another tract: same size, same columns
        text = (store_dir / GRFC_KEY).read_text().splitlines(keepends=True)
        text[1] = text[1].replace("|", "|9", 1)
        (store_dir / GRFC_KEY).write_text("".join(text))
        with pytest.raises(IntegrityError, match=r"GRF-C\.txt: changed since the plan froze it"):
            stages.preprocess_stage(open_run(RID, str(store_dir)), "topdown")
    elif edit == "added":
        (store_dir / "public/topdown/extra.csv").write_text("a\n1\n")
    else:
        (store_dir / "public/topdown/block_facts.csv").unlink()
    with pytest.raises(IntegrityError, match=f"public input {edit} since the plan was frozen"):
        stages.plan_stage(open_run(RID, str(store_dir)))


def test_an_edited_stored_spine_is_refused(planned_store: Path, tmp_path: Path) -> None:
    store_dir = _copy(planned_store, tmp_path)
    data = bytearray((store_dir / SPINE_KEY).read_bytes())
    data[len(data) // 2] ^= 1
    (store_dir / SPINE_KEY).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"spine\.npz: changed since the plan froze it"):
        stages.preprocess_stage(open_run(RID, str(store_dir)), "topdown")
    (store_dir / SPINE_KEY).unlink()
    with pytest.raises(IntegrityError, match=r"spine\.npz: frozen with the plan but no longer in the store"):
        stages.postprocess_stage(open_run(RID, str(store_dir)), "topdown")


def test_a_plan_frozen_without_public_digests_is_refused(planned_store: Path, tmp_path: Path) -> None:
    store_dir = _copy(planned_store, tmp_path)
    key = store_dir / f"runs/{RID}/ledger/plan.json"
    plan = json.loads(key.read_text())
    del plan["public"]
    key.write_text(json.dumps(plan, sort_keys=True, indent=1) + "\n")
    with pytest.raises(IntegrityError, match="records no public-input digests"):
        stages.preprocess_stage(open_run(RID, str(store_dir)), "topdown")


def test_frozen_store_view(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("pub/a", b"A")
    store.put("pub/b", b"B")
    store.put("other/c", b"C")
    view = FrozenStore(store, {"pub/a": sha256_bytes(b"A"), "pub/b": sha256_bytes(b"b")}, ["pub/"])
    assert view.get("pub/a") == b"A" and view.reader("pub/a").read() == b"A" and view.head("pub/a", 0) == b""
    assert view.sha256("pub/a") == sha256_bytes(b"A") and view.get("other/c") == b"C"
    with pytest.raises(IntegrityError, match="pub/b: changed since the plan froze it"):
        view.get("pub/b")
    store.put("pub/new", b"N")
    with pytest.raises(IntegrityError, match="pub/new: not among the inputs frozen"):
        view.sha256("pub/new")
    with pytest.raises(ForbiddenKey):
        view.put("pub/a", b"x")
    with pytest.raises(ForbiddenKey):
        view.delete("pub/a")
    view.put("other/d", b"D")
    assert sorted(view.list("pub/")) == ["pub/a", "pub/b", "pub/new"]
    assert view.exists("pub/a") and view.exists("pub/new") and not view.exists("pub/never")
    store.delete("pub/a")  # a frozen object deleted: never read as an absent optional input
    for read in (lambda: view.exists("pub/a"), lambda: view.list("pub/"), lambda: view.get("pub/a")):
        with pytest.raises(IntegrityError, match="pub/a: frozen with the plan but no longer in the store"):
            read()


def test_deleted_optional_block_facts_are_refused_not_skipped(planned_store: Path, tmp_path: Path) -> None:
    """TopDown's block facts are optional when structural zeros are off: deleted after the freeze, they are an
    integrity error, not an absent file."""
    store_dir = _copy(planned_store, tmp_path)
    (store_dir / "public/topdown/block_facts.csv").unlink()
    with pytest.raises(IntegrityError, match=r"block_facts\.csv: frozen with the plan but no longer in the store"):
        stages.preprocess_stage(open_run(RID, str(store_dir)), "topdown")


VALIDATED_SPINE = f"runs/{RID}/validation/derived/topdown/spine.npz"


@pytest.fixture(scope="module")
def validated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same TopDown release validated only (nothing planned), shared read-only by the tests."""
    return _validated(tmp_path_factory.mktemp("validated"), plan=False)


def _plan_in_a_new_process(store_dir: Path) -> Path:
    """The plan stage as a process that did not validate runs it (a fresh context; no spine built here yet)."""
    raw = json.loads((store_dir / f"runs/{RID}/config.json").read_text())
    stages.plan_stage(freeze_config(parse_release_config(raw), LocalStore(store_dir)))
    return store_dir


def _built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Spines built from here on in this process (none cached), by source."""
    monkeypatch.setattr(spine_module, "_BUILT", {})
    built: list[str] = []
    build = spine_module._build

    def counted(blocks: object, cfg: object, key: str, source: str) -> object:
        built.append(source)
        return build(blocks, cfg, key, source)  # type: ignore[arg-type]

    monkeypatch.setattr(spine_module, "_build", counted)
    return built


def test_the_plan_freezes_the_spine_its_validation_stored(validated_store: Path, planned_store: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation stores the spine it built, with the digests of the public inputs it read; a plan stage in
    another process freezes those very bytes instead of building the spine again. The same bytes as a plan that
    builds it (the validation manifest's record of public inputs removed, as an older validation wrote it)."""
    store = LocalStore(validated_store)
    manifest = json.loads(store.get(f"runs/{RID}/manifests/validate/topdown.json"))
    assert manifest["outputs"][VALIDATED_SPINE] == {"sha256": store.sha256(VALIDATED_SPINE), "derived": "spine.npz"}
    assert manifest["public_inputs"] == {k: store.sha256(k) for k in store.list("public/topdown/")}
    built = _built(monkeypatch)
    reused = _plan_in_a_new_process(_copy(validated_store, tmp_path / "reused"))
    assert built == []
    frozen = json.loads((reused / f"runs/{RID}/ledger/plan.json").read_text())["public"]["derived"]
    assert frozen == {SPINE_KEY: store.sha256(VALIDATED_SPINE)}
    assert (reused / SPINE_KEY).read_bytes() == (validated_store / VALIDATED_SPINE).read_bytes()
    older = _copy(validated_store, tmp_path / "older")
    key = older / f"runs/{RID}/manifests/validate/topdown.json"
    record = json.loads(key.read_text())
    del record["public_inputs"]
    key.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")
    _plan_in_a_new_process(older)
    assert built == ["public/topdown/GRF-C.txt"]
    assert (older / SPINE_KEY).read_bytes() == (reused / SPINE_KEY).read_bytes()
    assert (planned_store / SPINE_KEY).read_bytes() == (reused / SPINE_KEY).read_bytes()


def test_a_public_input_changed_after_validation_is_planned_from_the_frozen_inputs(
        validated_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A public input whose bytes changed between validation and plan: the validation's spine is not used; the
    plan builds the spine from the inputs it freezes."""
    store_dir = _copy(validated_store, tmp_path)
    invariants = store_dir / "public/topdown/invariants.json"
    invariants.write_text(invariants.read_text() + "\n")  # same invariants, other bytes
    built = _built(monkeypatch)
    _plan_in_a_new_process(store_dir)
    assert built == ["public/topdown/GRF-C.txt"]
    frozen = json.loads((store_dir / f"runs/{RID}/ledger/plan.json").read_text())["public"]
    assert frozen["inputs"]["public/topdown/invariants.json"] == sha256_bytes(invariants.read_bytes())
    assert frozen["derived"] == {SPINE_KEY: sha256_bytes((store_dir / SPINE_KEY).read_bytes())}


def test_an_edited_validation_spine_sends_the_plan_back_to_validation(validated_store: Path,
                                                                      tmp_path: Path) -> None:
    """The spine a validation stored is one of its outputs: edited, the validation is no longer current, the
    plan refuses to freeze, and validating again replaces it."""
    store_dir = _copy(validated_store, tmp_path)
    data = bytearray((store_dir / VALIDATED_SPINE).read_bytes())
    data[len(data) // 2] ^= 1
    (store_dir / VALIDATED_SPINE).write_bytes(bytes(data))
    with pytest.raises(InputError, match="not passed validation"):
        _plan_in_a_new_process(store_dir)
    assert not (store_dir / f"runs/{RID}/ledger/plan.json").exists()
    raw = json.loads((store_dir / f"runs/{RID}/config.json").read_text())
    stages.validate_stage(freeze_config(parse_release_config(raw), LocalStore(store_dir)), "topdown")
    _plan_in_a_new_process(store_dir)
    assert (store_dir / SPINE_KEY).read_bytes() == (validated_store / VALIDATED_SPINE).read_bytes()


def test_validation_reads_the_public_inputs_it_digested(validated_store: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A public input whose bytes differ from the digest validation took of it (changed in between) is refused
    by name, before anything is derived from it."""
    store_dir = _copy(validated_store, tmp_path)
    shutil.rmtree(store_dir / f"runs/{RID}/validation")
    (store_dir / f"runs/{RID}/manifests/validate/topdown.json").unlink()
    digests = stages.public_digests_of
    monkeypatch.setattr(stages, "public_digests_of", lambda ctx, product: {
        **digests(ctx, product), GRFC_KEY: "0" * 64})
    raw = json.loads((store_dir / f"runs/{RID}/config.json").read_text())
    with pytest.raises(IntegrityError, match=r"GRF-C\.txt: changed since its validation digested it"):
        stages.validate_stage(freeze_config(parse_release_config(raw), LocalStore(store_dir)), "topdown")
    assert not (store_dir / VALIDATED_SPINE).exists()
