"""The temporary server's process (``dasflow.flows.prefect_server``): a fresh SQLite Prefect database is seeded
from the migrated template of the installed Prefect release, built by the first start on a machine; anything
else (a database already there, another database URL, a used or broken template, the switch off) leaves
Prefect's own start unchanged."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dasflow.flows import prefect_server
from dasflow.flows.prefect_server import is_template, save_template, seed, sqlite_file


def _database(path: Path, revisions: tuple[str, ...] = ("abc123",), flow_runs: int = 0) -> Path:
    """A small stand-in of a migrated Prefect database: Alembic's table and the tables a template keeps empty."""
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        con.executemany("INSERT INTO alembic_version VALUES (?)", [(r,) for r in revisions])
        for table in prefect_server._RUN_TABLES:
            con.execute(f'CREATE TABLE "{table}" (id INTEGER PRIMARY KEY)')
        con.executemany('INSERT INTO "flow_run" VALUES (?)', [(i,) for i in range(flow_runs)])
    return path


def test_only_a_plain_sqlite_file_url_is_seeded() -> None:
    assert sqlite_file("sqlite+aiosqlite:////home/op/.prefect/prefect.db") == Path("/home/op/.prefect/prefect.db")
    assert sqlite_file("sqlite:///rel/prefect.db") == Path("rel/prefect.db")
    for url in ("sqlite+aiosqlite:///:memory:", "sqlite+aiosqlite:///file:x?mode=memory&cache=shared",
                "sqlite+aiosqlite:////tmp/p.db?timeout=5", "sqlite+aiosqlite:///",
                "postgresql+asyncpg://postgres@127.0.0.1:5433/prefect", ""):
        assert sqlite_file(url) is None, url


def test_a_template_is_intact_with_one_revision_and_no_runs(tmp_path: Path) -> None:
    assert is_template(_database(tmp_path / "good.db"))
    assert not is_template(_database(tmp_path / "used.db", flow_runs=1))  # a used database is never copied
    assert not is_template(_database(tmp_path / "two.db", revisions=("a", "b")))
    assert not is_template(_database(tmp_path / "none.db", revisions=()))
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    assert not is_template(tmp_path / "junk.db")
    assert not is_template(tmp_path / "missing.db")
    with sqlite3.connect(tmp_path / "other.db") as con:
        con.execute("CREATE TABLE t (x)")
    assert not is_template(tmp_path / "other.db")


def test_seed_copies_the_template_whole_and_never_over_a_database(tmp_path: Path) -> None:
    template = _database(tmp_path / "template.db")
    db = tmp_path / "home" / "prefect.db"
    assert seed(db, template)
    assert db.read_bytes() == template.read_bytes()
    assert not seed(db, template)  # there now: left alone
    db.write_bytes(b"someone's database")
    assert not seed(db, template) and db.read_bytes() == b"someone's database"
    assert not seed(tmp_path / "b" / "prefect.db", tmp_path / "absent.db")
    assert not seed(tmp_path / "c" / "prefect.db", _database(tmp_path / "used.db", flow_runs=2))
    assert not (tmp_path / "c" / "prefect.db").exists()
    assert sorted(p.name for p in db.parent.iterdir()) == ["prefect.db"]  # no copy left aside


def test_a_database_created_meanwhile_wins_over_the_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    template = _database(tmp_path / "template.db")
    db = tmp_path / "home" / "prefect.db"
    copy = shutil.copyfile

    def copy_then_race(src: Path, dst: Path) -> Path:  # another process creates the database while we copy
        out = copy(src, dst)
        db.write_bytes(b"the other process's database")
        return out

    monkeypatch.setattr(prefect_server.shutil, "copyfile", copy_then_race)
    assert not seed(db, template)
    assert db.read_bytes() == b"the other process's database"
    assert sorted(p.name for p in db.parent.iterdir()) == ["prefect.db"]


def test_save_template_keeps_only_a_template(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "prefect-x-empty.sqlite"
    save_template(_database(tmp_path / "used.db", flow_runs=1), target)
    assert not target.exists() and not list(target.parent.iterdir())  # a used database is not kept
    save_template(_database(tmp_path / "fresh.db"), target)
    assert is_template(target)
    with sqlite3.connect(target) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # one self-contained file


_PREPARE = """
import sqlite3, sys
from dasflow.flows.prefect_server import prepare_database, template_path
from prefect.settings import get_current_settings
done = prepare_database()
print(done)
if done == "template off":
    sys.exit(0)
db = get_current_settings().server.database.connection_url.get_secret_value().split("///", 1)[1]
with sqlite3.connect(db) as con:
    print(sorted(con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")))
    print(con.execute("SELECT version_num FROM alembic_version").fetchall())
print(template_path())
"""


def _prepare(tmp_path: Path, home: str, **extra: str) -> list[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API_DATABASE", "PREFECT_SERVER_DATABASE"))}
    env |= {"PREFECT_HOME": str(tmp_path / home), "DASFLOW_CACHE_DIR": str(tmp_path / "cache")} | extra
    out = subprocess.run([sys.executable, "-c", _PREPARE], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


@pytest.mark.slow
def test_a_seeded_database_is_the_one_prefect_migrates(tmp_path: Path) -> None:
    """First fresh home: Prefect's migrations, and the template saved; second: seeded, with exactly the schema and
    Alembic revision the migrations made; switched off: migrated again."""
    first = _prepare(tmp_path, "home1")
    assert first[0] == "migrated, template saved"
    assert Path(first[3]).parent == tmp_path / "cache" and is_template(Path(first[3]))
    second = _prepare(tmp_path, "home2")
    assert second[0] == "seeded from template"
    assert second[1:3] == first[1:3] and len(first[1]) > 10_000  # same schema (every table and index), revision
    assert _prepare(tmp_path, "home3", DASFLOW_PREFECT_DB_TEMPLATE="0") == ["template off"]
    assert not (tmp_path / "home3" / "prefect.db").exists()  # Prefect's own start migrates it
