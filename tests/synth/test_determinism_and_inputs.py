"""Determinism by seed (per-state SHA-256 seeds: a state does not depend on the other states generated), bad
input failing before anything is written, interrupted runs, and the ``dasflow synth`` command."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dasflow import synth
from dasflow.cli import main
from dasflow.errors import InputError
from dasflow.synth.seeding import derive_seed
from dasflow.synth.writers import ParquetWriter


def _hashes(m: synth.Manifest, prefix: str = "") -> dict[str, str]:
    return {f["path"]: f["sha256"] for f in m.files if f["path"].startswith(prefix)}


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = synth.generate(tmp_path / "a", 30_000, 9, states="44,72", formats=("parquet", "phsafe", "safetab_p"))
    b = synth.generate(tmp_path / "b", 30_000, 9, states="44,72", formats=("parquet", "phsafe", "safetab_p"))
    c = synth.generate(tmp_path / "c", 30_000, 10, states="44,72", formats=("parquet",))
    assert _hashes(a) == _hashes(b)
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert _hashes(a, "parquet/persons") != _hashes(c, "parquet/persons")


def test_state_independent_of_other_states(tmp_path: Path) -> None:
    """State 44 generated alongside 72 and 06, or alone with the same size, gives the same bytes."""
    split = synth.apportion(400_000, ["06", "44", "72"])
    a = synth.generate(tmp_path / "a", 400_000, 3, states=["06", "44", "72"], formats=("parquet",))
    b = synth.generate(tmp_path / "b", split["44"], 3, states=["44"], formats=("parquet",))
    ha = {k: v for k, v in _hashes(a).items() if "/44/" in k}
    assert ha and ha == _hashes(b)
    sd = synth.generate_state("44", split["44"], 3)
    assert len(sd.persons()) == split["44"]
    on_disk = pd.read_parquet(tmp_path / "b" / "parquet" / "persons" / "44")
    pd.testing.assert_frame_equal(on_disk, sd.persons(), check_dtype=False)


def test_seed_derivation() -> None:
    assert derive_seed(1, "06") != derive_seed(1, "72") != derive_seed(2, "06")
    assert derive_seed(1, "06", "chunk", 0) == derive_seed(1, "06", "chunk", 0)
    assert derive_seed(1, "1", "2") != derive_seed(1, "12")


def test_in_memory_frames_match_state_generation() -> None:
    p, u, g = synth.generate_frames(20_000, 4, states="11,44")
    split = synth.apportion(20_000, ["11", "44"])
    sd = synth.generate_state("44", split["44"], 4)
    p44 = p[p["TABBLKST"] == "44"].reset_index(drop=True)
    assert p44.equals(sd.persons())
    assert len(u) == len(g) and set(g["MAFID"]) == set(u["MAFID"])


def test_mafid_ranges_disjoint() -> None:
    ranges = sorted(synth.mafid_range(s) for s in synth.parse_states(None))
    assert ranges[0][0] + 1 >= 100_000_001
    for (lo, cap), (lo2, _) in itertools.pairwise(ranges):
        assert lo + cap <= lo2
    lo, cap = ranges[-1]
    assert lo + cap <= 899_999_999


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"persons": -5}, "positive"),
        ({"persons": 0}, "positive"),
        ({"states": "06,99"}, "unknown state"),
        ({"states": "03"}, "unknown state"),
        ({"states": "06,06"}, "duplicate"),
        ({"states": ""}, "no state"),
        ({"formats": ("xml",)}, "unknown output format"),
        ({"seed": -1}, "seed"),
        ({"persons": 5_000_000_000}, "MAFID range"),
    ],
)
def test_bad_input_fails_before_writing(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"persons": 1000, "seed": 1, "states": "44", "formats": ("parquet",)}
    args.update(kwargs)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=message):
        synth.generate(out, **args)
    assert not out.exists()


def test_disk_space_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Usage:
        free = 10_000_000

    monkeypatch.setattr("dasflow.synth.dataset.shutil.disk_usage", lambda _p: Usage())
    out = tmp_path / "out"
    with pytest.raises(InputError, match="not enough disk space"):
        synth.generate(out, 331_000_000, 1, formats=("parquet", "phsafe"))
    assert not out.exists()
    assert synth.estimate_bytes(331_000_000, ("parquet",)) > 331_000_000 * 10


def test_existing_dataset_refused(tmp_path: Path) -> None:
    synth.generate(tmp_path / "d", 2000, 1, states="44")
    with pytest.raises(InputError, match="already holds"):
        synth.generate(tmp_path / "d", 2000, 1, states="44")


def test_leftover_format_directory_refused(tmp_path: Path) -> None:
    (tmp_path / "d" / "parquet").mkdir(parents=True)
    with pytest.raises(InputError, match="interrupted run"):
        synth.generate(tmp_path / "d", 2000, 1, states="44")
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_interrupted_run_leaves_no_complete_looking_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = ParquetWriter.write_chunk

    def boom(self: ParquetWriter, *a: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real(self, *a)

    monkeypatch.setattr(ParquetWriter, "write_chunk", boom)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        synth.generate(out, 50_000, 1, states="11,44,72", chunk_persons=5000)
    assert not (out / "manifest.json").exists()
    assert not (out / "parquet").exists()
    assert not list(out.glob(".synth-staging-*"))


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c"
    assert (
        main(
            [
                "synth",
                "--persons",
                "3000",
                "--states",
                "44,72",
                "--seed",
                "5",
                "--out",
                str(out),
                "--format",
                "census",
            ]
        )
        == 0
    )
    assert (out / "phsafe" / "persons.csv").exists() and (out / "safetab_p" / "GRF-C.txt").exists()
    assert (out / "manifest.json").exists()
    assert "3,000 persons" in capsys.readouterr().out
    assert main(["synth", "--persons", "3000", "--states", "44,99", "--seed", "5", "--out", str(tmp_path / "bad")]) == 2
    assert "unknown state" in capsys.readouterr().err
    assert main(["synth", "--persons", "-1", "--seed", "5", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()
    assert main(["synth", "--persons", "2000", "--states", "11", "--seed", "5", "--out", str(tmp_path / "p")]) == 0
    assert sorted(p.name for p in (tmp_path / "p" / "parquet").iterdir()) == [
        "geo",
        "grfc",
        "persons",
        "units",
    ]
