"""Acceptance rule objects: one registry of names, validation in the constructor, config round trips, and the
modality check."""

import pytest

from mmspec.core.acceptance import GSD, RULES, Exact, Lantern, Typical, acceptance_from
from mmspec.options import ACCEPTANCE_RULES, acceptances


def test_every_rule_name_has_its_class_and_no_other():
    assert set(RULES) == set(ACCEPTANCE_RULES)
    assert [name for name, rule in RULES.items() if rule.lossless] == ["exact"]
    assert acceptances("image") == ("exact", "lantern", "gsd") and acceptances("text") == ("exact", "typical")


@pytest.mark.parametrize("rule", [Exact(), Lantern(k=8, delta=0.2), Lantern(lam=1.5), GSD(group_size=5),
                                  Typical(epsilon=0.2)], ids=repr)
def test_config_round_trip(rule):
    assert acceptance_from(rule.to_config()) == rule and acceptance_from(rule) is rule
    assert acceptance_from(rule.name) == type(rule)()


@pytest.mark.parametrize(("value", "error", "match"), [
    ("relaxed", ValueError, "acceptance must be one of"),
    ({"k": 3}, ValueError, "names no acceptance rule"),
    (0.5, TypeError, "must be an Acceptance"),
])
def test_bad_values_name_what_is_allowed(value, error, match):
    with pytest.raises(error, match=match):
        acceptance_from(value)


def test_a_rule_outside_its_modality_is_refused():
    with pytest.raises(ValueError, match=r"does not apply to text decoding; text takes \('exact', 'typical'\)"):
        acceptance_from(Lantern(), "text")
    with pytest.raises(ValueError, match="Typical needs epsilon"):
        Typical(epsilon=0)
