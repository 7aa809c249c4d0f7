"""Error types shared across dasflow; the CLI maps them to exit codes (DESIGN.md §9)."""

from __future__ import annotations


class DasflowError(Exception):
    """Base class of every error dasflow raises on purpose (exit code 1 unless a subclass says otherwise)."""


class InputError(DasflowError, ValueError):
    """Bad input data or configuration (exit code 2).

    The message names the file, and where there is one the row (1-based, header = row 1) and the column.
    """

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None,
                 column: str | None = None) -> None:
        where = []
        if file is not None:
            where.append(f"file {file}")
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.file = file
        self.row = row
        self.column = column


class LedgerRefusal(DasflowError):
    """The privacy ledger refused a spend: over the cap, unplanned, or already spent concurrently (exit 3)."""


class IntegrityError(LedgerRefusal):
    """A stored object no longer matches the frozen chain (config → plan → commits → NMFs → manifests): tampered,
    corrupt or partly deleted. Exit code 3: nothing is drawn, derived, reported or published from it."""
