"""speculative_generate: speculative decoding for any transformers causal LM, batch > 1 with ragged acceptance.

Each step is the speculative round every modality shares (`mmspec.core.speculation.SpeculativeStep`): the
drafter proposes (a chain of up to L tokens per row with its law q, or a `DraftTree`), the target scores the pending
token and every draft token in one forward (a tree with a tree mask), the rule keeps a prefix (a path) of each row's
draft and draws one more token, and the target's cache rolls back per row. The drafter gives the round's strategy
(`Drafter.step`: `Chain`, `Tree`); this loop is the same for both. Rows advance by their own accepted counts and
stop at their own EOS; no row waits for another. With temperature 0 the greedy rule is used, which gives
token-for-token the target's greedy output.

The models run on fixed-capacity caches rolled back in place (`mmspec.adapters.static_cache`), and a step keeps its
whole state in tensors it updates in place, with no host read: the loop drives it in blocks of iterations with one read
of the progress per block (`mmspec.core.runtime.capture.StepRunner`). Rows that finish inside a block commit nothing
more. An eager batch of several rows reads its progress after every step instead, and writes its finished rows out and
drops them from the batch, so the remaining rows' steps get cheaper. With `graphs` (a
`mmspec.core.runtime.capture.StepGraphs`: CUDA graphs, or their CPU tape) a block replays one captured graph and the
batch keeps its shape until every row is done.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from mmspec.adapters.causal_lm import as_causal_model
from mmspec.adapters.static_cache import as_static_model
from mmspec.core.drafting.lengths import DraftLengthSchedule
from mmspec.core.probs import SamplingConfig
from mmspec.core.progress import Halt, StepHook, run_to_end
from mmspec.core.rng import Generators, check_generators
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.runtime.capture import StepGraphs, StepRunner, block_size, iterations_left
from mmspec.core.speculation import SpeculativeStep
from mmspec.core.stats import PhaseTimer
from mmspec.text.drafters import Drafter
from mmspec.text.kinds import check_max_new_tokens
from mmspec.text.rows import TextProgress, TextRows
from mmspec.text.stats import TextStats

PROMPT_SLOTS = 64  # the buffers' room for the prompts is a multiple of it


def check_inputs(model, input_ids, attention_mask, drafter, max_new_tokens, lookahead, eos_token_id,
                 generator) -> None:
    """model: the target as a model adapter (its `vocab_size` and `context_length`)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise TypeError("input_ids must be a [B, T] torch.long tensor")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have at least one row and one token, got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    check_max_new_tokens(max_new_tokens)
    if drafter.vocab_size is not None and drafter.vocab_size != model.vocab_size:
        raise ValueError(f"draft vocabulary size {drafter.vocab_size} does not match the target's {model.vocab_size}")
    context = getattr(model, "context_length", None)
    if context is not None and input_ids.shape[1] + max_new_tokens + lookahead + 1 > context:
        raise ValueError(
            f"prompt length {input_ids.shape[1]} + max_new_tokens {max_new_tokens} + draft length {lookahead} + 1 "
            f"exceeds the target's context of {context} positions"
        )
    if eos_token_id is not None and not isinstance(eos_token_id, (int, list, tuple)):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {type(eos_token_id).__name__}")
    check_generators(generator, input_ids.shape[0])


def stop_tokens(model, eos_token_id, pad_token_id: int | None, device) -> tuple[torch.Tensor | None, int]:
    """(eos, pad): the EOS ids as a [E] long tensor (None: rows stop at max_new_tokens only) and the pad id: the
    caller's, else the target's (`model`: its adapter; `CausalLMAdapter.pad_token_id`), else the first EOS (else
    0)."""
    ids = None if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    eos = None if ids is None else torch.tensor(ids, device=device)
    if pad_token_id is None:
        pad_token_id = getattr(model, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = 0 if ids is None else ids[0]
    return eos, pad_token_id


def speculative_generate(
    target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    drafter: Drafter,
    on_step: StepHook | None = None,
    **options,
) -> tuple[torch.Tensor, TextStats]:
    """Generate with speculative decoding: (sequences, stats), `speculative_steps`' result (see it for the
    arguments). on_step: called with every `TextProgress` (`mmspec.core.progress.run_to_end`); a true return ends
    every row where it stands."""
    result = run_to_end(speculative_steps(target, input_ids, attention_mask, drafter=drafter, **options), on_step)
    return result.sequences, result.stats


@torch.no_grad()
def speculative_steps(
    target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    drafter: Drafter,
    acceptance: AcceptanceRule | str = "exact",
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
    graphs: StepGraphs | None = None,
    block: int | None = None,
) -> Iterator[TextProgress]:
    """Speculative decoding as a run (`mmspec.core.progress`): a `TextProgress` after every block of steps, the last
    one holding the output.

    target: a transformers causal LM, or a model adapter (`mmspec.adapters.CausalLMAdapter`). input_ids: [B, T] long,
    prompts (left or right padded). attention_mask: [B, T], 1 for prompt tokens (None = all). drafter: a `ChainDrafter`
    (ModelDrafter, LayerSkipDrafter, NGramDrafter) or a `TreeDrafter` (ModelTreeDrafter, LayerSkipTreeDrafter,
    StandDrafter; its `TreeShape` sizes the tree). acceptance: `Exact()` (lossless) or `Typical(...)` (lossy, opt-in,
    chains only), or its name. draft_length: chains only, tokens drafted per step (default 4), or a
    `DraftLengthSchedule`. tree_rule: trees only, the exact rule that walks them (`mmspec.core.tree_verify`; default:
    the one for how the drafter draws children). measure_ceiling: trees only, also report the mean alpha* at the visited
    nodes (`stats.tree_alpha_star`, a vocabulary sort per node). generator: a torch.Generator or one per row. graphs:
    replay the steps from these captured steps (`StepGraphs(cuda=True)` on a GPU; keep it across calls: a later call
    with the same settings and batch replays the graphs of the first). A captured batch keeps its rows until every
    one is done, where an eager one drops the finished ones: with a generator per row (or at temperature 0) both
    decode the same tokens; with one generator shared by the rows, the draws after a row finishes are laid out
    differently (both exact). block: the most steps between two progresses (None: as many as the rows are expected
    to need, up to 16; 1: after every step, what a step callback needs); an eager batch of several rows yields one
    after every step. `progress.stop()` ends every row where it stands. The last progress holds
    `sequences` [B, T + N], the prompts as given then the new tokens (N: the longest row's), padded with pad_token_id
    after each row's EOS (as `generate` does), and the stats: `stats.acceptance_map` [B, N], the step (1, 2, ...) that
    committed each new token, `stats.from_draft` [B, N], whether it was an accepted draft (padding -1 / False)."""
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a ChainDrafter or a TreeDrafter (mmspec.text), got {type(drafter).__name__}")
    if graphs is not None and not isinstance(graphs, StepGraphs):
        raise TypeError(f"graphs must be a mmspec.core.runtime.capture.StepGraphs, got {type(graphs).__name__}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be an int >= 1 or None, got {block!r}")
    adapter = as_causal_model(target)
    inner = drafter.step(adapter.vocab_size, acceptance, draft_length, tree_rule, measure_ceiling)
    check_inputs(adapter, input_ids, attention_mask, drafter, max_new_tokens, inner.lookahead, eos_token_id, generator)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    shortest, longest = torch.stack([mask.sum(-1).min(), mask.sum(-1).max()]).tolist()  # one host read
    if shortest < 1:
        raise ValueError("every row of attention_mask needs at least one prompt token")
    slots = input_ids.shape[1]
    if graphs is not None:  # prompts of nearby lengths share a captured step
        slots = -(-slots // PROMPT_SLOTS) * PROMPT_SLOTS
    stats = TextStats(steps=torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device))
    rows = TextRows(input_ids, mask, max_new_tokens, inner.lookahead,
                    *stop_tokens(adapter, eos_token_id, pad_token_id, input_ids.device), stats, prompt_width=longest,
                    prompt_slots=slots)
    timer, started = PhaseTimer(stats.timings), time.perf_counter()
    capacity = slots + max_new_tokens + inner.window + 1
    key = ("text", drafter.capture_key(), inner.capture_key(), sampling, input_ids.shape[0], slots, max_new_tokens,
           capacity)

    # 1. Prefill the target with all but each row's last prompt token (that one is scored with the first draft).
    model = as_static_model(adapter, capacity)
    with timer("target"):
        state, _ = model.prefill(rows.prompt)
    stats.target_forwards = stats.prefill_forwards = int(rows.prompt.input_ids.shape[1] > 0)
    drafter.start(rows, model.vocab_size, capacity)
    inner.start(rows.batch_size, input_ids.device)

    # 2. Draft, verify, commit, roll back, in blocks of iterations with one read of the progress per block.
    step = SpeculativeStep(inner, model, state, rows, sampling, generator, stats, timer)
    runner = StepRunner(step, stats, timer, graphs if inner.capturable else None, key)
    # An eager batch of several rows reads its progress after every step and drops its finished rows at once (the
    # others' steps get cheaper); a single row, or a captured batch, reads it once per block.
    narrows = runner.graphs is None and input_ids.shape[0] > 1
    halt, fewest, most = Halt(), 0, 0
    try:
        while True:
            left = iterations_left(max_new_tokens - fewest, fewest, runner.iterations, inner.lookahead + 1)
            runner.run(1 if narrows else block_size(left, block))
            live = runner.step.rows  # the captured steps' own while graphs replay
            flags, fewest, longest = live.progress()
            most = max(most, longest)
            if all(flags):
                break
            yield live.snapshot(runner.iterations, fewest, halt)
            if halt.stopped:
                live.done.fill_(True)  # every row ends where it stands
                break
            if narrows:
                going_on = rows.retire(flags)
                if going_on is not None:
                    step.select(going_on)
    finally:
        runner.finish()

    # 3. Prompts as given, then each row's new tokens, padded to the longest row; the stats folded.
    rows.retire([True] * rows.batch_size)  # every row is done
    sequences = rows.output(input_ids, stats, most)
    stats.timings["total"] = time.perf_counter() - started
    result = rows.snapshot(runner.iterations, fewest, halt)
    result.sequences, result.stats = sequences, stats
    yield result
