"""The text decodings: each drafter a registered decoding in a file of its own, named the way the drafters were named
when they were one decoding (`TextSpeculation(drafter=...)`, a config saved as "speculative"), and a setting a drafter
does not read refused with the drafters that read it."""

import pytest

from mmspec.core.registry import decodings
from mmspec.text.methods import TextDrafting, TextSpeculation, TreeDrafting, check_reads, drafters

CHAINS = ("model", "ngram", "layerskip", "cascade", "kangaroo", "s2d")
TREES = ("tree", "stand")


def test_each_built_in_drafter_is_a_registered_decoding_in_its_own_file():
    assert tuple(drafters()) == (*CHAINS, *TREES)
    modules = {name: cls.__module__ for name, cls in drafters().items()}
    assert len(set(modules.values())) == len(modules)  # one file each
    assert all(module.startswith("mmspec.text.methods.") for module in modules.values())
    assert all(issubclass(drafters()[name], TextDrafting) for name in CHAINS)
    assert all(issubclass(drafters()[name], TreeDrafting) for name in TREES)


@pytest.mark.parametrize("name", [*CHAINS, *TREES])
def test_the_alias_names_the_drafters_decoding(name):
    assert TextSpeculation(drafter=name) == decodings("text")[name]()


def test_a_setting_a_drafter_does_not_read_names_the_drafters_that_do():
    with pytest.raises(ValueError, match="exit_threshold applies to drafter 's2d', not 'model'"):
        TextSpeculation(drafter="model", exit_threshold=0.5)
    with pytest.raises(ValueError, match="max_ngram applies to drafter 'ngram' / 'cascade' / 'tree', not 'stand'"):
        check_reads("stand", {"max_ngram": 2})
    check_reads("ngram", {"max_ngram": 2, "acceptance": "exact"})  # read: nothing raised
    with pytest.raises(ValueError, match="drafter must be one of"):
        TextSpeculation(drafter="medusa")
