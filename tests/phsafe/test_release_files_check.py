"""PHSafe's production output check on release files (``PLUGIN.check_release_files``, R16 on bytes): the hook
the release stage calls before it writes the manifest refuses a bad file and names it as ``phsafe/<file>``."""

from __future__ import annotations

import pytest

from dasflow.cli import main
from dasflow.errors import DasflowError
from dasflow.products.phsafe import load_config
from dasflow.products.phsafe.plugin import PLUGIN
from tests.account_helpers import account_args
from tests.phsafe.builders import US_CONFIG, Person, Unit, write_csv

UNITS = [Unit([Person(40), Person(38, rel=21), Person(10, rel=25)], state="01"),
         Unit([Person(70, race=2, hisp=2)], state="02", ten=3, hht=4, hht2=9, cplt=5)]


@pytest.fixture(scope="module")
def release_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The release files of one private PHSafe run (name -> bytes, as the release stage hands them over)."""
    tmp = tmp_path_factory.mktemp("phsafe-release")
    out = tmp / "private"
    assert main(["phsafe", "private", str(US_CONFIG), str(write_csv(UNITS, tmp / "in")), str(out),
                 *account_args(tmp)]) == 0
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _edit(data: bytes, row: int, column: str, value: str) -> bytes:
    """The file with one cell replaced (``row`` counts the header as row 1)."""
    lines = data.decode().splitlines()
    header = lines[0].split("|")
    cells = lines[row - 1].split("|")
    cells[header.index(column)] = value
    lines[row - 1] = "|".join(cells)
    return ("\n".join(lines) + "\n").encode()


def _refused(files: dict[str, bytes]) -> str:
    with pytest.raises(DasflowError) as info:
        PLUGIN.check_release_files(files, load_config(US_CONFIG))
    return str(info.value)


def test_good_release_files_pass(release_files: dict[str, bytes]) -> None:
    PLUGIN.check_release_files(release_files, load_config(US_CONFIG))


@pytest.mark.parametrize(("row", "column", "value", "problem"), [
    (2, "VARIANCE", "1.0", "column VARIANCE"),
    (5, "COUNT", "1.5", "column COUNT"),
    (3, "NOISE_DISTRIBUTION", "Discrete Laplace", "column NOISE_DISTRIBUTION"),
    (4, "PH1_NUM_DATA_CELL", "9", "missing cell"),  # a cell moved out of the domain leaves its own missing
])
def test_a_tampered_ph1_num_row_is_refused_naming_the_file(release_files: dict[str, bytes], row: int,
                                                            column: str, value: str, problem: str) -> None:
    bad = {**release_files, "PH1_num.csv": _edit(release_files["PH1_num.csv"], row, column, value)}
    message = _refused(bad)
    assert message.startswith("phsafe/PH1_num.csv: ") and problem in message
    assert "dasflow-phsafe-out-" not in message  # the private temporary directory never leaks into the error


def test_a_missing_or_truncated_file_is_refused_naming_it(release_files: dict[str, bytes]) -> None:
    missing = {k: v for k, v in release_files.items() if k != "PH8_num.csv"}
    assert _refused(missing) == "phsafe/PH8_num.csv: missing output file"
    short = release_files["PH3.csv"].decode().splitlines(keepends=True)
    message = _refused({**release_files, "PH3.csv": "".join(short[:-1]).encode()})
    assert message.startswith("phsafe/PH3.csv: ") and "rows, expected" in message
