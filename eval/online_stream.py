"""Online speculative decoding on a shifted stream: the draft LM's (or the EAGLE head's) acceptance after it served
part of the stream, learning online (`mmspec.text.online.OnlineDistillation`, `OnlineHeadDistillation`), against the
same drafter frozen.

The stream is STREAM_PROMPTS prompts from the held-out files' unit tests (`def test...` and the line after it): files
neither model trained on, and one narrow domain of the whole standard library they trained on. It is served in
requests of REQUEST_ROWS prompts, the draft model (or head) drafting chains of 4; both runs draw with the same seeds.
The learner updates every UPDATE_EVERY requests (OSD's 8 prompts) with forward KL at every new token, inside the
request's return (`background=False`), so the figure does not depend on how fast this machine's background thread
is. The acceptance (draft tokens accepted / drafted) is measured on the prompts after the first LEARN_PROMPTS.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from mmspec.adapters.causal_lm import as_causal_model
from mmspec.adapters.features import bind_head
from mmspec.core.progress import run_to_end
from mmspec.text.methods import TextDraftHeads, TextDraftModel
from mmspec.text.online import OnlineDistillation, OnlineHeadDistillation, copy_sharing
from mmspec.zoo.text_corpus import held_out_prompts

STREAM_PROMPTS, LEARN_PROMPTS = 300, 200
REQUEST_ROWS, UPDATE_EVERY = 4, 2
LEARNER = dict(every=UPDATE_EVERY, steps=4, rows_per_step=16, lr=3e-4, divergence="fkl", positions="all")


@dataclass
class StreamPart:
    """Sums over the measured requests: new tokens, target forwards, draft tokens drafted and accepted, seconds."""

    new_tokens: int = 0
    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / max(self.drafted, 1)


def serve_stream(target, draft, tokenizer, prompts: list[str], temperature: float, max_new_tokens: int,
                 learner: OnlineDistillation | None = None, measure_from: int = LEARN_PROMPTS) -> StreamPart:
    """Serve `prompts` in requests of REQUEST_ROWS with the chains of `draft`, a draft LM or an EAGLE head (the
    learner, if any, recording each and swapping its updates in between); the sums over the requests from prompt
    `measure_from` on."""
    decoding = TextDraftHeads(head=draft) if hasattr(draft, "logits") else TextDraftModel()
    part = StreamPart()
    for start in range(0, len(prompts), REQUEST_ROWS):
        encoded = tokenizer(prompts[start : start + REQUEST_ROWS], return_tensors="pt", padding=True,
                            padding_side="left").to(target.device)
        if learner is not None:
            learner.before_request()
        began = time.perf_counter()
        result = run_to_end(decoding.run(
            target, draft, encoded["input_ids"], encoded["attention_mask"], max_new_tokens=max_new_tokens,
            temperature=temperature, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            generator=torch.Generator(target.device).manual_seed(start)))
        sequences, stats = result.sequences, result.stats
        seconds = time.perf_counter() - began
        if learner is not None:
            learner.after_request(target, sequences, encoded["attention_mask"], stats)
        if start >= measure_from:
            part.new_tokens += int(stats.new_tokens.sum())
            part.target_forwards += stats.target_forwards
            part.drafted, part.accepted = part.drafted + stats.drafted, part.accepted + stats.accepted
            part.seconds += seconds
    return part


def online_acceptance_gain(target, draft, tokenizer, temperature: float, max_new_tokens: int = 48,
                           stream_prompts: int = STREAM_PROMPTS,
                           learn_prompts: int = LEARN_PROMPTS) -> tuple[StreamPart, StreamPart, dict]:
    """(frozen, online, figures): the stream's measured part served by the frozen `draft` (a draft LM or an EAGLE
    head) and by a copy learning online from the stream's start; figures: `acceptance_gain` (relative: online /
    frozen − 1), the `updates` swapped in, and the learner's mean loss over its first and last ten steps
    (`loss_first`, `loss_last`)."""
    prompts = held_out_prompts(stream_prompts, opening="def test")
    frozen = serve_stream(target, draft, tokenizer, prompts, temperature, max_new_tokens, measure_from=learn_prompts)
    if hasattr(draft, "logits"):  # a head: its copy reads through the same target embedding and LM head
        bind_head(draft, as_causal_model(target))
        learning = copy_sharing(draft, (draft.embedding, draft.lm_head))
        learner = OnlineHeadDistillation(target, learning, background=False, **LEARNER)
    else:
        learning = copy.deepcopy(draft)
        learner = OnlineDistillation(learning, background=False, **LEARNER)
    online = serve_stream(target, learning, tokenizer, prompts, temperature, max_new_tokens, learner, learn_prompts)
    learner.close()
    figures = {"acceptance_gain": online.acceptance / frozen.acceptance - 1, "updates": learner.updates,
               "loss_first": sum(learner.losses[:10]) / 10, "loss_last": sum(learner.losses[-10:]) / 10}
    return frozen, online, figures
