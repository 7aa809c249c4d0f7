"""The temporary Prefect API server's process: Prefect's own server (``uvicorn`` serving ``create_app``), on a
database seeded from a migrated template when the configured database is a SQLite file that does not exist yet.

A fresh Prefect home's first server start runs Prefect's ~110 Alembic migrations on an empty SQLite file
(≈ 13 of the server's ≈ 19 CPU-s start on an idle 2-core machine, BENCHMARKS.md "Demo"). For one Prefect release
that is the same empty schema every time, so the first start on a machine migrates here, before uvicorn starts,
and keeps a copy of the freshly migrated, still empty database in the user's cache (``$DASFLOW_CACHE_DIR``, else
``$XDG_CACHE_HOME/dasflow``, else ``~/.cache/dasflow``; one file per Prefect version); a later fresh Prefect home
starts from a copy of it. The server then starts exactly as Prefect's own temporary server does and runs
Prefect's migrations on start as always (``alembic upgrade head``): they find the copy at head, or upgrade it
if it is not. The template holds the schema and Alembic's revision and no rows (checked before every use);
``DASFLOW_PREFECT_DB_TEMPLATE=0`` turns the seeding off, and anything unexpected on the way (an unwritable
cache, a database URL that is not a plain SQLite file, a database already there) leaves Prefect's behaviour
unchanged.

Run as ``python -m dasflow.flows.prefect_server <uvicorn arguments>`` (:mod:`dasflow.flows.temporary_api`);
uvicorn's exit codes pass through (3: the port is taken).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import sys
from importlib.metadata import version
from pathlib import Path

#: environment switch: "0" / "false" / "no" / "off" turns the template off
TEMPLATE_SWITCH = "DASFLOW_PREFECT_DB_TEMPLATE"
#: tables that must be empty in a template (a used database is never copied into a fresh home)
_RUN_TABLES = ("flow", "flow_run", "task_run", "deployment", "log", "artifact", "block_document")


def template_path() -> Path:
    """The cached template for the installed Prefect release."""
    base = os.environ.get("DASFLOW_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "dasflow")
    return Path(base) / f"prefect-{version('prefect')}-empty.sqlite"


def sqlite_file(url: str) -> Path | None:
    """The file of a plain SQLite database URL (no query, not in memory); ``None`` for anything else."""
    for prefix in ("sqlite+aiosqlite:///", "sqlite:///"):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            if rest and "?" not in rest and not rest.startswith(":memory:") and not rest.startswith("file:"):
                return Path(rest)
    return None


def is_template(path: Path) -> bool:
    """``path`` is an intact SQLite database holding one Alembic revision and no flows, runs, logs or blocks."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            if con.execute("PRAGMA quick_check").fetchone() != ("ok",):
                return False
            if len(con.execute("SELECT version_num FROM alembic_version").fetchall()) != 1:
                return False
            return all(con.execute(f'SELECT count(*) FROM "{t}"').fetchone() == (0,) for t in _RUN_TABLES)
    except sqlite3.Error:
        return False


def seed(db: Path, template: Path) -> bool:
    """Create ``db`` as a copy of ``template``; ``False`` (nothing changed) when ``db`` exists or the template is
    missing or not a template. The copy appears under its name only whole (written aside, then linked, which
    refuses a database created meanwhile)."""
    if db.exists() or not template.is_file() or not is_template(template):
        return False
    db.parent.mkdir(parents=True, exist_ok=True)
    aside = db.with_name(f".{db.name}.{os.getpid()}.seed")
    try:
        shutil.copyfile(template, aside)
        os.link(aside, db)
    except FileExistsError:
        return False
    finally:
        aside.unlink(missing_ok=True)
    return True


def save_template(db: Path, template: Path) -> None:
    """Keep a consistent copy of the freshly migrated ``db`` (SQLite's backup API, safe beside a WAL) as the
    template: written aside, checked, then renamed into place (a concurrent first start writes the same)."""
    template.parent.mkdir(parents=True, exist_ok=True)
    aside = template.with_name(f".{template.name}.{os.getpid()}.tmp")
    try:
        with contextlib.closing(sqlite3.connect(db)) as src, contextlib.closing(sqlite3.connect(aside)) as dst:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
        if is_template(aside):
            os.replace(aside, template)
    finally:
        aside.unlink(missing_ok=True)


def prepare_database() -> str:
    """Seed or migrate the configured database before the server starts (module docstring); what was done."""
    value = os.environ.get(TEMPLATE_SWITCH, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "template off"
    import asyncio

    from prefect.settings import get_current_settings

    settings = get_current_settings().server.database
    db = sqlite_file(settings.connection_url.get_secret_value() if settings.connection_url else "")
    if db is None or not settings.migrate_on_start or db.exists():
        return "not a fresh SQLite database"
    template = template_path()
    if seed(db, template):
        return "seeded from template"
    from prefect.server.database import provide_database_interface

    asyncio.run(provide_database_interface().create_db())  # Prefect's migrations, as its server runs them
    save_template(db, template)
    return "migrated, template saved"


def main(argv: list[str]) -> None:
    """Prepare the database (never fatal: on any failure Prefect's own start migrates), then uvicorn."""
    with contextlib.suppress(Exception):  # an optimisation only: the server's own start does the migrations
        prepare_database()
    import uvicorn

    uvicorn.main(args=argv, prog_name="uvicorn")


if __name__ == "__main__":
    main(sys.argv[1:])
