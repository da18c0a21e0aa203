"""Text drafters that draft with a head on the target's own features (EAGLE, Hydra; `mmspec.models.heads`):
`HeadDrafter` drafts chains, `HeadTreeDrafter` dynamic or fixed trees, both through the feature-head proposer every
modality shares (`mmspec.core.drafting.heads.HeadProposer`), so the chain and tree steps verify them as they verify
a draft model's.

The head reads the target's feature at every committed token: after the target's prefill, the prompt's (each token
paired with the feature before it), then each round the features of the target's last verification forward.
"""

from __future__ import annotations

import torch

from mmspec.adapters.causal_lm import as_causal_model
from mmspec.adapters.features import bind_head
from mmspec.adapters.views import module_view, trimmed_readout
from mmspec.core.drafting.heads import HeadProposer, check_draft_depth
from mmspec.core.runtime.capture import weights_of
from mmspec.core.tree_shape import TreeShape
from mmspec.core.trees import DraftTree
from mmspec.text.drafters import ChainDrafter, draft_lookup, looked_up_tail, text_law
from mmspec.text.kinds import check_lookup_after
from mmspec.text.rows import TextRows
from mmspec.text.tree_drafters import DYNAMIC_TREE, LookupAfter, TreeDrafter


class WithHead:
    """For the drafters that draft with a head: `attach(target, head)` binds it to the target, and each batch gets
    a session of the head, prefilled with the prompt's features."""

    def attach(self, target, head) -> None:
        """target: a model adapter with the "features" capability (a transformers causal LM is wrapped in one)."""
        self.tap = bind_head(head, as_causal_model(target))
        self.head = head
        self.reader = head  # what drafts: the head, or a view of it trimmed to a draft vocabulary
        self.vocabulary: torch.Tensor | None = None
        self.vocab_size = head.config.vocab_size
        self.proposer: HeadProposer | None = None

    @property
    def forwards(self) -> int:
        return 0 if self.proposer is None else self.proposer.forwards

    def capture_key(self) -> tuple:
        trimmed = None if self.vocabulary is None else tuple(self.vocabulary.tolist())
        return type(self), type(self.head), weights_of(self.head), getattr(self, "shape", None), trimmed

    def start(self, rows: TextRows, vocab_size: int, capacity: int) -> None:
        B, device = rows.batch_size, rows.tokens.device
        n = rows.offsets  # prompt tokens in the prefill: pairs (x_{j+1}, f_j) for j < n
        width = rows.prompt_width - 1
        prompt_features = self.tap.features  # [B, P, w] of the target's prefill (the property concatenates: read once)
        if width == 0:  # one-token prompts: no feature before x_0 (a zero feature stands for it)
            tokens, positions = rows.last[:, None], torch.zeros(B, 1, dtype=torch.long, device=device)
            features = prompt_features.new_zeros(B, 1, prompt_features.shape[-1])
            valid = torch.ones(B, 1, dtype=torch.bool, device=device)
        else:
            j = torch.arange(width, device=device) - (width - n)[:, None]  # right-aligned: the last pair is x_{n}
            valid = j >= 0
            tokens = rows.tokens.gather(1, (j + 1).clamp(min=0))
            features = prompt_features.gather(1, j.clamp(min=0)[..., None].expand(-1, -1, prompt_features.shape[-1]))
            positions = j + 1
        nodes = getattr(getattr(self, "shape", None), "nodes", rows.lookahead)
        session = self.reader.session(B, tokens.shape[1] + rows.seq.shape[1] + nodes + 2, B, False, device)
        session.offsets = n.clone()
        trim = () if self.vocabulary is None else (self.vocabulary.to(device), self.vocab_size)
        self.proposer = HeadProposer(session, self.tap, B, device, *trim)
        self.proposer.prefill(tokens, features, positions, valid)

    def select(self, index: torch.Tensor) -> None:
        self.proposer.select(index)

    def observe(self, rows: TextRows, laws: torch.Tensor | None) -> None:
        self.proposer.observe()


class HeadDrafter(WithHead, ChainDrafter):
    """Chains from a feature head (EAGLE: any length; Hydra: at most its number of heads), each token drawn from the
    head's processed law q. target: the transformers causal LM the head was trained on; head: an `EagleHead` or
    `HydraHead`. lookup_after: a horizontal cascade (CS-Drafting): the head drafts the first N positions, prompt
    lookup (n-grams up to `max_ngram`) the rest, point masses, as far as it finds a match (None: the head drafts
    every position). vocabulary: VocabTrim's draft vocabulary ([|S|] long ids, `frequent_vocabulary`): the head
    reads out only those rows of the target's LM head, its law renormalised over them (None: all)."""

    def __init__(self, target, head, lookup_after: int | None = None, max_ngram: int = 3,
                 vocabulary: torch.Tensor | None = None):
        check_lookup_after(lookup_after)
        self.attach(target, head)
        self.lookup_after, self.max_ngram = lookup_after, max_ngram
        if vocabulary is not None:
            self.reader = module_view(head)
            self.reader.__dict__["lm_head"] = trimmed_readout(head.lm_head, vocabulary)  # not a submodule: bound
            self.vocabulary = vocabulary

    def schedule(self, draft_length):
        schedule = super().schedule(draft_length)
        check_draft_depth(self.head, min(schedule.max_length, self.lookup_after or schedule.max_length),
                          "draft_length")
        return schedule

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator):
        if self.lookup_after is None:
            return self.proposer.chain(rows.seq, rows.committed, width, text_law, sampling, generator, budget)
        first = min(self.lookup_after, width)
        draft = self.proposer.chain(rows.seq, rows.committed, first, text_law, sampling, generator)
        return looked_up_tail(draft, draft_lookup(rows, width, self.max_ngram), width, budget)


class HeadTreeDrafter(WithHead, LookupAfter, TreeDrafter):
    """Trees from a feature head: EAGLE-2's dynamic trees by default (`shape`: any `TreeShape`, depth at most a
    Hydra head's number of heads). lookup_after: a horizontal cascade, the head's levels up to it, prompt lookup's
    after (`LookupAfter`; None: every level the head's)."""

    def __init__(self, target, head, shape: TreeShape = DYNAMIC_TREE, lookup_after: int | None = None,
                 max_ngram: int = 3):
        if not isinstance(shape, TreeShape):
            raise TypeError(f"shape must be a TreeShape, got {type(shape).__name__}")
        self.attach(target, head)
        self.shape = shape
        self.cascade(lookup_after, max_ngram)
        check_draft_depth(self.head, shape.depth, "shape.depth", "levels")

    def capture_key(self) -> tuple:
        return *super().capture_key(), self.lookup_after, self.max_ngram

    @torch.no_grad()
    def propose(self, rows, sampling, generator) -> DraftTree:
        return self.proposer.tree(rows.seq, rows.committed, self.shape, text_law, sampling, generator,
                                  self.lookup(rows))
