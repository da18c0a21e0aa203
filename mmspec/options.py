"""The names users choose between — decodings, their options, text drafters — in a module that imports nothing,
so `mmspec --help` and the CLI's checks of its arguments answer before torch loads. The modules that implement the
methods import their names from here."""

IMAGE_DECODINGS = ("auto", "sjd", "draft", "ar")  # "auto": the fastest exact one for the device (mmspec.image.policy)
INITS = ("random", "horizontal", "vertical")  # SJD: how positions no window has reached are drafted
COUPLINGS = ("none", "maximal", "gumbel")  # SJD: how drafts are redrafted between iterations
ACCEPTANCES = ("exact", "lantern")  # image acceptance rules; "lantern" is lossy
TEXT_METHODS = ("model", "ngram", "layerskip", "ar")  # drafters, and "ar" for the plain target
TEXT_ACCEPTANCES = ("exact", "typical")  # text acceptance rules; "typical" is lossy
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")  # what `mmspec generate --out` writes
VIDEO_EXTENSIONS = (".gif", ".mp4")  # what `mmspec video --out` writes; mp4 needs the [video] extra
