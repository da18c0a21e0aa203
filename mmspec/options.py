"""The names users choose between — decodings, their options, text drafters — in a module that imports nothing,
so `mmspec --help` and the CLI's checks of its arguments answer before torch loads. The modules that implement the
methods import their names from here."""

# "auto": the fastest exact one for the device (mmspec.image.policy); "pjd" is lossy (parallel rows)
IMAGE_DECODINGS = ("auto", "sjd", "draft", "pjd", "ar")
INITS = ("random", "horizontal", "vertical", "lookahead")  # SJD: how positions no window has reached are drafted
COUPLINGS = ("none", "maximal", "gumbel")  # SJD: how drafts are redrafted between iterations
# every acceptance rule by name -> the decodings that take it (the rule objects: mmspec.core.acceptance); only
# "exact" is lossless
ACCEPTANCE_RULES = {"exact": ("image", "text", "continuous"), "lantern": ("image",), "gsd": ("image",),
                    "typical": ("text",), "paper": ("continuous",)}
CHAIN_DRAFTERS = ("model", "ngram", "layerskip")  # TextSpeculation's drafters of chains
TREE_DRAFTERS = ("tree", "stand")  # ... and of trees: the draft model's full tree, STAND's n-gram memory
TEXT_DRAFTERS = (*CHAIN_DRAFTERS, *TREE_DRAFTERS)  # what drafts for TextSpeculation
TEXT_METHODS = (*TEXT_DRAFTERS, "ar")  # what `mmspec text --method` names: a drafter, or "ar" for the plain target
SCHEDULES = ("constant", "heuristic")  # text draft length schedules
# TextSpeculation's settings that only some drafters read -> those drafters (the others read all of them)
DRAFTER_SETTINGS = {"confidence_threshold": ("model", "layerskip"), "exit_layer": ("layerskip",),
                    "max_ngram": ("ngram",), "draft_length": CHAIN_DRAFTERS, "schedule": CHAIN_DRAFTERS,
                    "tree_depth": ("tree",), "tree_branching": ("tree",), "tree_rates": ("tree",),
                    "tree_nodes": ("tree",)}


def acceptances(modality: str) -> tuple[str, ...]:
    """The acceptance rules a modality's decodings take ("image", "text", "continuous")."""
    return tuple(name for name, modalities in ACCEPTANCE_RULES.items() if modality in modalities)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")  # what `mmspec generate --out` writes
VIDEO_EXTENSIONS = (".gif", ".mp4")  # what `mmspec video --out` writes; mp4 needs the [video] extra
