"""The checks the text decodings' settings (`mmspec.text.methods`) and the engine that runs them
(`mmspec.text.drafters`) share, in a module that imports nothing, so neither imports the other; and what can learn
online."""

ONLINE_DRAFTERS = ("model", "eagle", "hydra")  # what learns online: the draft LM, or the draft head of that kind


def check_max_new_tokens(max_new_tokens) -> None:
    """ValueError unless `max_new_tokens` (the new tokens per row at most) is an int >= 1."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")


def check_max_ngram(max_ngram) -> None:
    """ValueError unless `max_ngram` (the longest n-gram prompt lookup matches) is an int >= 1."""
    if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
        raise ValueError(f"max_ngram must be an int >= 1, got {max_ngram!r}")


def check_lookup_after(lookup_after) -> None:
    """ValueError unless `lookup_after` (the positions a horizontal cascade's drafter drafts) is None or an int >= 1."""
    if lookup_after is not None and (isinstance(lookup_after, bool) or not isinstance(lookup_after, int)
                                     or lookup_after < 1):
        raise ValueError(f"lookup_after must be None or an int >= 1, got {lookup_after!r}")


def check_tree_lookup(lookup_after, depth: int) -> None:
    """A tree's horizontal cascade must leave the drafter a level and prompt lookup one: 1 <= lookup_after < depth."""
    check_lookup_after(lookup_after)
    if lookup_after is not None and lookup_after >= depth:
        raise ValueError(f"lookup_after={lookup_after} must be below the tree's depth {depth}: the levels after it "
                         "are prompt lookup's")
