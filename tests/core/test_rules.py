"""Acceptance rules: one registry of names, validation in the constructor from the fields' settings, config round
trips, the modality check, and the rules' flat spellings."""

import pytest

from mmspec.core.component import acceptance_from, rule_settings
from mmspec.core.registry import rules
from mmspec.core.rules import GSD, Exact, Lantern, Typical, rule_from


def test_every_rule_is_registered_with_its_modalities():
    from mmspec.continuous.paper import Paper

    assert set(rules()) >= {"exact", "lantern", "gsd", "typical", "judge", "paper"} and rules()["paper"] is Paper
    assert [name for name, rule in rules().items() if rule.lossless] == ["exact"]
    assert tuple(rules("image")) == ("exact", "gsd", "lantern")
    assert tuple(rules("text")) == ("exact", "judge", "typical")


@pytest.mark.parametrize("rule", [Exact(), Lantern(k=8, delta=0.2), Lantern(lam=1.5), GSD(group_size=5),
                                  Typical(epsilon=0.2)], ids=repr)
def test_config_round_trip(rule):
    assert rule_from(rule.to_config()) == rule and rule_from(rule) is rule
    assert rule_from(rule.name) == type(rule)()


@pytest.mark.parametrize(("value", "error", "match"), [
    ("relaxed", ValueError, "acceptance must be one of"),
    ({"k": 3}, ValueError, "names no acceptance rule"),
    (0.5, TypeError, "must be an AcceptanceRule"),
])
def test_bad_values_name_what_is_allowed(value, error, match):
    with pytest.raises(error, match=match):
        rule_from(value)


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: Typical(epsilon=0), ValueError, r"epsilon must be in \(0, 1\], got 0"),
    (lambda: Lantern(delta=1.5), ValueError, r"delta must be in \[0, 1\], got 1.5"),
    (lambda: Lantern(k=2.5), TypeError, "k must be an int, got float"),
    (lambda: GSD(group_size=0), ValueError, "group_size must be >= 1, got 0"),
])
def test_settings_are_checked_from_their_fields(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_rule_outside_its_modality_is_refused():
    with pytest.raises(ValueError,
                       match=r"does not apply to text decoding; text takes \('exact', 'judge', 'typical'\)"):
        rule_from(Lantern(), "text")


def test_flat_spellings_name_the_rule_they_belong_to():
    assert rule_settings("image")["lantern_delta"] == ("lantern", "delta")
    assert rule_settings("text") == {"judge_threshold": ("judge", "threshold"),
                                     "typical_epsilon": ("typical", "epsilon"), "typical_delta": ("typical", "delta")}
    assert acceptance_from("image", "lantern", lantern_k=8, lantern_delta=0.2) == Lantern(k=8, delta=0.2)
    assert acceptance_from("image") is None and acceptance_from("image", "gsd") == GSD()
    with pytest.raises(ValueError, match=r"\['lantern_delta'\] only apply to acceptance='lantern', got "
                                         r"acceptance='exact'"):
        acceptance_from("image", lantern_delta=0.2)
    with pytest.raises(ValueError, match="not both"):
        acceptance_from("image", Lantern(k=3), lantern_delta=0.2)


def test_lantern_and_gsd_refuse_temperature_zero_before_any_model_loads():
    for rule in (Lantern(), GSD()):
        with pytest.raises(ValueError, match="temperature=0"):
            rule.check_sampling(0.0)
    Exact().check_sampling(0.0)
