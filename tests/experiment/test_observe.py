"""Per-cell comparison: truth join, geolevels and the MOE stated for each published cell."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dasflow.experiment.runner import TruthIndex, geolevel_of, observe, stated_moe, stated_moes
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.release.accuracy import Z90


def _spec(level: str, noise: int, mech: str = "discrete_gaussian") -> MeasurementSpec:
    return MeasurementSpec(product="p", key=f"k/{level}/{noise}", level=level, privacy_defn="zcdp",
                           mechanism=mech, budget=Fraction(1), sensitivity=Fraction(1),  # type: ignore[arg-type]
                           noise=Fraction(noise), cells=1, variance=Fraction(noise))


def test_stated_moe_only_where_a_level_has_one() -> None:
    moes = stated_moes([_spec("nation", 3), _spec("state", 153), _spec("(STATE, 1)", 9), _spec("(STATE, 2)", 4),
                        _spec("usa_*", 5), _spec("usa_A-G", 5), _spec("block", 2), _spec("block_group", 2)])
    assert stated_moe("nation", moes) == accounting.dgauss_moe_exact(3, Fraction(9, 10))
    assert stated_moe("USA", moes) == accounting.dgauss_moe_exact(5, Fraction(9, 10))   # usa_* and usa_A-G
    assert np.isnan(stated_moe("STATE", moes))     # state, (STATE, 1), (STATE, 2): 153, 9, 4 differ
    assert np.isnan(stated_moe("county", moes))    # no key at that level
    assert stated_moe("block_group", moes) == accounting.dgauss_moe_exact(2, Fraction(9, 10))


def test_geolevel_from_region_type_or_file_name() -> None:
    frame = pd.DataFrame({"REGION_TYPE": ["STATE", "USA"]})
    assert list(geolevel_of("PH1_num.csv", "phsafe", frame)) == ["STATE", "USA"]
    assert geolevel_of("groupsize_nation.csv", "groupsize", pd.DataFrame()) == "nation"
    assert geolevel_of("topdown_block_group.csv", "topdown", pd.DataFrame()) == "block_group"
    assert geolevel_of("state.csv", "counts", pd.DataFrame()) == "all"


def test_observe_joins_on_keys_and_uses_published_variance_first() -> None:
    truth = pd.DataFrame({"STATE": ["01", "02", "06"], "SIZE": [1, 1, 2], "COUNT": [10, 0, 7]})
    published = pd.DataFrame({"STATE": ["06", "01", "99"], "SIZE": [2, 1, 1], "COUNT": [9, 4, 1],
                              "VARIANCE": [4.0, 1.0, 1.0]})
    index = TruthIndex(truth, ["STATE", "SIZE"], published)
    obs = observe("groupsize_state.csv", "groupsize", published, index, {"state": {3}})
    assert list(obs["TRUE"]) == [7, 10] and list(obs["ERROR"]) == [2, -6]      # "99" has no truth: dropped
    assert list(obs["MOE90"]) == pytest.approx([Z90 * 2, Z90 * 1])
    no_variance = published.drop(columns="VARIANCE")
    obs = observe("groupsize_state.csv", "groupsize", no_variance, index, {"state": {3}})
    assert list(obs["MOE90"]) == [3.0, 3.0] and set(obs["geolevel"]) == {"state"}
    obs = observe("groupsize_county.csv", "groupsize", no_variance, index, {"state": {3}})
    assert np.isnan(obs["MOE90"]).all()                                        # nothing stated for county


def test_keys_compared_as_text_when_dtypes_differ() -> None:
    truth = pd.DataFrame({"SEX": [1, 2], "COUNT": [5, 6]})
    published = pd.DataFrame({"SEX": ["2", "1"], "ESTIMATE": [6.5, 4.0]})
    obs = observe("t.csv", "p", published, TruthIndex(truth, ["SEX"], published), {})
    assert list(obs["TRUE"]) == [6, 5] and list(obs["ERROR"]) == [0.5, -1.0]
    with pytest.raises(ValueError, match="not unique"):
        TruthIndex(pd.DataFrame({"SEX": [1, 1], "COUNT": [1, 2]}), ["SEX"], published)
