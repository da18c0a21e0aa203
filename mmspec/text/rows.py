"""`TextRows`: the per-row sequences of a text decoding and what a step commits to them — each row's own length, its
own EOS and max_new_tokens, which verification step committed each token. A row that finishes stays in the batch,
committing nothing more (`done`), until the loop next reads the progress; an eager loop then writes finished rows out
and drops them from the batch (`retire`, `select`), so the remaining rows' steps get cheaper. Everything a step
changes is updated in place, so a captured step (`mmspec.core.runtime.capture`) replays it.

Buffers are left-aligned: row b is `tokens[b, :lengths[b]]`, its prompt then its new tokens. The models count what
follows their prefill, which holds each prompt but its last token (that one opens the first window): the model view
of row b is `seq[b] = tokens[b, prompt_lengths[b] - 1:]`, of which `committed[b]` tokens are final.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.adapters.causal_lm import Prompt, left_align
from mmspec.core.progress import Halt, Progress
from mmspec.core.speculation import Round
from mmspec.text.stats import TextStats


@dataclass(kw_only=True)
class TextProgress(Progress):
    """A text decoding's progress (`mmspec.core.progress`): step, the verification steps so far; n_done, the fewest
    new tokens of a row still going (max_new_tokens once none goes); generated_ids [B, max_new_tokens] long, each
    row's new tokens so far, then pad_token_id; new_tokens [B] long, how many. In the last progress only (else None):
    sequences [B, T + N] long, the prompts as given, then each row's new tokens, padded to the longest row, and the
    run's `TextStats`."""

    generated_ids: torch.Tensor
    new_tokens: torch.Tensor
    sequences: torch.Tensor | None = None
    stats: TextStats | None = None


def new_ids(tokens: torch.Tensor, prompt_lengths: torch.Tensor, generated: torch.Tensor, width: int,
            pad_token_id: int) -> torch.Tensor:
    """[B, width]: the first `generated[b]` new tokens of each left-aligned row of `tokens`, then padding."""
    index = (prompt_lengths[:, None] + torch.arange(width, device=tokens.device)).clamp(max=tokens.shape[1] - 1)
    real = torch.arange(width, device=tokens.device) < generated[:, None]
    return torch.where(real, tokens.gather(1, index), pad_token_id)


class TextRows:
    """The rows of a text decoding (see the module docstring). input_ids: [B, T] long prompts, left or right padded;
    attention_mask: [B, T]; lookahead: the most tokens a step may write past a row's end; eos: [E] long or None;
    stats: where each round is recorded (None: rows only drafted from, never committed to); prompt_width: the longest
    prompt, when the caller has read it (else one host read); prompt_slots: the buffers' room for the prompts
    (default T; a caller rounds it up so that prompts of nearby lengths give a step the same shapes)."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, lookahead: int,
                 eos: torch.Tensor | None, pad_token_id: int, stats: TextStats | None = None,
                 prompt_width: int | None = None, prompt_slots: int | None = None):
        B, T = input_ids.shape
        self.max_new_tokens, self.lookahead, self.eos, self.pad_token_id = max_new_tokens, lookahead, eos, pad_token_id
        self.stats = stats
        width = max(T, prompt_slots or T) + max_new_tokens + lookahead + 1
        self.tokens, self.lengths = left_align(input_ids, attention_mask, width)
        self.prompt_lengths = self.lengths.clone()  # of every row of the batch, finished or not
        # the longest prompt (read once, not in every step)
        self.prompt_width = int(self.prompt_lengths.max()) if prompt_width is None else prompt_width
        device = input_ids.device
        self.generated = torch.zeros(B, dtype=torch.long, device=device)
        self.count = torch.zeros(B, dtype=torch.long, device=device)  # what the last step committed per row
        self.done = torch.zeros(B, dtype=torch.bool, device=device)  # rows that finished (EOS or max_new_tokens)
        self.stepped = torch.ones(B, dtype=torch.bool, device=device)  # rows the last step committed for
        self.step = torch.zeros((), dtype=torch.long, device=device)  # verification steps so far
        self.rows = torch.arange(B, device=device)  # batch position -> output row
        self.committed_at = torch.full_like(self.tokens, -1)  # verification step that committed each position
        self.drafted = torch.zeros_like(self.tokens, dtype=torch.bool)  # position holds an accepted draft token
        self.final = (self.tokens.clone(), self.generated.clone(), self.committed_at.clone(), self.drafted.clone())

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def prompt(self) -> Prompt:
        """What the models' prefill caches: each row's prompt but its last token."""
        T = self.prompt_width
        return Prompt(self.tokens[:, : T - 1], torch.arange(T - 1, device=self.tokens.device) < self.offsets[:, None])

    @property
    def offsets(self) -> torch.Tensor:
        """[B] long, the prompt tokens each row's prefill holds (its prompt length minus one)."""
        return self.prompt_lengths[self.rows] - 1

    @property
    def seq(self) -> torch.Tensor:
        """[B, S'] long, the model view: each row's tokens after its prefill (its last prompt token first), as far as
        a step may write (S' does not depend on the prompts' lengths)."""
        width = self.max_new_tokens + self.lookahead + 2
        index = self.offsets[:, None] + torch.arange(width, device=self.tokens.device)
        return self.tokens.gather(1, index.clamp(max=self.tokens.shape[1] - 1))

    @property
    def committed(self) -> torch.Tensor:
        """[B] long, the tokens of `seq` that are final."""
        return self.lengths - self.offsets

    @property
    def last(self) -> torch.Tensor:
        """[B] long, each row's last token (the root of its next draft; not in the target's cache yet)."""
        return self.tokens.gather(1, (self.lengths - 1)[:, None]).squeeze(1)

    def room(self, width: int) -> None:
        """No bound on a row's drafts: a row writes up to `lookahead` tokens past its end, and `commit` keeps what
        fits."""
        return None

    def commit(self, round: Round) -> None:
        """Write each going row's accepted drafts and closing token (up to its EOS and max_new_tokens), record the
        step, and mark the rows that finished `done` (in place, no host read)."""
        n, going = round.result.n_accepted, ~self.done
        self.stepped.copy_(going)
        self.step += 1
        slots = torch.arange(round.emitted.shape[1], device=n.device)
        count = torch.minimum(n + 1, self.max_new_tokens - self.generated)
        finished = count == self.max_new_tokens - self.generated
        if self.eos is not None:
            is_eos = torch.isin(round.emitted, self.eos) & (slots < count[:, None])
            count = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, count)
            finished |= is_eos.any(-1)
        count = torch.where(going, count, 0)
        positions = self.lengths[:, None] + slots
        keep_old = slots >= count[:, None]
        self.tokens.scatter_(1, positions, torch.where(keep_old, self.tokens.gather(1, positions), round.emitted))
        self.committed_at.scatter_(1, positions, torch.where(keep_old, self.committed_at.gather(1, positions),
                                                             self.step))
        self.drafted.scatter_(1, positions, self.drafted.gather(1, positions) | (~keep_old & (slots < n[:, None])))
        self.count.copy_(count)  # what this step committed, for drafters that learn from it
        self.lengths += count
        self.generated += count
        self.stats.record_step(round.result, round.drafted, self.rows, active=going)
        self.done |= finished & going

    def progress(self) -> tuple[list[bool], int, int]:
        """(each row's done flag, the fewest new tokens of a going row (max_new_tokens when none goes), the most new
        tokens of a row): one host read."""
        fewest = torch.where(self.done, self.max_new_tokens, self.generated).min()
        read = torch.cat([self.done.long(), torch.stack([fewest, self.generated.max()])]).tolist()
        return [bool(flag) for flag in read[:-2]], read[-2], read[-1]

    def finish(self) -> None:
        """Nothing to fold: the loop writes the rows out (`retire`, `output`)."""

    def snapshot(self, step: int, fewest: int, halt: Halt) -> TextProgress:
        """Every row so far (the finished ones as written out) after `step` steps; fewest: `progress`'s."""
        so_far, counts = self.final[0].clone(), self.final[1].clone()
        so_far[self.rows], counts[self.rows] = self.tokens, self.generated
        return TextProgress(step=step, n_done=fewest, new_tokens=counts, halt=halt,
                            generated_ids=new_ids(so_far, self.prompt_lengths, counts, self.max_new_tokens,
                                                  self.pad_token_id))

    def retire(self, done: list[bool]) -> torch.Tensor | None:
        """Write the done rows out (done: each row's flag, as `progress` read it); the batch positions that go on
        ([B'] long), None when none leaves."""
        if not any(done):
            return None
        for final, live in zip(self.final, (self.tokens, self.generated, self.committed_at, self.drafted),
                               strict=True):
            final[self.rows[self.done]] = live[self.done]
        return torch.tensor([i for i, d in enumerate(done) if not d], dtype=torch.long, device=self.done.device)

    def select(self, index: torch.Tensor) -> None:
        """Keep only batch positions `index` ([B'] long), in that order."""
        self.tokens, self.lengths, self.generated = self.tokens[index], self.lengths[index], self.generated[index]
        self.committed_at, self.drafted, self.rows = self.committed_at[index], self.drafted[index], self.rows[index]
        self.count, self.done, self.stepped = self.count[index], self.done[index], self.stepped[index]

    def output(self, input_ids: torch.Tensor, stats: TextStats, N: int) -> torch.Tensor:
        """[B, T + N]: the prompts as given, then each row's new tokens, padded to the longest row (N: its new
        tokens, as `progress` read them); folds the stats, with their per-token maps (one host transfer)."""
        tokens, generated, committed_at, drafted = self.final
        index = self.prompt_lengths[:, None] + torch.arange(N, device=tokens.device)
        real = torch.arange(N, device=tokens.device) < generated[:, None]
        maps = torch.stack([torch.where(real, committed_at.gather(1, index), -1), real & drafted.gather(1, index)])
        (acceptance_map, from_draft), = stats.finalize(maps)
        stats.acceptance_map, stats.from_draft = acceptance_map, from_draft.bool()
        stats.new_tokens = generated
        return torch.cat([input_ids, new_ids(tokens, self.prompt_lengths, generated, N, self.pad_token_id)], dim=1)
