"""The kinds of draft head on a target's own features (`mmspec.models.heads`), named here without torch so that the
settings of the decodings that draft with them can offer the choice: a pipeline ships them as `<kind>_head`."""

HEAD_KINDS = ("eagle", "hydra")
