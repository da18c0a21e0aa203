"""The names of the text drafters and draft-length schedules, in a module that imports nothing, so the text decodings'
settings (`mmspec.text.methods`) and the engine that runs them (`mmspec.text.drafters`) share them without importing
each other."""

# the drafters of chains: a draft LM, prompt lookup, an early exit, the draft LM over prompt lookup (a cascade), an
# early exit with a trained adapter (Kangaroo)
CHAIN_DRAFTERS = ("model", "ngram", "layerskip", "cascade", "kangaroo")
TREE_DRAFTERS = ("tree", "stand")  # ... and of trees: the draft LM's tree, STAND's n-gram memory
DRAFTERS = (*CHAIN_DRAFTERS, *TREE_DRAFTERS)
WITH_DRAFT_MODEL = ("model", "cascade", "tree")  # the drafters that run a draft LM
SCHEDULES = ("constant", "heuristic")  # draft length schedules
LEARNED = "learned"  # ... and SpecDec++'s learned draft length (a stop rule of the draft model, not a schedule)
ONLINE_DRAFTERS = ("model", "eagle", "hydra")  # what learns online: the draft LM, or the draft head of that kind
