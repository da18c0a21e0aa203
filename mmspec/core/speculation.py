"""The speculative round, once for every drafter and modality: draft, score the draft in one target forward, accept a
prefix (a path of a tree) and draw the closing token, commit, roll the target back.

`SpeculativeStep` is that round for every row of a batch, on tensors it updates in place with no host read, so a
captured step (`mmspec.core.runtime.capture`) replays it. What varies is given to it:
- the strategy, `Chain` or `Tree`: how a draft is proposed (a drafter's chain of up to its budget per row, or its
  tree), scored (`chain_round`: [x_{c-1}, d_1 .. d_L]; `tree_round`: [x_{c-1}, every node] with the tree mask) and
  verified (a chain test, or the exact tree walk), and what it learns from the outcome (a draft-length schedule, a
  drafter's memory, the tree walk's figures);
- the rows (`Rows`): the text rows (`mmspec.text.rows.TextRows`: ragged prompts, EOS, max_new_tokens) or the image
  rows (`mmspec.image.loop.Commits`: N tokens each), which say what each row may still draft and commit a round;
- the laws (`DraftLaw`): a text token's law is its logits'; an image token's also fixes the image's forced tokens.

Shapes: B rows, L drafts per chain, V token ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmspec.core.drafts import Draft
from mmspec.core.model import CausalModel, Logits
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, select_generators
from mmspec.core.rules.base import TokenTest
from mmspec.core.stats import PhaseTimer, SpecStats
from mmspec.core.tree_shape import TreeShape
from mmspec.core.tree_verify import TreeVerifyResult, verify_tree
from mmspec.core.trees import DraftTree
from mmspec.core.verify import VerifyResult, verify

# law(logits [B, F, V] of tokens at depth [B, F] after each row's last committed token, sampling) -> q [B, F, V]
DraftLaw = Callable[[Logits, torch.Tensor, SamplingConfig], torch.Tensor]


@dataclass(frozen=True)
class Round:
    """What one round verified, per row. emitted: [B, D + 1] long, the accepted drafts, then the closing token (the
    residual or bonus) at n_accepted; entries after it are not committed. result: the VerifyResult (n_accepted [B],
    next_token [B], accept_mask [B, D]). drafted: [B] long, draft tokens (tree nodes) proposed. laws: [B, D + 1, V],
    the target law each emitted token was drawn from (trees; None for chains). walk: the tree walk's per-node figures
    (trees; None for chains)."""

    emitted: torch.Tensor
    result: VerifyResult
    drafted: torch.Tensor
    laws: torch.Tensor | None = None
    walk: TreeVerifyResult | None = None


class Rows(Protocol):
    """The rows a step commits to. seq: [B, S] long, each row's tokens after the prefill (drafters read it);
    committed: [B] long, the final tokens of seq; last: [B] long, x_{c-1}, the root of the next draft; stepped: [B]
    bool, the rows the last round committed for."""

    seq: torch.Tensor
    committed: torch.Tensor
    last: torch.Tensor
    stepped: torch.Tensor

    def room(self, width: int) -> torch.Tensor | None:
        """[B] long, the drafts each row may keep in a forward of `width` tokens (None: as many as it drafts)."""

    def commit(self, round: Round) -> None:
        """Write each row's accepted drafts and closing token, and record the round in the stats."""

    def progress(self) -> Any:
        """What the loop reads between blocks of rounds (one host read)."""

    def finish(self) -> None:
        """Fold what the rows recorded once the decoding ends."""


class SpeculativeStep:
    """One round for every row: the strategy drafts and verifies, the rows commit, and the target rolls back to each
    row's last committed token (it opens the next forward). The stats' Python counters count per call."""

    def __init__(self, strategy: Chain | Tree, target: CausalModel, state: Any, rows: Rows, sampling: SamplingConfig,
                 generator: Generators, stats: SpecStats, timer: PhaseTimer):
        self.strategy, self.target, self.state, self.rows = strategy, target, state, rows
        self.sampling, self.generator, self.stats, self.timer = sampling, generator, stats, timer

    def __call__(self) -> None:
        strategy, rows, timer = self.strategy, self.rows, self.timer
        forwards = strategy.drafter.forwards
        with timer("draft"):
            draft = strategy.propose(rows, self.sampling, self.generator)
        self.stats.draft_forwards += strategy.drafter.forwards - forwards
        round = strategy.verify(self.target, self.state, rows.last, draft, self.sampling, self.generator, timer)
        self.stats.target_forwards += 1
        with timer("verify"):
            rows.commit(round)
            strategy.observe(round, rows, self.stats)
        with timer("target"):
            self.target.rollback(self.state, rows.committed - 1)

    def progress(self) -> Any:
        return self.rows.progress()

    def finish(self) -> None:
        self.rows.finish()

    def select(self, index: torch.Tensor) -> None:
        """Keep only batch positions `index` ([B'] long): the done rows leave (rows that can narrow: the text
        rows' `select`)."""
        self.rows.select(index)
        self.target.select_rows(self.state, index)
        self.strategy.select(index)
        self.generator = select_generators(self.generator, index)


def chain_round(target: CausalModel, state: Any, last: torch.Tensor, draft: Draft, law: DraftLaw,
                sampling: SamplingConfig, test: TokenTest, generator: Generators, timer: PhaseTimer) -> Round:
    """Score [x_{c-1}, d_1 .. d_L] in one target forward (last: [B] long, x_{c-1}) and verify the chain with `test`
    (greedy decoding at temperature 0 for a rule that keeps the model's law). `timer` times the forward ("target")
    apart from the verification ("verify")."""
    window = torch.cat([last[:, None], draft.tokens], 1)  # [B, L + 1]
    with timer("target"):
        logits = target.forward(window, state)
    with timer("verify"):
        depth = torch.arange(window.shape[1], device=window.device).expand_as(window)
        result = verify(law(logits, depth, sampling), draft, generator, test, greedy=sampling.greedy)
        return Round(closing(draft.tokens, result), result, draft.lengths)


def tree_round(target: CausalModel, state: Any, last: torch.Tensor, tree: DraftTree, law: DraftLaw,
               sampling: SamplingConfig, generator: Generators, timer: PhaseTimer, rule: str | None = None,
               ceiling: bool = False, draws: tuple[int, int] | None = None) -> Round:
    """Score [x_{c-1}, every node] in one target forward with the tree mask, walk it with the exact `rule` for how
    its children were drawn (`mmspec.core.tree_verify`), and keep exactly the accepted path in the target's cache.
    ceiling: also measure alpha* at the visited nodes; draws: (depth, children) bounds of every tree the drafter
    grows (a row's stream then does not depend on the other rows' trees)."""
    layout = tree.layout()
    window = torch.cat([last[:, None], tree.tokens], 1)  # [B, N + 1]
    with timer("target"):
        logits = target.forward_tree(window, layout.depth, layout.ancestors, state)
    with timer("verify"):
        p = law(logits, layout.depth, sampling)  # [B, N + 1, V]: slot s predicts the token after its path
        walk = verify_tree(p, tree, generator, rule, layout, ceiling, draws)
        result = VerifyResult(walk.n_accepted, walk.next_token, walk.path >= 0)
        slots = torch.cat([torch.zeros_like(walk.path[:, :1]), walk.path.clamp(min=0)], 1)  # root, path, then roots
        laws = p.gather(1, slots[..., None].expand(-1, -1, p.shape[-1]))
    with timer("target"):
        target.keep_path(state, walk.path)  # the accepted path's keys/values onto the slots after x_{c-1}
    return Round(closing(window.gather(1, walk.path.clamp(min=0)), result), result, tree.n_nodes, laws, walk)


def closing(accepted: torch.Tensor, result: VerifyResult) -> torch.Tensor:
    """[B, D + 1]: the accepted tokens [B, D] with the closing token written at each row's n_accepted."""
    emitted = torch.cat([accepted, accepted.new_zeros(accepted.shape[0], 1)], 1)
    return emitted.scatter(1, result.n_accepted[:, None], result.next_token[:, None])


class ChainDrafts(Protocol):
    """A drafter of chains: `propose(rows, budget [B] long, width, sampling, generator) -> Draft`, up to budget[b]
    tokens after row b's committed tokens in a draft of `width` (a host int: the step's static shape);
    `observe(rows, laws)`: the round's target forward ran and its rows committed (a head keeps the features it read;
    laws: None for chains); `forwards`: its model calls so far; `capturable`: no host read of its own;
    `select(index)`: rows left the batch."""

    forwards: int
    capturable: bool

    def propose(self, rows: Rows, budget: torch.Tensor, width: int, sampling: SamplingConfig,
                generator: Generators) -> Draft: ...

    def observe(self, rows: Rows, laws: torch.Tensor | None) -> None: ...

    def select(self, index: torch.Tensor) -> None: ...


class TreeDrafts(Protocol):
    """A drafter of trees of `shape`: `propose(rows, sampling, generator) -> DraftTree` after each row's committed
    tokens; `observe(rows, laws)`: the round committed rows' new tokens, drawn from laws [B, D + 1, V] (for drafters
    that learn from the target, and heads that keep the features it read); `forwards`, `capturable`, `select` as for
    chains."""

    shape: TreeShape
    forwards: int
    capturable: bool

    def propose(self, rows: Rows, sampling: SamplingConfig, generator: Generators) -> DraftTree: ...

    def observe(self, rows: Rows, laws: torch.Tensor) -> None: ...

    def select(self, index: torch.Tensor) -> None: ...


class DraftLengths(Protocol):
    """How many tokens each row drafts a round (`mmspec.core.drafting.lengths.DraftLengthSchedule`): `budget` [B]
    long after `reset`; `width()` the round's static draft width; `update` learns from what was accepted;
    `max_length`, `kind` and `length` key a captured round."""

    budget: torch.Tensor
    max_length: int
    kind: str
    length: int

    def reset(self, batch_size: int, device: torch.device) -> None: ...

    def width(self) -> int: ...

    def update(self, n_accepted: torch.Tensor, draft_lengths: torch.Tensor) -> None: ...

    def select(self, index: torch.Tensor) -> None: ...


class Chain:
    """Chains: the drafter drafts up to the schedule's budget per row (and the rows' room), the target scores them in
    one forward under `law` and `test` decides (`chain_round`); the schedule learns from what was accepted."""

    def __init__(self, drafter: ChainDrafts, lengths: DraftLengths, test: TokenTest, law: DraftLaw):
        self.drafter, self.lengths, self.test, self.law = drafter, lengths, test, law
        self.lookahead = lengths.max_length  # the most draft tokens a round writes past a row's committed ones
        self.window = lengths.max_length + 1  # the most tokens a forward writes past them

    @property
    def capturable(self) -> bool:
        return self.drafter.capturable

    def capture_key(self) -> tuple:
        """What of the strategy makes two decodings' rounds replayable by the same graphs (the drafter's settings are
        the caller's part of the key)."""
        return self.lengths.kind, self.lengths.length, repr(self.test)

    def start(self, batch_size: int, device: torch.device) -> None:
        self.lengths.reset(batch_size, device)

    def propose(self, rows: Rows, sampling: SamplingConfig, generator: Generators) -> Draft:
        width, budget = self.lengths.width(), self.lengths.budget
        room = rows.room(width + 1)
        return self.drafter.propose(rows, budget if room is None else torch.minimum(budget, room), width, sampling,
                                    generator)

    def verify(self, target: CausalModel, state: Any, last: torch.Tensor, draft: Draft, sampling: SamplingConfig,
               generator: Generators, timer: PhaseTimer) -> Round:
        return chain_round(target, state, last, draft, self.law, sampling, self.test, generator, timer)

    def observe(self, round: Round, rows: Rows, stats: SpecStats) -> None:
        self.drafter.observe(rows, round.laws)
        self.lengths.update(round.result.n_accepted, round.drafted)

    def select(self, index: torch.Tensor) -> None:
        self.drafter.select(index)
        self.lengths.select(index)


class Tree:
    """Trees: the drafter grows a tree per row, the target scores every node in one forward with the tree mask under
    `law`, the exact `rule` for how its children were drawn walks it (None: the rule of the tree's own draws), and the
    target's cache keeps exactly the accepted path (`tree_round`). ceiling: also measure alpha* at the visited
    nodes."""

    def __init__(self, drafter: TreeDrafts, law: DraftLaw, rule: str | None = None, ceiling: bool = False):
        self.drafter, self.law, self.rule, self.ceiling = drafter, law, rule, ceiling
        shape = drafter.shape
        self.lookahead = shape.depth  # the most draft tokens a round writes past a row's committed ones
        # the most tokens a forward writes past them: a level's window and the nodes before it
        self.window = shape.nodes + shape.depth + 2

    @property
    def capturable(self) -> bool:
        return self.drafter.capturable

    def capture_key(self) -> tuple:
        return self.rule, self.ceiling

    def start(self, batch_size: int, device: torch.device) -> None:
        pass

    def propose(self, rows: Rows, sampling: SamplingConfig, generator: Generators) -> DraftTree:
        return self.drafter.propose(rows, sampling, generator)

    def verify(self, target: CausalModel, state: Any, last: torch.Tensor, tree: DraftTree, sampling: SamplingConfig,
               generator: Generators, timer: PhaseTimer) -> Round:
        shape = self.drafter.shape
        return tree_round(target, state, last, tree, self.law, sampling, generator, timer, self.rule, self.ceiling,
                          (shape.depth, shape.branching))

    def observe(self, round: Round, rows: Rows, stats: SpecStats) -> None:
        self.drafter.observe(rows, round.laws)
        walk = round.walk
        stats.record_tree_walk(walk.node_acceptance, walk.node_alpha_star, walk.node_children, walk.accepted_rank,
                               self.drafter.shape.branching, rows.stepped)

    def select(self, index: torch.Tensor) -> None:
        self.drafter.select(index)
