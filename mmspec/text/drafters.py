"""Text drafters of chains, for the round of `mmspec.core.speculation` (`Chain`). Each returns a
`mmspec.core.drafts.Draft`, which carries the exact law each of its tokens was sampled from.

Drafters (any transformers causal LM as a small model, self-speculative early exit, n-gram prompt lookup) all return a
`Draft`; draft-length schedules (constant, HF's +2/-1 heuristic) and the confidence stop (HF's
`assistant_confidence_threshold`, DISCO arXiv 2405.04304, without the online re-fit) decide how many tokens each row
drafts. A drafter reads the batch's rows (`mmspec.text.rows.TextRows`): the left-aligned sequences for prompt lookup,
the models' view after the prefill for a draft model, which drafts with the draft-model proposer every modality
shares (`mmspec.core.drafting.proposer.ModelProposer`).
"""

from __future__ import annotations

import dataclasses

import torch

from mmspec.adapters.causal_lm import CausalLMAdapter, as_causal_model
from mmspec.adapters.features import FeatureTap
from mmspec.adapters.static_cache import as_static_model
from mmspec.core.drafting.lengths import DraftLengthSchedule
from mmspec.core.drafting.proposer import ModelProposer
from mmspec.core.drafting.stops import ConfidenceStop, DraftStop, LearnedStop
from mmspec.core.drafts import Draft
from mmspec.core.model import Logits, require
from mmspec.core.probs import SamplingConfig, one_hot, process_logits
from mmspec.core.rng import Generators
from mmspec.core.rules.base import AcceptanceRule, rule_from
from mmspec.core.runtime.capture import weights_of
from mmspec.core.speculation import Chain
from mmspec.text.kinds import check_lookup_after, check_max_ngram
from mmspec.text.rows import TextRows


def text_law(logits: Logits, depth: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The processed law of a text token (`mmspec.core.speculation.DraftLaw`): the logits' law, wherever it is."""
    return process_logits(logits.cond, sampling)


class Drafter:
    """Base of the text drafters: `start(rows, vocab_size, capacity)` for a new batch, `select(index)` when finished
    rows leave it, `forwards` (model calls so far), `vocab_size` (None: any vocabulary), and `step(...)`: the
    round's strategy that `speculative_generate` repeats with it. `capturable`: whether its drafting holds no host
    read of its own (then a CUDA graph can replay the round); `capture_key()`: what makes two drafters' rounds
    replayable by the same graphs."""

    vocab_size: int | None = None
    forwards: int = 0
    capturable = True

    def start(self, rows: TextRows, vocab_size: int, capacity: int) -> None:
        """A new batch: `rows` after the target's prefill; the target has `vocab_size` tokens; a model's cache holds
        `capacity` slots per row."""

    def capture_key(self) -> tuple:
        """The drafter's class and settings (its models by their weights): per-batch state is left out, so the
        drafters of two calls with the same settings share their captured steps."""
        return (type(self), *(key_of(name, value) for name, value in sorted(vars(self).items())
                              if name not in ("proposer", "vocab_size")))

    def select(self, index: torch.Tensor) -> None:
        """Keep only batch rows `index` ([B'] long), in that order: finished rows left the batch."""

    def observe(self, rows: TextRows, laws: torch.Tensor | None) -> None:
        """The round's target forward ran and rows.count[b] tokens were committed to row b (trees: drawn from
        laws[b, j]; None for chains): for drafters that learn from the target or read its features."""

    def step(self, vocab_size: int, acceptance: AcceptanceRule | str,
             draft_length: int | DraftLengthSchedule | None, tree_rule: str | None, measure_ceiling: bool):
        """The round's strategy (`mmspec.core.speculation.Chain`, `Tree`) this drafter runs with those
        `speculative_generate` settings, for a target of `vocab_size` tokens; ValueError for one it does not read."""
        raise NotImplementedError


class WithDraftModel:
    """For the drafters that run a draft model: it becomes a `CausalModel` on a fixed-capacity cache for each new
    batch (`mmspec.adapters.static_cache`), is prefilled with the batch's prompts, and drafts through the proposer
    every modality shares (`mmspec.core.drafting.proposer.ModelProposer`), which counts its forwards and follows the
    rows that leave the batch. vocabulary: the ids a trimmed draft's logits stand for (`ModelDrafter`; None: all)."""

    vocabulary: torch.Tensor | None = None

    def attach(self, model) -> None:
        """model: a model adapter (a `CausalLMAdapter`, or another `CausalModel`), or a transformers causal LM (or
        an `early_exit_view` of the target), which is wrapped in one."""
        self.model = as_causal_model(model)
        self.vocab_size = self.model.vocab_size
        self.proposer: ModelProposer | None = None

    @property
    def forwards(self) -> int:
        return 0 if self.proposer is None else self.proposer.forwards

    def start(self, rows: TextRows, vocab_size: int, capacity: int) -> None:
        model = as_static_model(self.model, capacity)
        state, _ = model.prefill(rows.prompt)
        vocabulary = self.vocabulary
        self.proposer = ModelProposer(model, state, rows.batch_size, rows.tokens.device,
                                      None if vocabulary is None else vocabulary.to(rows.tokens.device),
                                      None if vocabulary is None else vocab_size)

    def select(self, index: torch.Tensor) -> None:
        self.proposer.select(index)


class ChainDrafter(Drafter):
    """Base of the drafters of chains: `propose(rows, budget [B], width, sampling, generator) -> Draft`, up to
    budget[b] tokens after row b's tokens, in a draft of `width` tokens (a host int: the step's static shape)."""

    def propose(self, rows: TextRows, budget: torch.Tensor, width: int, sampling: SamplingConfig,
                generator: Generators) -> Draft:
        raise NotImplementedError

    def step(self, vocab_size, acceptance, draft_length, tree_rule, measure_ceiling) -> Chain:
        if tree_rule is not None or measure_ceiling:
            raise ValueError("tree_rule and measure_ceiling apply to tree drafters (ModelTreeDrafter, StandDrafter, "
                             "...)")
        return Chain(self, self.schedule(draft_length), rule_from(acceptance, "text").bind(None, vocab_size), text_law)

    def schedule(self, draft_length: int | DraftLengthSchedule | None) -> DraftLengthSchedule:
        """The draft-length schedule for `speculative_generate`'s draft_length (None: 4 tokens a step)."""
        draft_length = 4 if draft_length is None else draft_length
        if isinstance(draft_length, bool) or not isinstance(draft_length, (int, DraftLengthSchedule)):
            raise TypeError(f"draft_length must be an int or a DraftLengthSchedule, got {type(draft_length).__name__}")
        return DraftLengthSchedule(draft_length) if isinstance(draft_length, int) else draft_length


class ModelDrafter(WithDraftModel, ChainDrafter):
    """Drafts autoregressively with a causal LM that shares the target's tokenizer, sampling from processed q.

    model: any transformers causal LM (or an `early_exit_view` of the target), or a `CausalModel` adapter.
    confidence_threshold: a row stops drafting after a token whose draft probability is below it (0 = never).
    acceptance_head: SpecDec++'s learned draft length (an `mmspec.models.AcceptanceHead` trained for this draft model;
    `model` a transformers causal LM): a row stops once the predicted probability that one of its drafts so far is
    rejected exceeds `stop_threshold` (None: the head's own, chosen from the costs it was trained with). vocabulary:
    VocabTrim's draft vocabulary ([|S|] long ids, `mmspec.core.drafting.vocabulary.frequent_vocabulary`; `model` a
    transformers causal LM): its LM head scores only those tokens, and drafts from its law renormalised over them.
    """

    def __init__(self, model, confidence_threshold: float = 0.0, acceptance_head=None,
                 stop_threshold: float | None = None, vocabulary: torch.Tensor | None = None):
        stop = confidence_stop(confidence_threshold)
        if confidence_threshold and acceptance_head is not None:
            raise ValueError("confidence_threshold and acceptance_head are two stop rules: give one")
        if stop_threshold is not None and acceptance_head is None:
            raise ValueError("stop_threshold applies with an acceptance_head (SpecDec++'s learned draft length)")
        if vocabulary is not None and acceptance_head is not None:
            raise ValueError("an acceptance_head reads the draft's full law: it does not take a trimmed vocabulary")
        self.stop = stop if acceptance_head is None else learned_stop(model, acceptance_head, stop_threshold)
        if vocabulary is not None:
            model = transformers_lm(model, "a draft vocabulary").trimmed(vocabulary)
        self.attach(model)
        self.vocabulary = vocabulary

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator) -> Draft:
        return self.proposer.chain(rows.seq, rows.committed, width, text_law, sampling, generator, budget,
                                   self.stop)


def confidence_stop(threshold: float) -> ConfidenceStop | None:
    """The stop after a token whose draft probability is below `threshold` (a drafter's confidence_threshold, in
    [0, 1)); None for 0, which never stops."""
    if not 0 <= threshold < 1:
        raise ValueError(f"confidence_threshold must be in [0, 1), got {threshold}")
    return ConfidenceStop(threshold) if threshold else None


def transformers_lm(model, reader: str) -> CausalLMAdapter:
    """`model` as the `CausalLMAdapter` of a transformers causal LM, which `reader` needs (TypeError otherwise)."""
    model = as_causal_model(model)
    if not isinstance(model, CausalLMAdapter):
        raise TypeError(f"{reader} reads a transformers draft model, got {type(model).__name__}")
    return model


def learned_stop(model, head, threshold: float | None) -> LearnedStop:
    """SpecDec++'s stop for draft `model` (a transformers causal LM or its adapter): `head` reads the input of its
    LM head and its embedding of each drafted token; threshold None: the head's own
    (`AcceptanceHead.stop_threshold`)."""
    model = transformers_lm(model, "an acceptance_head")
    if head.config.feature_size != model.feature_size:
        raise ValueError(f"acceptance_head reads features of width {head.config.feature_size}; the draft model's "
                         f"are {model.feature_size} wide")
    embedding, lm_head = model.feature_readout()
    tap = FeatureTap.of(lm_head)
    return LearnedStop(head, lambda: tap.feature, embedding, threshold)


def exits_of(target, drafter: str):
    """The target as a model adapter with the "exits" capability (`CausalLMAdapter.exit_model`)."""
    model = as_causal_model(target)
    require(model, {"exits"}, drafter)
    return model


class LayerSkipDrafter(ModelDrafter):
    """Self-speculative drafting (LayerSkip / HF `assistant_early_exit`): the target's first `exit_layer` layers."""

    def __init__(self, target, exit_layer: int, confidence_threshold: float = 0.0):
        super().__init__(exits_of(target, "LayerSkipDrafter").exit_model(exit_layer),
                         confidence_threshold=confidence_threshold)


class KangarooDrafter(ModelDrafter):
    """Kangaroo's self-speculative drafter: the target's first layers plus a trained exit adapter
    (`mmspec.models.kangaroo.KangarooAdapter`, its exit layer in its config) and the target's head (`kangaroo_view`).
    confidence_threshold: Kangaroo's double early exit, a row stops drafting after a token whose draft probability
    is below it (the paper's 0.6; 0 = never)."""

    def __init__(self, target, adapter, confidence_threshold: float = 0.0):
        super().__init__(exits_of(target, "KangarooDrafter").exit_model(None, adapter),
                         confidence_threshold=confidence_threshold)


class NGramDrafter(ChainDrafter):
    """Prompt lookup (Saxena 2023; HF `prompt_lookup_num_tokens`): copy what followed the latest earlier occurrence of
    the row's last n tokens, trying n = max_ngram down to min_ngram. Deterministic: `Draft.q` is None.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator) -> Draft:
        tokens, available = ngram_lookup(rows.tokens, rows.lengths, width, self.max_ngram, self.min_ngram)
        return Draft(tokens=tokens, lengths=torch.minimum(available, budget))


def ngram_lookup(tokens: torch.Tensor, lengths: torch.Tensor, width: int, max_ngram: int = 3,
                 min_ngram: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt lookup: what followed the latest earlier occurrence of each row's last n tokens (n = max_ngram down to
    min_ngram). tokens: [B, T] long, row b is tokens[b, :lengths[b]]. Returns (continuation [B, width] long,
    available [B] long: how many of its tokens are real, 0 where nothing matched)."""
    B, T = tokens.shape
    arange_T = torch.arange(T, device=tokens.device)
    start = torch.full((B,), -1, dtype=torch.long, device=tokens.device)  # where the copied continuation starts
    for n in range(max_ngram, min_ngram - 1, -1):
        if T < n + 1:
            continue
        suffix = tokens.gather(1, (lengths[:, None] - n + torch.arange(n, device=tokens.device)).clamp(min=0))
        windows = tokens.unfold(1, n, 1)  # [B, T - n + 1, n]
        match = (windows == suffix[:, None, :]).all(-1)
        # A match must end before the suffix itself, so at least one continuation token exists.
        match &= (arange_T[: T - n + 1] + n < lengths[:, None]) & (lengths[:, None] >= n)
        latest = torch.where(match, arange_T[: T - n + 1], -1).max(-1).values
        found = (start < 0) & (latest >= 0)
        start = torch.where(found, latest + n, start)
    index = (start[:, None] + torch.arange(width, device=tokens.device)).clamp(0, T - 1)
    available = torch.where(start >= 0, lengths - start, 0).clamp(min=0, max=width)
    return tokens.gather(1, index), available


class CascadeDrafter(ModelDrafter):
    """Cascade drafting (CS-Drafting, Chen et al. 2023) with prompt lookup under the draft model. Vertical: the draft
    model's chain, the very tokens and laws `ModelDrafter` draws from the same generator, where each forward also
    scores prompt lookup's continuation of the drafts so far and keeps it as far as the model's draws agree with it
    (`ModelProposer.cascade`), so that fewer forwards (`forwards_per_round`) draft as far. Horizontal (`lookup_after`
    < the draft length): the draft model drafts the first `lookup_after` positions, prompt lookup continues the rest,
    deterministic drafts (their law a point mass), as far as it finds a match.

    model: any transformers causal LM (or a `CausalModel` adapter) sharing the target's tokenizer; max_ngram: the
    longest n-gram the lookup matches; lookup_after: None = every position from the draft model; forwards_per_round:
    the draft model's forwards a round (a fixed number: a captured step holds them; None: the draft length, every row
    drafting its full chain, `ModelDrafter`'s very drafts; fewer: a row's draft ends where they reached, at least
    that many tokens, more where prompt lookup's continuations held)."""

    def __init__(self, model, max_ngram: int = 3, lookup_after: int | None = None,
                 forwards_per_round: int | None = None):
        super().__init__(model)
        check_max_ngram(max_ngram)
        check_lookup_after(lookup_after)
        if forwards_per_round is not None and (isinstance(forwards_per_round, bool) or not isinstance(
                forwards_per_round, int) or forwards_per_round < 1):
            raise ValueError(f"forwards_per_round must be an int >= 1 or None, got {forwards_per_round!r}")
        self.max_ngram, self.lookup_after, self.forwards_per_round = max_ngram, lookup_after, forwards_per_round

    def start(self, rows: TextRows, vocab_size: int, capacity: int) -> None:
        # a cascade forward scores up to a draft's length past the row's drafts so far
        super().start(rows, vocab_size, capacity + rows.lookahead)

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator) -> Draft:
        first = width if self.lookup_after is None else min(self.lookup_after, width)
        lookup = draft_lookup(rows, width, self.max_ngram)
        forwards = None if self.forwards_per_round is None else min(self.forwards_per_round, first)
        draft = self.proposer.cascade(rows.seq, rows.committed, first, text_law, sampling, generator, lookup,
                                      forwards=forwards)
        return looked_up_tail(draft, lookup, width, budget)


def draft_lookup(rows: TextRows, width: int, max_ngram: int):
    """Prompt lookup over each row's tokens followed by drafts of its own: lookup(drafts [B, G <= width], have [B],
    size) -> (tokens [B, size], available [B]) continuing each row's tokens and its first have[b] drafts."""
    positions = torch.arange(width, device=rows.tokens.device)

    def lookup(drafts: torch.Tensor, have: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        extended = rows.tokens.scatter(1, rows.lengths[:, None] + positions[: drafts.shape[1]], drafts)
        return ngram_lookup(extended, rows.lengths + have, size, max_ngram)

    return lookup


def tree_lookup(rows: TextRows, max_ngram: int):
    """Prompt lookup after tree nodes, `TreeLookup.propose`: propose(paths [B, F, depth], tokens [B, n]) -> (next
    [B, F] long, found [B, F] bool), what followed the latest earlier occurrence of the last n-gram of each node's row
    followed by its path (`grow_tree`'s node indices into `tokens`, -1 past the node)."""

    def propose(paths: torch.Tensor, node_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, F, depth = paths.shape
        on_path = paths >= 0
        path_tokens = node_tokens.gather(1, paths.clamp(min=0).flatten(1)).view(B, F, depth)
        positions = (rows.lengths[:, None, None] + torch.arange(depth, device=paths.device)).expand(B, F, depth)
        extended = rows.tokens[:, None].expand(B, F, -1)
        extended = extended.scatter(2, positions, torch.where(on_path, path_tokens, extended.gather(2, positions)))
        lengths = rows.lengths[:, None] + on_path.sum(-1)  # [B, F]
        following, available = ngram_lookup(extended.flatten(0, 1), lengths.flatten(), 1, max_ngram)
        return following.view(B, F), (available > 0).view(B, F)

    return propose


def looked_up_tail(draft: Draft, lookup, width: int, budget: torch.Tensor) -> Draft:
    """A horizontal cascade: `draft` (a drafter's first G positions) continued to `width` tokens by `lookup`
    (`draft_lookup`), deterministic drafts whose law is a point mass, as far as it finds a match, for the rows whose
    G positions are all drafted (a shorter row keeps its own); each row cut to its `budget` [B]."""
    first = draft.tokens.shape[1]
    if first == width:
        return Draft(draft.tokens, torch.minimum(draft.lengths, budget), draft.q)
    tail, available = lookup(draft.tokens, draft.lengths, width - first)
    point_mass = one_hot(tail, draft.q.shape[-1], draft.q.dtype)
    lengths = torch.where(draft.lengths < first, draft.lengths, first + available)
    return Draft(torch.cat([draft.tokens, tail], 1), torch.minimum(lengths, budget),
                 torch.cat([draft.q, point_mass], 1))


class NoDrafter(ChainDrafter):
    """Drafts nothing: each step scores the row's last token alone and samples the next, which is AR decoding
    through the speculative loop (its fixed-capacity cache and, on a GPU, its captured steps). It is the graphed AR
    baseline that text speedups on CUDA are measured against."""

    def propose(self, rows, budget, width, sampling, generator) -> Draft:
        return Draft(tokens=rows.tokens[:, :0], lengths=torch.zeros_like(budget))

    def schedule(self, draft_length) -> DraftLengthSchedule:
        if draft_length is not None and (isinstance(draft_length, DraftLengthSchedule) or draft_length != 0):
            raise ValueError(f"NoDrafter drafts nothing: draft_length must be None or 0, got {draft_length!r}")
        return DraftLengthSchedule.none()


def key_of(name: str, value):
    """A drafter setting as a hashable key: plain values as they are, a module by its class, depth and weights (an
    early-exit view shares the target's) and a transformers model's adapter by its module, a stop rule by its
    `capture_key`, anything else by its type."""
    if value is None or isinstance(value, (bool, int, float, str, tuple)):
        return name, value
    if isinstance(value, DraftStop):
        return name, value.capture_key()
    if type(value) is CausalLMAdapter:
        value = value.model
    if isinstance(value, torch.nn.Module):
        layers = getattr(getattr(value, "config", None), "num_hidden_layers", None)
        return name, type(value), layers, weights_of(value)
    if dataclasses.is_dataclass(value):
        return name, repr(value)
    return name, type(value), id(value)
