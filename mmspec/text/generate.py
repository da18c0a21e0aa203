"""speculative_generate: speculative decoding for any transformers causal LM, batch > 1 with ragged acceptance.

Each step: the drafter proposes up to L tokens per row (with their law q), the target scores the pending token and the
draft in one forward over L + 1 positions, the acceptance rule keeps a prefix of each row's draft and draws one more
token, and both caches roll back per row (`mmspec.text.cache`). A tree drafter proposes a `DraftTree` instead: the
target scores all its nodes in one forward with a tree mask, an exact tree rule walks it (`mmspec.core.tree_verify`)
and the cache keeps exactly the accepted path. Rows advance by their own accepted counts and stop at
their own EOS; no row waits for another. With temperature 0 the greedy rule is used, which gives token-for-token the
target's greedy output. Rows that finish (EOS or max_new_tokens) are written out and leave the batch, so the
remaining rows' steps get cheaper.
"""

from __future__ import annotations

import time

import torch

from mmspec.core.acceptance import Acceptance, acceptance_from
from mmspec.core.component import StepHook
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.rng import Generators, check_generators
from mmspec.core.stats import PhaseTimer
from mmspec.core.tree_verify import RULE_NAMES, verify_tree
from mmspec.core.verify import VerifyResult, verify
from mmspec.text.cache import RaggedCacheState, forward_tree, forward_window, keep_path, select_rows, truncate
from mmspec.text.drafters import Drafter, DraftLengthSchedule
from mmspec.text.stats import TextStats
from mmspec.text.tree_drafters import TreeDrafter


def _check_inputs(target, input_ids, attention_mask, drafter, max_new_tokens, lookahead, eos_token_id):
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise TypeError("input_ids must be a [B, T] torch.long tensor")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have at least one row and one token, got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
    if attention_mask is not None and not bool((attention_mask.sum(-1) > 0).all()):
        raise ValueError("every row of attention_mask needs at least one prompt token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not all(hasattr(drafter, m) for m in ("reset", "rollback", "select")) or not (
            hasattr(drafter, "propose") or hasattr(drafter, "propose_tree") and hasattr(drafter, "observe")):
        raise TypeError("drafter must implement the Drafter protocol (reset/propose/rollback/select) or the "
                        f"TreeDrafter protocol (reset/propose_tree/observe/rollback/select), got {type(drafter).__name__}")
    vocab = target.config.vocab_size
    if drafter.vocab_size is not None and drafter.vocab_size != vocab:
        raise ValueError(f"draft vocabulary size {drafter.vocab_size} does not match the target's {vocab}")
    context = getattr(target.config, "max_position_embeddings", None)
    if context is not None and input_ids.shape[1] + max_new_tokens + lookahead + 1 > context:
        raise ValueError(
            f"prompt length {input_ids.shape[1]} + max_new_tokens {max_new_tokens} + draft length {lookahead} + 1 "
            f"exceeds the target's context of {context} positions"
        )
    if eos_token_id is not None and not isinstance(eos_token_id, (int, list, tuple)):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {type(eos_token_id).__name__}")


def _left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt tokens of each row moved to the front of a [B, width] buffer; returns (buffer, lengths [B])."""
    mask = attention_mask.bool()
    order = (~mask).long().argsort(dim=1, stable=True)  # valid positions first, in order
    buffer = torch.zeros(input_ids.shape[0], width, dtype=torch.long, device=input_ids.device)
    buffer[:, : input_ids.shape[1]] = input_ids.gather(1, order)
    return buffer, mask.sum(-1)


def _new_ids(tokens: torch.Tensor, prompt_lengths: torch.Tensor, generated: torch.Tensor, width: int,
             pad_token_id: int) -> torch.Tensor:
    """[B, width]: the first `generated[b]` new tokens of each left-aligned row of `tokens`, then padding."""
    index = (prompt_lengths[:, None] + torch.arange(width, device=tokens.device)).clamp(max=tokens.shape[1] - 1)
    real = torch.arange(width, device=tokens.device) < generated[:, None]
    return torch.where(real, tokens.gather(1, index), pad_token_id)


def _chain_step(target, state, drafter, tokens, lengths, schedule, sampling, generator, acceptance, timer, stats):
    """Draft a chain, score it in one target forward, verify. Returns the window's tokens to commit [B, L + 1]
    (accepted drafts, then the residual / bonus token at n_accepted), the VerifyResult and the draft lengths."""
    with timer("draft"):
        draft = drafter.propose(tokens, lengths, schedule.budget, sampling, generator)
    with timer("target"):
        window = torch.cat([tokens.gather(1, (lengths - 1)[:, None]), draft.tokens], dim=1)  # [B, L + 1]
        logits = forward_window(target, state, window)
        stats.target_forwards += 1
    with timer("verify"):
        p = process_logits(logits, sampling)  # [B, L + 1, V]
        result = verify(p, draft, generator, acceptance, greedy=sampling.greedy)
        emitted = torch.cat([draft.tokens, torch.zeros_like(draft.tokens[:, :1])], 1)
        emitted = emitted.scatter(1, result.n_accepted[:, None], result.next_token[:, None])
    return emitted, result, draft.lengths


def _tree_step(target, state, drafter, tokens, lengths, sampling, generator, rule, ceiling, timer, stats):
    """Draft a tree, score all its nodes in one target forward (tree mask, depth positions), walk it, keep exactly
    the accepted path in the cache. Returns the tokens to commit [B, D + 1], a VerifyResult, the nodes drafted [B]
    and the laws the committed tokens were drawn from [B, D + 1, V] (for drafters that learn from them)."""
    with timer("draft"):
        tree = drafter.propose_tree(tokens, lengths, sampling, generator)
    with timer("target"):
        layout = tree.layout()
        N = tree.tokens.shape[1]
        window = torch.cat([tokens.gather(1, (lengths - 1)[:, None]), tree.tokens], dim=1)  # [B, N + 1]
        real = torch.cat([torch.ones_like(lengths[:, None], dtype=torch.bool), tree.real], 1)
        logits = forward_tree(target, state, window, layout.ancestors, (lengths - 1)[:, None] + layout.depth, real)
        stats.target_forwards += 1
    with timer("verify"):
        p = process_logits(logits, sampling)  # [B, N + 1, V]
        walk = verify_tree(p, tree, generator, rule, layout, ceiling, (drafter.shape.depth, drafter.shape.branching))
        n = walk.n_accepted
        on_path = walk.path >= 0
        emitted = torch.cat([window.gather(1, walk.path.clamp(min=0)), torch.zeros_like(n[:, None])], 1)
        emitted = emitted.scatter(1, n[:, None], walk.next_token[:, None])
        slots = torch.cat([torch.zeros_like(n[:, None]), walk.path.clamp(min=0)], 1)  # root, the path, then roots
        laws = p.gather(1, slots[..., None].expand(-1, -1, p.shape[-1]))
        keep_path(state, N + 1, torch.zeros_like(real).scatter_(1, slots, True))
        stats.record_tree_walk(walk.node_acceptance, walk.node_alpha_star, walk.node_children, walk.accepted_rank)
    return emitted, VerifyResult(n, walk.next_token, on_path), tree.n_nodes, laws


@torch.no_grad()
def speculative_generate(
    target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    drafter: Drafter | TreeDrafter,
    acceptance: Acceptance | str = "exact",
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    draft_length: int | DraftLengthSchedule | None = None,
    tree_rule: str | None = None,
    measure_ceiling: bool = False,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    generator: Generators = None,
    on_step: StepHook | None = None,
) -> tuple[torch.Tensor, TextStats]:
    """Generate with speculative decoding.

    target: a transformers causal LM. input_ids: [B, T] long, prompts (left or right padded).
    attention_mask: [B, T], 1 for prompt tokens (None = all). drafter: a `Drafter` that drafts chains
    (ModelDrafter, LayerSkipDrafter, NGramDrafter) or a `TreeDrafter` (ModelTreeDrafter, LayerSkipTreeDrafter,
    StandDrafter; its `TreeShape` sizes the tree). acceptance: `Exact()` (lossless) or `Typical(...)` (lossy, opt-in,
    chains only), or its name. draft_length: chains only, tokens drafted per step (default 4), or a
    `DraftLengthSchedule`. tree_rule: trees only, the exact rule that walks them (`mmspec.core.tree_verify`; default:
    the one for how the drafter draws children). measure_ceiling: trees only, also report the mean alpha* at the
    visited nodes (`stats.tree_alpha_star`, a vocabulary sort per node). generator: a torch.Generator or one per
    row.
    on_step: called after every verification step as `on_step(step, fewest new tokens of a row, tensors)` with
    tensors `"generated_ids"` ([B, max_new_tokens], each row's new tokens so far, then pad_token_id) and
    `"new_tokens"` ([B]); a true return ends every row where it stands.
    Returns (sequences, stats): sequences [B, T + N] = the prompts as given followed by the new tokens, N = the longest
    row's new tokens, rows padded with pad_token_id after their EOS (as `generate` does). `stats.acceptance_map` [B, N]
    says which verification step (1, 2, ...) committed each new token and `stats.from_draft` [B, N] whether it was an
    accepted draft token (else the target drew it: a residual or bonus token); padding is -1 / False.
    """
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    trees = hasattr(drafter, "propose_tree")
    acceptance = acceptance_from(acceptance, modality="text")
    if trees:
        if draft_length is not None:
            raise ValueError("draft_length applies to chain drafters; a tree drafter is sized by its TreeShape")
        if not acceptance.lossless:
            raise ValueError(f"acceptance={acceptance.name!r} is for chains; trees are verified by exact rules "
                             f"(tree_rule)")
        if tree_rule is not None and tree_rule not in RULE_NAMES:
            raise ValueError(f"tree_rule must be one of {sorted(RULE_NAMES)}, got {tree_rule!r}")
        schedule, lookahead = None, drafter.shape.depth
    else:
        if tree_rule is not None or measure_ceiling:
            raise ValueError("tree_rule and measure_ceiling apply to tree drafters (ModelTreeDrafter, StandDrafter, "
                             "...)")
        draft_length = 4 if draft_length is None else draft_length
        if isinstance(draft_length, bool) or not isinstance(draft_length, (int, DraftLengthSchedule)):
            raise TypeError(f"draft_length must be an int or a DraftLengthSchedule, got {type(draft_length).__name__}")
        schedule = DraftLengthSchedule(draft_length) if isinstance(draft_length, int) else draft_length
        lookahead = schedule.max_length
    _check_inputs(target, input_ids, attention_mask, drafter, max_new_tokens, lookahead, eos_token_id)
    B, T = input_ids.shape
    check_generators(generator, B)
    device = input_ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    eos = None if eos_token_id is None else torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=device)
    if pad_token_id is None:
        pad_token_id = getattr(target.generation_config, "pad_token_id", None) if hasattr(target, "generation_config") else None
    if pad_token_id is None:
        pad_token_id = 0 if eos is None else int(eos[0])

    stats = TextStats(steps=torch.zeros(B, dtype=torch.long, device=device))
    timer = PhaseTimer(stats.timings)
    start_time = time.perf_counter()
    tokens, lengths = _left_align(input_ids, attention_mask, T + max_new_tokens + lookahead + 1)
    prompt_lengths = lengths.clone()
    generated = torch.zeros(B, dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)  # batch position -> output row; finished rows leave the batch
    committed_at = torch.full_like(tokens, -1)  # verification step that committed each position
    drafted = torch.zeros_like(tokens, dtype=torch.bool)  # position holds an accepted draft token
    final_tokens, final_generated = tokens.clone(), generated.clone()
    final_committed_at, final_drafted = committed_at.clone(), drafted.clone()

    # 1. Prefill the target with all but each row's last prompt token (that one is scored with the first draft).
    state = RaggedCacheState.empty(B, device)
    with timer("target"):
        if T > 1:
            forward_window(target, state, tokens[:, : T - 1], torch.arange(T - 1, device=device) < lengths[:, None] - 1)
            stats.target_forwards += 1
            stats.prefill_forwards += 1
    if trees:
        drafter.reset(B, device, target.config.vocab_size)
    else:
        drafter.reset(B, device)
        schedule.reset(B, device)
    draft_forwards_before = getattr(drafter, "forwards", 0)

    # 2. Draft, verify, commit, roll back; rows that finish are written out and dropped from the batch.
    while True:
        if trees:
            emitted, result, drafted_nodes, laws = _tree_step(target, state, drafter, tokens, lengths, sampling,
                                                              generator, tree_rule, measure_ceiling, timer, stats)
        else:
            emitted, result, drafted_nodes = _chain_step(target, state, drafter, tokens, lengths, schedule, sampling,
                                                         generator, acceptance, timer, stats)
        window_slots = torch.arange(emitted.shape[1], device=device)
        with timer("verify"):
            n = result.n_accepted
            count = torch.minimum(n + 1, max_new_tokens - generated)
            finished = count == max_new_tokens - generated
            if eos is not None:
                is_eos = torch.isin(emitted, eos) & (window_slots < count[:, None])
                count = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, count)
                finished |= is_eos.any(-1)
            positions = lengths[:, None] + window_slots
            keep_old = window_slots >= count[:, None]
            tokens.scatter_(1, positions, torch.where(keep_old, tokens.gather(1, positions), emitted))
            step = stats.target_forwards - stats.prefill_forwards
            committed_at.scatter_(1, positions, committed_at.gather(1, positions).masked_fill(~keep_old, step))
            drafted.scatter_(1, positions, drafted.gather(1, positions) | (~keep_old & (window_slots < n[:, None])))
            if trees:
                drafter.observe(tokens, lengths, laws, count)
            lengths += count
            generated += count
            stats.record_step(result, drafted_nodes, rows)
            if on_step is not None:  # the caller sees every row so far and may stop them all
                so_far, counts = final_tokens.clone(), final_generated.clone()
                so_far[rows], counts[rows] = tokens, generated
                new_ids = _new_ids(so_far, prompt_lengths, counts, max_new_tokens, pad_token_id)
                if on_step(step, int(counts.min()), {"generated_ids": new_ids, "new_tokens": counts}):
                    finished = torch.ones_like(finished)
            done = finished.tolist()  # host sync: which rows leave the batch
            if any(done):
                final_tokens[rows[finished]] = tokens[finished]
                final_generated[rows[finished]] = generated[finished]
                final_committed_at[rows[finished]] = committed_at[finished]
                final_drafted[rows[finished]] = drafted[finished]
            if all(done):
                break
            truncate(state, lengths - 1)
            drafter.rollback(lengths - 1)
            if not trees:
                schedule.update(n, drafted_nodes)
            if any(done):
                keep = [i for i, d in enumerate(done) if not d]
                index = torch.tensor(keep, device=device)
                tokens, lengths, generated, rows = tokens[index], lengths[index], generated[index], rows[index]
                committed_at, drafted = committed_at[index], drafted[index]
                select_rows(state, index)
                drafter.select(index)
                if not trees:
                    schedule.select(index)
                if isinstance(generator, (list, tuple)):
                    generator = [generator[i] for i in keep]

    # 3. Prompts as given, then each row's new tokens, padded to the longest row.
    N = int(final_generated.max())
    index = prompt_lengths[:, None] + torch.arange(N, device=device)
    real = torch.arange(N, device=device) < final_generated[:, None]
    new = _new_ids(final_tokens, prompt_lengths, final_generated, N, pad_token_id)
    stats.acceptance_map = torch.where(real, final_committed_at.gather(1, index), -1).cpu()
    stats.from_draft = (real & final_drafted.gather(1, index)).cpu()
    stats.new_tokens = final_generated
    stats.draft_forwards = getattr(drafter, "forwards", 0) - draft_forwards_before
    stats.timings["total"] = time.perf_counter() - start_time
    stats.finalize()
    return torch.cat([input_ids, new], dim=1), stats
