"""Text speculative decoding benchmark on the embedded pair (mmspec/zoo/pycode), in one process.

    python -m mmspec.eval.bench_text          # full: 16 held-out prompts, 128 new tokens
    python -m mmspec.eval.bench_text --quick  # about 15 minutes on 2 CPU cores: 4 prompts, 64 new tokens
    python -m mmspec.eval.bench_text --json bench_text.json

Prompts come from the held-out split of the corpus. Every method runs on the same target, prompts and seeds, after a
warm-up, at temperature 0 and 1 (no top-k/top-p): two AR baselines (`target.generate` with its KV cache, and ours,
`NoDrafter` through our loop and fixed-capacity cache, replayed from CUDA graphs on CUDA), transformers assisted
generation with the same draft (its defaults, and with our draft length), transformers prompt lookup, and ours (model
drafter chains of 4, 8 and 16 tokens, n-gram, layer skip, adaptive length; draft trees of the draft model: the fixed
trees of TREE_NODES and 30 nodes built for its measured positional acceptance, the full binary tree of 30 nodes,
OPT-Tree (T = 0 only: deterministic children); STAND's model-free n-gram memory; the draft heads on the target's
features, `HEADS`; cascades of the draft model, of its tree and of the EAGLE head over prompt lookup, `CASCADES`,
`TREE_CASCADES`; SpecDec++'s learned draft length; Kangaroo's exit adapter, `KANGAROOS`, and S2D's sorted exits; judge
decoding, lossy) at batch 1; AR and ours (chains of 4, 2 and 1, the positional tree, which keeps BATCH_TOKENS // 8 - 1 =
15 nodes at batch 8, and its best 14 and 6) at batch 8. The summary ratios take the best of ours against the best
transformers assisted run (batch 1) and against AR (batch 8), the best tree's tokens per forward against the best
chain's, STAND's tokens per forward against transformers' prompt lookup, and the heads' best tokens per forward against
the draft model's chain and (at one tree of 30 nodes) its tree, each cascade's speed against its drafter's (timed in
turns, `compare_in_turns`), and SpecDec++ and VocabTrim (of the draft model and of the EAGLE head) against the untrimmed
drafter on STOP_PROMPTS more prompts (`compare_with_plain_chain`: draft tokens rejected per new token, tokens per
forward, acceptance), and VocabTrim's drafting time and multiply-adds per round against the untrimmed drafter's,
Kangaroo against the plain early exit and S2D against Kangaroo, judge decoding against the exact rule on the same
STOP_PROMPTS prompts, greedy (`compare_judge`: tokens per forward, the share of completions without a syntax error, the
distortion), and online speculative decoding's acceptance on a shifted stream against the frozen draft's, for the draft
model and the EAGLE head (`eval/online_stream.py`, `--stream-prompts`).

Positional trees (`TreeShape.positional`, Sequoia's) need the rate at which walks accept a node's k-th child: an
untimed calibration pass per temperature and drafter (the draft model, the EAGLE head) measures it
(`TextStats.child_acceptance`) with the wide CALIBRATION_SHAPE on held-out prompts that no method decodes. For tree
methods an extra untimed pass measures, at every inner node the walks visit, the rule's acceptance probability and
alpha*, the best any verifier could reach with the same drafts (`mmspec.core.tree_verify`).

Target forwards are counted by a forward hook on the target for every method (transformers' included). Columns:
target forwards per token, tokens per target forward (tau-like, bonus included; both over every repeat, each repeat
with seeds of its own), tokens/s, speedup vs transformers' AR and vs the faster AR at the same batch size and
temperature. Wall clock is the median over repeats of the whole prompt set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from mmspec.adapters.causal_lm import cache_keyword
from mmspec.adapters.views import early_exit_view
from mmspec.core.drafting.tree_growth import TreeShape
from mmspec.core.probs import SamplingConfig
from mmspec.core.rules import Exact, Judge
from mmspec.core.runtime.capture import StepGraphs
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.runtime.measured import median_seconds
from mmspec.core.stats import synchronize
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.eval.online_stream import LEARN_PROMPTS, LEARNER, REQUEST_ROWS, STREAM_PROMPTS, online_acceptance_gain
from mmspec.models.acceptance import AcceptanceHead
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.models.judge import JudgeHead
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.text import speculative_generate
from mmspec.text.drafters import (
    CascadeDrafter,
    DraftLengthSchedule,
    KangarooDrafter,
    LayerSkipDrafter,
    ModelDrafter,
    NGramDrafter,
    NoDrafter,
)
from mmspec.text.head_drafters import HeadDrafter, HeadTreeDrafter
from mmspec.text.methods import attached, built_in, chain_drafters, draft_vocabulary
from mmspec.text.rows import TextRows
from mmspec.text.sorted_exits import SortedExitDrafter
from mmspec.text.tree_drafters import ModelTreeDrafter, StandDrafter
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, load_causal_lm, resolve_model
from mmspec.zoo.text_corpus import held_out_prompts, syntax_valid

DRAFT_LENGTH = 4
# The draft model's trees: fixed trees for its positional acceptance (children without replacement), 200 nodes at
# batch 1 (where the gain in tokens per forward levels off on the embedded pair: 60 / 120 / 200 / 300 nodes 3.65 /
# 3.80 / 4.13 / 4.18 at T = 1); with BATCH_TOKENS a batch of B keeps the best BATCH_TOKENS // B - 1 (the best tree
# shrinks as verification stops being free); at batch 8 also its best 14 and 6. The full binary tree of 30 nodes
# compares shapes at one budget with the positional tree of 30.
TREE_NODES = 200
BATCH_TOKENS = 128
SMALL_TREES = {"ours_tree_n14": 14, "ours_tree_n6": 6}
FULL_TREE = TreeShape.full(depth=4, branching=2)
CALIBRATION_SHAPE = TreeShape.full(depth=3, branching=4)  # 84 nodes: every node 4 children, where rates are measured
OPT_TREE_SHAPE = TreeShape(nodes=16, branching=4, expand=4, depth=8, scheme="deterministic", rerank=True)
CHAINS = ("ours_model", "ours_model_len8", "ours_model_len16")  # the draft model's chains at batch 1
# Cascades (CS-Drafting) of the draft model over prompt lookup, chains of DRAFT_LENGTH: vertical (the draft model's
# own chain, fewer draft forwards) and horizontal (the draft model's first position, prompt lookup's after)
CASCADES = ("ours_cascade", "ours_cascade_horizontal")
HEAD_CASCADE = "ours_eagle_cascade"  # the EAGLE head's first position, prompt lookup's after (chains of DRAFT_LENGTH)
# Trees' horizontal cascades: the drafter's first TREE_LOOKUP_AFTER levels, prompt lookup's after, of the draft
# model's positional tree of 30 nodes and of the EAGLE head's dynamic tree (HEAD_TREE)
TREE_LOOKUP_AFTER = 2
TREE_CASCADES = {"ours_tree_n30_cascade": "ours_tree_n30", "ours_eagle_tree_cascade": "ours_eagle_tree"}
# Speeds timed in turns prompt by prompt over TURN_REPEATS passes against the drafter they build on, the median of
# the paired ratios (`compare_in_turns`): a slow spell of a shared machine then moves one pair, not the figure. Each
# cascade against its drafter alone, and S2D's sorted exits against Kangaroo's one exit of the same adapter.
TURN_GROUPS = {"cascade": ("ours_model", *CASCADES), "heads_cascade": ("ours_eagle", HEAD_CASCADE),
               **{cascade.removeprefix("ours_").replace("_n30", ""): (drafter, cascade)
                  for cascade, drafter in TREE_CASCADES.items()},
               "s2d": ("ours_kangaroo", "ours_s2d")}
TURN_REPEATS = 5
# SpecDec++'s learned draft length: the draft model drafts up to SPECDECPP_LENGTH tokens and stops where its
# acceptance head (pycode/acceptance_head) says; compared with the plain chain of DRAFT_LENGTH on STOP_PROMPTS
# prompts (--quick: a quarter), more than the table's: at T = 1 tokens per forward vary a lot between samples
SPECDECPP_LENGTH = 8
STOP_PROMPTS = 64
# VocabTrim: the draft model's head cut to the VOCABTRIM_SIZE tokens the target writes most (and the specials),
# chains of DRAFT_LENGTH, compared with the plain chain on the same STOP_PROMPTS prompts
VOCABTRIM_SIZE = 1024
# Kangaroo: the target's first layers and its exit adapter (pycode/kangaroo_adapter), chains of DRAFT_LENGTH, and
# with the double early exit (the paper's confidence 0.6, at most 6 drafts)
KANGAROO_CONFIDENCE, KANGAROO_LENGTH = 0.6, 6
KANGAROOS = ("ours_kangaroo", "ours_kangaroo_exit")
# S2D: the same adapter (trained sorted, at several exits) at the exit each row chooses per step, chains of
# DRAFT_LENGTH; compared with Kangaroo's chain at its one exit
S2D_EXIT_THRESHOLD = 0.3
# Online speculative decoding: the draft model, and the EAGLE head, learning while they serve a shifted stream
# (`eval/online_stream.py`), against the same drafter frozen; STREAM_NEW_TOKENS per prompt. learner: (the frozen
# drafter's row, what drafts: "draft" or a head's kind, the prefix of its figures)
STREAM_NEW_TOKENS = 48
ONLINE_LEARNERS = {"ours_online": ("ours_model", "draft", "online"),
                   "ours_eagle_online": ("ours_eagle", "eagle", "eagle_online")}
TREES = ("ours_tree", "ours_tree_n30", "ours_tree_full30")  # the draft model's trees at batch 1
BATCH8_ONLY = ("ours_model_len1", "ours_model_len2", *SMALL_TREES)
METHOD_NAMES = ("ar", "hf_assisted", "hf_assisted_len4", "hf_prompt_lookup", "ours_ar", "ours_model", "ours_ngram",
                "ours_layerskip", "ours_adaptive", "ours_model_len1", "ours_model_len2", "ours_model_len8",
                "ours_model_len16", "ours_tree", "ours_tree_n30", "ours_tree_full30", "ours_opt_tree", "ours_stand",
                "ours_tree_n14", "ours_tree_n6", "ours_eagle", "ours_hydra", "ours_eagle_tree",
                "ours_eagle_tree_n30", *CASCADES, HEAD_CASCADE, *TREE_CASCADES, "ours_specdecpp",
                "ours_vocabtrim", "ours_eagle_vocabtrim", *ONLINE_LEARNERS, *KANGAROOS,
                "ours_s2d", "ours_judge")  # `make_methods`' keys, and the online stream's learner
# Drafts from heads on the target's features: the EAGLE head's chains of DRAFT_LENGTH, EAGLE-2's dynamic tree of 16
# nodes (HEAD_TREE) and the positional tree of 30 built for the head's own measured acceptance (as "ours_tree_n30" is
# for the draft model's: the two compare drafters at one tree); the Hydra head's chains.
HEADS = ("ours_eagle", "ours_hydra", "ours_eagle_tree", "ours_eagle_tree_n30")
HEAD_TREE = TreeShape(nodes=16, branching=2, expand=4, depth=4)
# the methods whose trees are built for a drafter's measured positional acceptance (calibrated only when one runs)
DRAFT_POSITIONAL = {"ours_tree", "ours_tree_n30", "ours_tree_n30_cascade", *SMALL_TREES}
HEAD_POSITIONAL = {"ours_eagle_tree_n30"}
AR_METHODS = ("ar", "ours_ar")  # transformers' generate; ours, drafting nothing (graphed on CUDA)
BATCH8 = ("ar", "ours_ar", "ours_model", "ours_tree", *BATCH8_ONLY)


@dataclass
class Row:
    """new_tokens, target_forwards: the means over the repeats (each repeat its own seeds); seconds: the median."""

    method: str
    batch_size: int
    temperature: float
    new_tokens: float
    target_forwards: float
    seconds: float
    mean_accepted_length: float | None = None
    drafted: float | None = None  # draft tokens proposed and accepted (means over the repeats; ours only)
    accepted: float | None = None
    tree_acceptance: float | None = None
    tree_alpha_star: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards

    @property
    def wasted_per_token(self) -> float:
        """Draft tokens proposed and rejected per new token."""
        return (self.drafted - self.accepted) / self.new_tokens


class ForwardCounter:
    def __init__(self, model):
        self.device = model.device
        self.count = 0
        model.register_forward_hook(lambda *_: self._hit())

    def _hit(self):
        self.count += 1


@torch.no_grad()
def forward_latency(model, context: int = 64, repeats: int = 50) -> float:
    """Median seconds of one cached 1-token forward at batch 1 after `context` tokens."""
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device)
    cache = DynamicCache(config=model.config)
    keyword = cache_keyword(model)
    model(ids, use_cache=True, **{keyword: cache})
    return median_seconds(lambda: model(ids[:, -1:], use_cache=True, **{keyword: cache}), model.device, repeats,
                          after=lambda: cache.crop(-1))


def load_heads(target_name: str, target) -> dict:
    """The heads saved beside the target's folder (the embedded pycode/ ships them all), on its device: the draft
    heads on its features ("eagle": `eagle_head/`, "hydra": `hydra_head/`) and SpecDec++'s acceptance head of the
    draft model ("acceptance": `acceptance_head/`), Kangaroo's exit adapter ("kangaroo": `kangaroo_adapter/`) and
    judge decoding's judge ("judge": `judge_head/`)."""
    folder = Path(resolve_model(target_name, "--target")).parent
    heads = {}
    for kind, name, head_class, script in (("eagle", "eagle_head", EagleHead, "train_heads"),
                                           ("hydra", "hydra_head", HydraHead, "train_heads"),
                                           ("acceptance", "acceptance_head", AcceptanceHead, "train_acceptance"),
                                           ("kangaroo", "kangaroo_adapter", KangarooAdapter, "train_kangaroo"),
                                           ("judge", "judge_head", JudgeHead, "train_judge")):
        if not (folder / name / "config.json").is_file():
            raise SystemExit(f"no {name} beside {target_name}: train one with python -m mmspec.zoo.{script} "
                             f"--target {target_name}")
        heads[kind] = head_class.from_pretrained(folder / name).float().to(target.device).eval()
    return heads


@torch.no_grad()
def head_token_latency(target, head, vocabulary: torch.Tensor | None = None, context: int = 64,
                       repeats: int = 50) -> float:
    """Median seconds of one drafted token of an EAGLE head at batch 1 after `context` tokens (one head call and
    its readout through the target's LM head, or its `vocabulary` rows), the cost `forward_latency` gives for a
    model."""
    reader = HeadDrafter(target, head, vocabulary=vocabulary).reader  # bound to the target's embedding and LM head
    d, device = head.config.feature_size, target.device
    session = reader.session(1, context + 8, 1, False, device)
    positions = torch.arange(context, device=device)[None]
    session.prefill(torch.zeros(1, context, dtype=torch.long, device=device), torch.randn(1, context, d, device=device),
                    positions, torch.ones(1, context, dtype=torch.bool, device=device))
    committed = torch.ones(1, dtype=torch.long, device=device)
    nodes, paths = torch.zeros(1, 1, dtype=torch.long, device=device), torch.zeros(1, 1, 1, dtype=torch.long,
                                                                                  device=device)

    def one_token():  # a round of one draft: the root's first child
        session.begin_round(committed, 1)
        session.expand(nodes, paths, nodes, nodes.bool())

    return median_seconds(one_token, device, repeats)


def batches(prompts: list[str], batch_size: int) -> list[list[str]]:
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]


def sampling_kwargs(temperature: float) -> dict:
    if temperature == 0:
        return dict(do_sample=False)
    return dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)


def make_methods(target, draft, tokenizer, max_new_tokens: int, rates: dict[float, tuple[float, ...]], heads: dict,
                 head_rates: dict[float, tuple[float, ...]]):
    """name -> fn(encoded batch, temperature, seed) -> (sequences, stats or None); tree methods also take
    ceiling=True (alpha* at the visited nodes). rates, head_rates: the draft model's and the EAGLE head's positional
    acceptance at each temperature (empty where none of the drafter's positional trees runs). On
    CUDA our decodings replay their steps from CUDA graphs (one store for the run: each method's first, untimed call
    captures), as a `SpeculativeTextPipeline` on CUDA does; transformers' methods run as they are. heads: the
    target's draft heads by kind ("eagle", "hydra")."""
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    graphs = StepGraphs(cuda=True) if target.device.type == "cuda" else None

    def hf(**extra):
        def run(enc, temperature, seed):
            torch.manual_seed(seed)  # transformers' generate draws from the global RNG
            return target.generate(**enc, **common, **sampling_kwargs(temperature), **extra), None
        return run

    def ours(make_drafter, schedule=lambda: DraftLengthSchedule(DRAFT_LENGTH), acceptance=Exact()):
        def run(enc, temperature, seed):  # schedule() None: the drafter's own
            sequences, stats = speculative_generate(
                target, enc["input_ids"], enc["attention_mask"], drafter=make_drafter(), temperature=temperature,
                draft_length=schedule(), acceptance=acceptance, generator=seeded(target.device, [seed])[0],
                graphs=graphs, **common,
            )
            return sequences, stats
        return run

    def tree(make_drafter):
        def run(enc, temperature, seed, ceiling=False):
            sequences, stats = speculative_generate(
                target, enc["input_ids"], enc["attention_mask"], drafter=make_drafter(temperature),
                temperature=temperature, measure_ceiling=ceiling, generator=seeded(target.device, [seed])[0],
                graphs=graphs, **common,
            )
            return sequences, stats
        run.tree = True
        return run

    def positional(nodes, lookup_after=None, **settings):
        return tree(lambda t: ModelTreeDrafter(draft, TreeShape.positional(nodes, rates[t], **settings),
                                               lookup_after=lookup_after))

    def eagle_tree(shape_at, lookup_after=None):  # shape_at(temperature) -> TreeShape
        return tree(lambda t: HeadTreeDrafter(target, heads["eagle"], shape_at(t), lookup_after=lookup_after))

    exit_layer = target.config.early_exit_layer
    trimmed = draft_vocabulary(target, VOCABTRIM_SIZE)
    return {
        "ar": hf(),
        "hf_assisted": hf(assistant_model=draft),
        "hf_assisted_len4": hf(assistant_model=draft, num_assistant_tokens=DRAFT_LENGTH,
                               num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0),
        "hf_prompt_lookup": hf(prompt_lookup_num_tokens=DRAFT_LENGTH),
        "ours_ar": ours(NoDrafter, lambda: None),  # AR through our loop: on CUDA, graphed AR
        **{key: ours(lambda decoding=cls(): decoding.make_drafter(target, draft),
                     lambda decoding=cls(): DraftLengthSchedule(decoding.draft_length))
           for key, cls in registered_methods().items()},
        "ours_model": ours(lambda: ModelDrafter(draft)),
        "ours_ngram": ours(lambda: NGramDrafter()),
        "ours_layerskip": ours(lambda: LayerSkipDrafter(target, exit_layer)),
        "ours_kangaroo": ours(lambda: KangarooDrafter(target, heads["kangaroo"])),
        "ours_kangaroo_exit": ours(lambda: KangarooDrafter(target, heads["kangaroo"], KANGAROO_CONFIDENCE),
                                   lambda: DraftLengthSchedule(KANGAROO_LENGTH)),
        "ours_s2d": ours(lambda: SortedExitDrafter(target, heads["kangaroo"], S2D_EXIT_THRESHOLD)),
        "ours_adaptive": ours(lambda: ModelDrafter(draft, confidence_threshold=0.3),
                              lambda: DraftLengthSchedule(DRAFT_LENGTH, kind="heuristic", max_length=8)),
        # The best draft length shrinks as the batch grows (verification is no longer free): batch 8 also tries 1 and 2.
        "ours_model_len1": ours(lambda: ModelDrafter(draft), lambda: DraftLengthSchedule(1)),
        "ours_model_len2": ours(lambda: ModelDrafter(draft), lambda: DraftLengthSchedule(2)),
        "ours_model_len8": ours(lambda: ModelDrafter(draft), lambda: DraftLengthSchedule(8)),
        "ours_model_len16": ours(lambda: ModelDrafter(draft), lambda: DraftLengthSchedule(16)),
        "ours_tree": positional(TREE_NODES, batch_tokens=BATCH_TOKENS),
        "ours_tree_n30": positional(30),
        "ours_tree_n30_cascade": positional(30, lookup_after=TREE_LOOKUP_AFTER),
        "ours_tree_full30": tree(lambda t: ModelTreeDrafter(draft, FULL_TREE)),
        "ours_opt_tree": tree(lambda t: ModelTreeDrafter(draft, OPT_TREE_SHAPE)),
        "ours_stand": tree(lambda t: StandDrafter()),
        **{name: positional(nodes) for name, nodes in SMALL_TREES.items()},
        "ours_cascade": ours(lambda: CascadeDrafter(draft)),
        "ours_cascade_horizontal": ours(lambda: CascadeDrafter(draft, lookup_after=1)),
        "ours_specdecpp": ours(lambda: ModelDrafter(draft, acceptance_head=heads["acceptance"]),
                               lambda: DraftLengthSchedule(SPECDECPP_LENGTH)),
        "ours_vocabtrim": ours(lambda: ModelDrafter(draft, vocabulary=trimmed)),
        "ours_eagle_vocabtrim": ours(lambda: HeadDrafter(target, heads["eagle"], vocabulary=trimmed)),
        "ours_judge": ours(lambda: ModelDrafter(draft), acceptance=attached(Judge(head=heads["judge"]), target)),
        "ours_eagle": ours(lambda: HeadDrafter(target, heads["eagle"])),
        HEAD_CASCADE: ours(lambda: HeadDrafter(target, heads["eagle"], lookup_after=1)),
        "ours_hydra": ours(lambda: HeadDrafter(target, heads["hydra"])),
        "ours_eagle_tree": eagle_tree(lambda t: HEAD_TREE),
        "ours_eagle_tree_cascade": eagle_tree(lambda t: HEAD_TREE, lookup_after=TREE_LOOKUP_AFTER),
        "ours_eagle_tree_n30": eagle_tree(lambda t: TreeShape.positional(30, head_rates[t])),
    }


def registered_methods() -> dict[str, type]:
    """"ours_<name>" for each registered `TextDrafting` of a user's or a plugin's, run at its defaults (the built-in
    drafters have their entries above, with the parts they read)."""
    return {f"ours_{name}": cls for name, cls in chain_drafters().items() if not built_in(cls)}


def calibrate(target, drafter, tokenizer, prompts: list[str], temperature: float, max_new_tokens: int,
              seed: int = 777) -> tuple[float, ...]:
    """A tree drafter's positional acceptance at `temperature`: the rate at which walks accept a node's k-th child,
    k = 1 .. 4, over `prompts` decoded with `drafter` (drafting CALIBRATION_SHAPE; untimed)."""
    encoded = tokenizer(prompts, return_tensors="pt", padding=True).to(target.device)
    _, stats = speculative_generate(target, encoded["input_ids"], encoded["attention_mask"],
                                    drafter=drafter, temperature=temperature,
                                    max_new_tokens=max_new_tokens, generator=seeded(target.device, [seed])[0],
                                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return stats.child_acceptance


def positional_acceptance(target, make_drafter, tokenizer, prompts: list[str], max_new_tokens: int,
                          name: str) -> dict[float, tuple[float, ...]]:
    """`calibrate` at T = 0 and 1 with the tree drafters `make_drafter()` builds (printed under `name`)."""
    rates = {t: calibrate(target, make_drafter(), tokenizer, prompts, t, max_new_tokens) for t in (0.0, 1.0)}
    print(f"{name}'s positional acceptance (k-th child):",
          {t: [round(r, 3) for r in rate] for t, rate in rates.items()})
    return rates


def new_tokens(sequences: torch.Tensor, encoded, tokenizer) -> int:
    """The tokens a call generated: `sequences` past the `encoded` prompts, padding left out."""
    return int((sequences[:, encoded["input_ids"].shape[1] :] != tokenizer.pad_token_id).sum())


def measure(name, fn, prompts, tokenizer, counter, batch_size, temperature, repeats) -> Row:
    device = counter.device
    encoded = [tokenizer(b, return_tensors="pt", padding=True).to(device) for b in batches(prompts, batch_size)]
    # warm-up; on CUDA on every batch, so that each prompt length's and block size's steps are captured before timing
    for enc in encoded if device.type == "cuda" else encoded[:1]:
        fn(enc, temperature, seed=12345)
    times, tokens, forwards, taus, drafted, accepted = [], 0, 0, [], 0, 0  # summed over the repeats
    for repeat in range(repeats):
        new, start = 0, time.perf_counter()
        for i, enc in enumerate(encoded):
            counter.count = 0
            sequences, stats = fn(enc, temperature, seed=1000 * repeat + i)
            new += new_tokens(sequences, enc, tokenizer)
            # ours count their own forwards: a step replayed from a CUDA graph fires no hook
            forwards += counter.count if stats is None else stats.target_forwards
            if stats is not None:
                taus.append(stats.mean_accepted_length)
                drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        synchronize(device)
        times.append(time.perf_counter() - start)
        tokens += new
    row = Row(name, batch_size, temperature, tokens / repeats, forwards / repeats, statistics.median(times),
              statistics.mean(taus) if taus else None, drafted / repeats if taus else None,
              accepted / repeats if taus else None)
    if getattr(fn, "tree", False):  # untimed: the rule's acceptance against alpha* at the nodes the walks visit
        ceilings = [fn(enc, temperature, seed=i, ceiling=True)[1] for i, enc in enumerate(encoded)]
        acceptance = [s.tree_acceptance for s in ceilings if s.tree_acceptance is not None]  # None: no inner node
        row.tree_acceptance = statistics.mean(acceptance) if acceptance else None
        stars = [s.tree_alpha_star for s in ceilings if s.tree_acceptance is not None]
        row.tree_alpha_star = None if None in stars or not stars else statistics.mean(stars)
    return row


def compare_in_turns(methods: dict, groups: dict, prompts: list[str], tokenizer, device,
                     repeats: int = TURN_REPEATS) -> dict:
    """Each group's methods against its first, the drafter they build on (`TURN_GROUPS`), at T = 0 and 1, batch 1,
    on `prompts`: the methods of a group take turns prompt by prompt, `repeats` passes.
    `<group>_speedup_over_drafter_t*_bs1`: the best method's median, over the (pass, prompt) pairs, of its tokens/s
    over the drafter's on the same prompt just before (a slow spell of a shared machine then hits one pair, not the
    figure); printed beside it, each method's tokens/s over a pass (mean new tokens over the median seconds)."""
    encoded = [tokenizer([prompt], return_tensors="pt").to(device) for prompt in prompts]
    figures = {}
    for temperature in (0.0, 1.0):
        for group, names in groups.items():
            for name in names:  # warm-up
                methods[name](encoded[0], temperature, seed=12345)
            speeds = {name: [] for name in names}  # tokens/s per (pass, prompt)
            passes = {name: [[0, 0.0] for _ in range(repeats)] for name in names}  # [tokens, seconds] per pass
            for repeat in range(repeats):
                for i, enc in enumerate(encoded):
                    for name in names:
                        start = time.perf_counter()
                        sequences, _ = methods[name](enc, temperature, seed=1000 * repeat + i)
                        synchronize(device)
                        seconds = time.perf_counter() - start
                        new = new_tokens(sequences, enc, tokenizer)
                        speeds[name].append(new / seconds)
                        passes[name][repeat][0] += new
                        passes[name][repeat][1] += seconds
            drafter, others = names[0], names[1:]
            figures[f"{group}_speedup_over_drafter_t{temperature:g}_bs1"] = max(
                statistics.median(c / d for c, d in zip(speeds[name], speeds[drafter], strict=True))
                for name in others)
            per_pass = {name: statistics.mean(tokens for tokens, _ in passes[name]) /
                        statistics.median(seconds for _, seconds in passes[name]) for name in names}
            print(f"{group} T={temperature:g}: " + ", ".join(f"{n} {per_pass[n]:.1f} tok/s" for n in names), flush=True)
    return figures


def compare_with_plain_chain(methods: dict, prompts: list[str], tokenizer, counter) -> tuple[list[Row], dict]:
    """SpecDec++'s learned draft length ("ours_specdecpp") and VocabTrim's draft ("ours_vocabtrim") against the
    plain chain ("ours_model"), and VocabTrim's EAGLE head ("ours_eagle_vocabtrim") against the full one
    ("ours_eagle"), on `prompts`, at T = 0 and 1, batch 1: their rows, and per temperature SpecDec++'s reduction of
    the draft tokens rejected per new token (`specdecpp_wasted_draft_reduction_t*`, 1 - learned / plain) and ratio
    of tokens per target forward (`specdecpp_tokens_per_forward_ratio_t*`), and VocabTrim's relative loss of
    acceptance (`vocabtrim_acceptance_loss_t*`, `vocabtrim_head_acceptance_loss_t*`: 1 - its accepted / drafted
    over the untrimmed drafter's)."""
    rows, figures = [], {}
    for temperature in (0.0, 1.0):
        plain, learned, trimmed, eagle, trimmed_eagle = (
            measure(name, methods[name], prompts, tokenizer, counter, 1, temperature, 1)
            for name in ("ours_model", "ours_specdecpp", "ours_vocabtrim", "ours_eagle", "ours_eagle_vocabtrim"))
        rows += [plain, learned, trimmed, eagle, trimmed_eagle]
        t = f"t{temperature:g}"
        figures[f"specdecpp_wasted_draft_reduction_{t}"] = 1 - learned.wasted_per_token / plain.wasted_per_token
        figures[f"specdecpp_tokens_per_forward_ratio_{t}"] = learned.tokens_per_forward / plain.tokens_per_forward
        for key, cut, full in (("vocabtrim", trimmed, plain), ("vocabtrim_head", trimmed_eagle, eagle)):
            figures[f"{key}_acceptance_loss_{t}"] = 1 - (cut.accepted / cut.drafted) / (full.accepted / full.drafted)
    return rows, figures


def compare_judge(methods: dict, prompts: list[str], tokenizer, device) -> tuple[list[dict], dict]:
    """Judge decoding ("ours_judge") against the exact rule with the same chains ("ours_model") on `prompts`, greedy
    (judge decoding's mode), one prompt at a time: per method new tokens per target forward, the share of completions
    without a syntax error (`syntax_valid`, the task metric the judge was trained for) and, for the judge, the mean
    excess acceptance per tested position (what it adds to the exact rule's acceptance: the distortion bound).
    Figures: `judge_tokens_per_forward_over_exact`, `judge_parse_rate`, `exact_parse_rate`, `judge_excess_tv`."""
    rows = []
    for name in ("ours_model", "ours_judge"):
        tokens = forwards = valid = 0
        excess = []
        for i, prompt in enumerate(prompts):
            encoded = tokenizer([prompt], return_tensors="pt").to(device)
            sequences, stats = methods[name](encoded, 0.0, seed=i)
            tokens, forwards = tokens + int(stats.new_tokens.sum()), forwards + stats.target_forwards
            valid += syntax_valid(prompt + tokenizer.decode(sequences[0, encoded["input_ids"].shape[1] :],
                                                            skip_special_tokens=True))
            if stats.excess_acceptance is not None:
                excess.append(stats.excess_acceptance)
        rows.append({"method": name, "prompts": len(prompts), "new_tokens": tokens, "target_forwards": forwards,
                     "tokens_per_forward": tokens / forwards, "parse_rate": valid / len(prompts),
                     "excess_tv": statistics.mean(excess) if excess else None})
    exact, judged = rows
    return rows, {"judge_tokens_per_forward_over_exact": judged["tokens_per_forward"] / exact["tokens_per_forward"],
                  "judge_parse_rate": judged["parse_rate"], "exact_parse_rate": exact["parse_rate"],
                  "judge_excess_tv": judged["excess_tv"]}


@torch.no_grad()
def draft_round_latency(draft, vocabulary: torch.Tensor | None = None, length: int = DRAFT_LENGTH,
                        context: int = 64, repeats: int = 50) -> float:
    """Median seconds of one chain of `length` draft tokens at T = 1 and batch 1 after `context` tokens, drafted
    with `draft` (with `vocabulary`: its trimmed head), the drafting a round of `ours_model` does."""
    drafter = ModelDrafter(draft, vocabulary=vocabulary)
    ids = torch.randint(0, draft.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    rows = TextRows(ids.to(draft.device), torch.ones_like(ids).to(draft.device), 8, length, None, 0)
    drafter.start(rows, draft.config.vocab_size, context + 8 + length + 2)
    rows.lengths += 1  # a token committed since the prefill: every round feeds the last two, as after the first
    sampling, generator = SamplingConfig(temperature=1.0), torch.Generator(draft.device).manual_seed(0)
    drafter.propose(rows, torch.full((1,), length, device=draft.device), length, sampling, generator)  # warm
    return median_seconds(lambda: drafter.propose(rows, torch.full((1,), length, device=draft.device), length,
                                                  sampling, generator), draft.device, repeats)


def draft_flops_ratio(drafter: torch.nn.Module, readout: torch.nn.Linear, vocabulary: torch.Tensor) -> float:
    """Multiply-adds per drafted token of the trimmed drafter (a draft LM, or a head) over the full one: its own
    linear maps (attention over a short context left out) plus |S| (or V) rows of its LM head `readout`."""
    own = sum(m.weight.numel() for m in drafter.modules() if isinstance(m, torch.nn.Linear) and m is not readout)
    return (own + vocabulary.numel() * readout.in_features) / (own + readout.weight.numel())


def best_ar(rows: list[Row], batch_size: int, temperature: float) -> float:
    """Tokens/s of the faster AR at this batch size and temperature: transformers' `generate` or ours (`NoDrafter`,
    graphed on CUDA), the baseline a speculative method must beat to be called faster."""
    return max(r.tokens_per_second for r in rows if r.method in AR_METHODS and (r.batch_size, r.temperature) ==
               (batch_size, temperature))


def format_table(rows: list[Row]) -> str:
    header = ("| method | bs | T | target fwd / token | tokens / target fwd | mean accepted length | tokens/s | "
              "speedup vs AR | speedup vs best AR | tree rule acceptance / alpha* |")
    lines = [header, "|" + "---|" * 10]
    for r in rows:
        tau = "" if r.mean_accepted_length is None else f"{r.mean_accepted_length:.2f}"
        speedup = r.tokens_per_second / next(a.tokens_per_second for a in rows if a.method == "ar" and
                                             (a.batch_size, a.temperature) == (r.batch_size, r.temperature))
        over_best = r.tokens_per_second / best_ar(rows, r.batch_size, r.temperature)
        star = "n/a" if r.tree_alpha_star is None else f"{r.tree_alpha_star:.3f}"
        ceiling = "" if r.tree_acceptance is None else f"{r.tree_acceptance:.3f} / {star}"
        lines.append(f"| {r.method} | {r.batch_size} | {r.temperature:g} | {r.target_forwards / r.new_tokens:.3f} | "
                     f"{r.new_tokens / r.target_forwards:.2f} | {tau} | {r.tokens_per_second:.1f} | {speedup:.2f}x | "
                     f"{over_best:.2f}x | {ceiling} |")
    return "\n".join(lines)


def summary(rows: list[Row]) -> dict:
    """The summary ratios; one whose methods did not run (`--methods`) is left out."""
    by = {(r.method, r.batch_size, r.temperature): r for r in rows}

    def tps(method, bs, t):
        return by[method, bs, t].tokens_per_second  # KeyError: it did not run

    def per_forward(method, bs, t):
        return by[method, bs, t].new_tokens / by[method, bs, t].target_forwards

    def best_ours(bs, t):
        speeds = [tps(m, b, T) for m, b, T in by if m.startswith("ours") and m not in AR_METHODS and (b, T) == (bs, t)]
        if not speeds:
            raise KeyError((bs, t))  # none of ours ran there
        return max(speeds)

    def best(methods, t):
        return max(per_forward(method, 1, t) for method in methods)

    # the rule against its ceiling on the binary tree: alpha* of 3 or more children drawn without replacement is not
    # computed on this vocabulary (`tree_verify.alpha_star`)
    ratios = {
        "tree_over_chain_tokens_per_forward_t1_bs1": lambda: best(TREES, 1.0) / best(CHAINS, 1.0),
        "tree_over_chain_tokens_per_forward_t0_bs1": lambda: best(TREES, 0.0) / best(CHAINS, 0.0),
        "positional_over_full_tree_tokens_per_forward_t1_bs1": lambda: (per_forward("ours_tree_n30", 1, 1.0) /
                                                                        per_forward("ours_tree_full30", 1, 1.0)),
        "tree_rule_acceptance_t1_bs1": lambda: by["ours_tree_full30", 1, 1.0].tree_acceptance,
        "tree_alpha_star_t1_bs1": lambda: by["ours_tree_full30", 1, 1.0].tree_alpha_star,
        "stand_tokens_per_forward_t1_bs1": lambda: per_forward("ours_stand", 1, 1.0),
        "hf_prompt_lookup_tokens_per_forward_t1_bs1": lambda: per_forward("hf_prompt_lookup", 1, 1.0),
        "ours_vs_hf_assisted_bs1": lambda: best_ours(1, 1.0) / max(tps("hf_assisted", 1, 1.0),
                                                                   tps("hf_assisted_len4", 1, 1.0)),
        "ours_bs8_vs_ar_bs8": lambda: best_ours(8, 1.0) / tps("ar", 8, 1.0),
        "ours_bs8_vs_ar_bs8_greedy": lambda: best_ours(8, 0.0) / tps("ar", 8, 0.0),
        "ours_model_len4_bs8_vs_ar_bs8": lambda: tps("ours_model", 8, 1.0) / tps("ar", 8, 1.0),
        # against the faster AR (graphed on CUDA): the speeds the GPU goals name, at T = 0 and batch 1
        "ours_ar_vs_ar_t0_bs1": lambda: tps("ours_ar", 1, 0.0) / tps("ar", 1, 0.0),
        "ours_model_vs_best_ar_t0_bs1": lambda: tps("ours_model", 1, 0.0) / best_ar(rows, 1, 0.0),
        "best_tree_vs_best_chain_speed_t0_bs1": lambda: (max(tps(m, 1, 0.0) for m in TREES) /
                                                         max(tps(m, 1, 0.0) for m in CHAINS)),
        "ours_ngram_vs_hf_prompt_lookup_t0_bs1": lambda: tps("ours_ngram", 1, 0.0) / tps("hf_prompt_lookup", 1, 0.0),
        "heads_over_draft_lookup_after_per_forward_t1_bs1": lambda: best(HEADS, 1.0) / per_forward("ours_model", 1,
                                                                                                    1.0),
        "heads_over_draft_model_tree_n30_tokens_per_forward_t1_bs1": lambda: (
            per_forward("ours_eagle_tree_n30", 1, 1.0) / per_forward("ours_tree_n30", 1, 1.0)),
        "heads_speedup_vs_ar_t0_bs1": lambda: max(tps(m, 1, 0.0) for m in HEADS) / best_ar(rows, 1, 0.0),
        "heads_speedup_vs_ar_t1_bs1": lambda: max(tps(m, 1, 1.0) for m in HEADS) / best_ar(rows, 1, 1.0),
        # Kangaroo's adapter (and double exit) against the plain early exit at the same layer
        **{f"kangaroo_{kind}_over_layerskip_t{t:g}_bs1": (lambda figure=figure, t=t: max(
            figure(m, 1, t) for m in KANGAROOS) / figure("ours_layerskip", 1, t))
           for kind, figure in (("tokens_per_forward", per_forward), ("speedup", tps)) for t in (0.0, 1.0)},
        # S2D's exit chosen per step against Kangaroo's one exit, with the same adapter (speed: `compare_in_turns`)
        **{f"s2d_tokens_per_forward_over_kangaroo_t{t:g}_bs1": (lambda t=t: per_forward("ours_s2d", 1, t) /
                                                               per_forward("ours_kangaroo", 1, t))
           for t in (0.0, 1.0)},
    }
    found = {}
    for name, ratio in ratios.items():
        try:
            found[name] = ratio()
        except KeyError:
            pass
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 prompts (8 at batch 8), 64 new tokens, 1 repeat")
    parser.add_argument("--json", default=None, help="write rows and summary ratios to this path")
    parser.add_argument("--target", default=TEXT_TARGET)
    parser.add_argument("--draft", default=TEXT_DRAFT)
    parser.add_argument("--prompts", type=int, default=None, help="prompts at batch 1 (default 16, --quick 4; batch "
                                                                  "8 decodes at least 8)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per prompt (default 128, --quick 64)")
    parser.add_argument("--stop-prompts", type=int, default=None, help=f"prompts of the SpecDec++ comparison "
                        f"(default {STOP_PROMPTS}, --quick {STOP_PROMPTS // 4})")
    parser.add_argument("--stream-prompts", type=int, default=STREAM_PROMPTS,
                        help=f"prompts of the online-drafting stream (default {STREAM_PROMPTS}: learns on the first "
                             f"{LEARN_PROMPTS}, measured on the rest; N learns on the first 2N/3)")
    parser.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                        help="these methods only (default: all; the AR baselines always run): "
                             + ", ".join(METHOD_NAMES) + ", and ours_<name> for each registered TextDrafting "
                             "(a plugin's)")
    add_device_arguments(parser, dtype=False)
    args = parser.parse_args(argv)
    device = resolve_device(parser, args.device)

    n_prompts, max_new_tokens, repeats = (4, 64, 1) if args.quick else (16, 128, 3)
    n_prompts, max_new_tokens = args.prompts or n_prompts, args.new_tokens or max_new_tokens
    stop_prompts = args.stop_prompts or STOP_PROMPTS // (4 if args.quick else 1)
    if n_prompts < 1 or max_new_tokens < 1 or stop_prompts < 1:
        parser.error(f"--prompts, --new-tokens and --stop-prompts must be >= 1, got {n_prompts}, {max_new_tokens} "
                     f"and {stop_prompts}")
    if args.stream_prompts < 3 * REQUEST_ROWS:  # a request learnt from, one measured
        parser.error(f"--stream-prompts must be >= {3 * REQUEST_ROWS}, got {args.stream_prompts}")
    known = (*METHOD_NAMES, *registered_methods())
    unknown = sorted(set(args.methods or ()) - set(known))
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    target, tokenizer = load_causal_lm(args.target)
    draft, _ = load_causal_lm(args.draft)
    target, draft = target.to(device), draft.to(device)
    heads = load_heads(args.target, target)
    tokenizer.padding_side = "left"
    counter = ForwardCounter(target)
    calibration_prompts = 2 if args.quick else 8
    prompts = held_out_prompts(max(n_prompts, 8) + calibration_prompts)
    prompts, calibration = prompts[:-calibration_prompts], prompts[-calibration_prompts:]
    chosen = set(known if args.methods is None else (*AR_METHODS, *args.methods))
    with torch.no_grad():  # each drafter's positional acceptance, where one of its positional trees runs
        rates = head_rates = {}
        if chosen & DRAFT_POSITIONAL:
            rates = positional_acceptance(target, lambda: ModelTreeDrafter(draft, CALIBRATION_SHAPE), tokenizer,
                                          calibration, max_new_tokens, "draft model")
        if chosen & HEAD_POSITIONAL:
            head_rates = positional_acceptance(target, lambda: HeadTreeDrafter(target, heads["eagle"],
                                                                               CALIBRATION_SHAPE),
                                               tokenizer, calibration, max_new_tokens, "EAGLE head")
    methods = make_methods(target, draft, tokenizer, max_new_tokens, rates, heads, head_rates)
    rows = []
    with torch.no_grad():
        for temperature in (0.0, 1.0):
            for name, fn in methods.items():
                if name in BATCH8_ONLY or name not in chosen:
                    continue
                if name == "ours_opt_tree" and temperature > 0:  # deterministic children: built for greedy
                    continue
                rows.append(measure(name, fn, prompts[:n_prompts], tokenizer, counter, 1, temperature, repeats))
                print(f"{name} bs=1 T={temperature:g}: {rows[-1].tokens_per_second:.1f} tok/s", flush=True)
            for name in (name for name in BATCH8 if name in chosen):
                rows.append(measure(name, methods[name], prompts[: max(n_prompts, 8)], tokenizer, counter, 8,
                                    temperature, repeats))
                print(f"{name} bs=8 T={temperature:g}: {rows[-1].tokens_per_second:.1f} tok/s", flush=True)
    table, ratios = format_table(rows), summary(rows)
    stop_rows, judge_rows = [], []
    taken = len(prompts) + calibration_prompts  # more prompts, none of the table's or calibration's
    more_prompts = held_out_prompts(taken + stop_prompts)[taken:]
    with torch.no_grad():
        groups = {group: names for group, names in TURN_GROUPS.items() if set(names) <= chosen}
        if groups:
            ratios.update(compare_in_turns(methods, groups, prompts[:n_prompts], tokenizer, device))
        if {"ours_model", "ours_specdecpp", "ours_vocabtrim", "ours_eagle", "ours_eagle_vocabtrim"} <= chosen:
            stop_rows, figures = compare_with_plain_chain(methods, more_prompts, tokenizer, counter)
            ratios.update(figures)
        if "ours_judge" in chosen:
            judge_rows, figures = compare_judge(methods, more_prompts, tokenizer, device)
            ratios.update(figures)
    stream_rows = []
    learn = args.stream_prompts * LEARN_PROMPTS // STREAM_PROMPTS
    for learner, (frozen_name, drafting, prefix) in ONLINE_LEARNERS.items():
        if learner not in chosen:
            continue
        with torch.no_grad():
            for temperature in (0.0, 1.0):
                frozen, online, figures = online_acceptance_gain(target, heads.get(drafting, draft), tokenizer,
                                                                 temperature, STREAM_NEW_TOKENS, args.stream_prompts,
                                                                 learn)
                stream_rows += [Row(name, REQUEST_ROWS, temperature, part.new_tokens, part.target_forwards,
                                    part.seconds, None, part.drafted, part.accepted)
                                for name, part in ((frozen_name, frozen), (learner, online))]
                ratios.update({f"{prefix}_{key}_t{temperature:g}": value for key, value in figures.items()})
    target_latency = forward_latency(target)
    ratios["draft_target_cost_ratio"] = forward_latency(draft) / target_latency
    early_exit = early_exit_view(target, target.config.early_exit_layer)
    ratios["layerskip_target_cost_ratio"] = forward_latency(early_exit) / target_latency
    ratios["heads_draft_cost_ratio"] = head_token_latency(target, heads["eagle"]) / target_latency
    trimmed = draft_vocabulary(target, VOCABTRIM_SIZE)
    ratios["vocabtrim_draft_cost_ratio"] = draft_round_latency(draft, trimmed) / draft_round_latency(draft)
    ratios["vocabtrim_draft_flops_ratio"] = draft_flops_ratio(draft, draft.get_output_embeddings(), trimmed)
    eagle = heads["eagle"]
    ratios["vocabtrim_head_cost_ratio"] = (head_token_latency(target, eagle, trimmed) /
                                           head_token_latency(target, eagle))
    ratios["vocabtrim_head_flops_ratio"] = draft_flops_ratio(eagle, target.get_output_embeddings(), trimmed)
    print(table)
    print(json.dumps(ratios, indent=2))
    if args.json:
        payload = {"config": {"prompts": n_prompts, "max_new_tokens": max_new_tokens, "repeats": repeats,
                              "draft_length": DRAFT_LENGTH, "tree_nodes": TREE_NODES, "batch_tokens": BATCH_TOKENS,
                              "specdecpp_length": SPECDECPP_LENGTH, "stop_prompts": stop_prompts,
                              "vocabtrim_size": VOCABTRIM_SIZE, "stream_prompts": args.stream_prompts,
                              "stream_new_tokens": STREAM_NEW_TOKENS, "online_learner": LEARNER,
                              "child_acceptance": {f"{t:g}": rate for t, rate in rates.items()},
                              "head_child_acceptance": {f"{t:g}": rate for t, rate in head_rates.items()},
                              "threads": torch.get_num_threads()},
                   **machine(device),
                   "rows": [dict(r.__dict__, tokens_per_second=r.tokens_per_second) for r in rows],
                   "plain_chain_comparison_rows": [dict(r.__dict__, wasted_per_token=r.wasted_per_token)
                                                   for r in stop_rows],
                   "judge_comparison_rows": judge_rows,
                   "online_stream_rows": [dict(r.__dict__, acceptance=r.accepted / max(r.drafted, 1))
                                          for r in stream_rows],
                   **ratios}
        write_json(args.json, payload)
    return ratios


if __name__ == "__main__":
    main()
