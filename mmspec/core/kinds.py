"""Names the decodings' settings offer, here without torch so the settings load before it (the CLI's flags come from
them): the kinds of draft head on a target's own features (`mmspec.models.heads`; a pipeline ships them as
`<kind>_head`) and the draft-length schedules (`mmspec.core.drafting.lengths`)."""

HEAD_KINDS = ("eagle", "hydra")
SCHEDULES = ("constant", "heuristic")
