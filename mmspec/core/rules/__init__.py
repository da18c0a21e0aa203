"""Acceptance rules, one file each, registered by name (`mmspec.core.registry.rules()`): the exact rule, LANTERN and
GSD's relaxed rules for images, Medusa's typical acceptance and judge decoding for text. A rule of one modality's own
lives with it (CSpD's released rule: `mmspec.continuous.paper`). Importing this package registers these; nothing here
imports torch at import time."""

from mmspec.core.rules import exact, gsd, judge, lantern, typical  # noqa: F401  registers the built-in rules
from mmspec.core.rules.base import AcceptanceRule, TokenTest, rule_from
from mmspec.core.rules.exact import Exact
from mmspec.core.rules.gsd import GSD
from mmspec.core.rules.judge import Judge
from mmspec.core.rules.lantern import Lantern
from mmspec.core.rules.typical import Typical

__all__ = ["GSD", "AcceptanceRule", "Exact", "Judge", "Lantern", "TokenTest", "Typical", "rule_from"]
