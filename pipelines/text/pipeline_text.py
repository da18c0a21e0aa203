"""Text completion with speculative decoding behind one call: tokenizer, target causal LM, optional draft LM, the
decoding component (a drafter's, `AR()` or `"auto"`), decoded completions, and which target
forward committed each token. It serves the `mmspec text` command and the demo's text tab; library users who hold
their own drafter call `mmspec.text.speculative_generate` directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, is_accelerate_available
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mmspec.adapters.causal_lm import CausalLMAdapter
from mmspec.core.component import DecodingComponent, component_from
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators
from mmspec.core.rules.base import rule_from
from mmspec.core.runtime.capture import StepGraphs
from mmspec.core.settings import specs
from mmspec.models.acceptance import AcceptanceHead
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.models.judge import JudgeHead
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.pipelines.base import MMSpecPipeline
from mmspec.text.kinds import ONLINE_DRAFTERS, check_max_new_tokens
from mmspec.text.methods import (
    TextDraftHeads,
    chain_drafters,
    check_reads,
    drafter_named,
    method_names,
    text_component,
)
from mmspec.text.online import OnlineDistillation, OnlineHeadDistillation
from mmspec.text.policy import TextDecodingPolicy
from mmspec.text.stats import TextStats
from mmspec.zoo import load_causal_lm, resolve_model

# a call that gives drafter= with decoding="auto" (the call's check and auto_candidates' own)
AUTO_CHOOSES_THE_DRAFTER = ("decoding='auto' chooses the drafter; name the drafter's decoding (decoding='ngram', ...) "
                            "to choose it")


@dataclass(frozen=True)
class TokenPiece:
    """One generated token as text: `step` is the target forward (verification step) that committed it and
    `from_draft` whether it was an accepted draft token (else the target drew it)."""

    text: str
    step: int
    from_draft: bool


@dataclass
class TextPipelineOutput(BaseOutput):
    """texts: the completions (new text only, special tokens skipped); sequences: [B, T + N] prompt ids then new ids,
    padded after EOS; pieces: per row, the new tokens as `TokenPiece`s (up to and including EOS); stats: counters."""

    texts: list[str]
    sequences: torch.Tensor
    pieces: list[list[TokenPiece]]
    stats: TextStats


class SpeculativeTextPipeline(MMSpecPipeline):
    r"""Speculative text completion with a transformers causal LM.

    Components:
        target ([`~transformers.PreTrainedModel`]): the causal LM whose output law (or greedy output) is kept.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): the target's tokenizer.
        draft ([`~transformers.PreTrainedModel`], *optional*): a small causal LM over the same vocabulary, the drafter
            of `TextDraftModel()` (`"model"`), `Cascade()` and `TextDraftTree()`.
        eagle_head ([`EagleHead`], *optional*), hydra_head ([`HydraHead`], *optional*): draft heads on the target's
            features, the drafters of `TextDraftHeads(kind="eagle" | "hydra")`.
        acceptance_head ([`AcceptanceHead`], *optional*): SpecDec++'s acceptance predictor for the draft, the stop
            rule of `TextDraftModel(schedule="learned")`.
        kangaroo_adapter ([`KangarooAdapter`], *optional*): Kangaroo's exit adapter on the target's first layers, the
            drafter of `Kangaroo()` (and of `SortedExits()`, one trained at several exits).
        judge_head ([`JudgeHead`], *optional*): judge decoding's judge on the target's features, read by the lossy
            rule `acceptance="judge"`.
        decoding (`"auto"`, `AR()` or a drafter's decoding, a name or a config dict; defaults to `"auto"`): what
            calls decode with unless they say otherwise; saved with the pipeline, swappable (`pipe.decoding = ...`).

    `"auto"` runs the fastest exact decoding for these models, this device, batch size and greedy or sampled
    decoding, timed on first use and cached (`mmspec.text.policy`; `stats.chosen_by` says which and why).
    `AR()` is the baseline: the target's own `generate` with its KV cache, one token per forward.

    Examples:
        ```py
        >>> import torch
        >>> from mmspec import PromptLookup, SpeculativeTextPipeline

        >>> pipe = SpeculativeTextPipeline.from_pretrained("pycode/target", draft="pycode/draft")
        >>> out = pipe("def fibonacci(n):\n", max_new_tokens=32)  # decoding="auto"
        >>> print(out.texts[0])
        >>> out = pipe("def fibonacci(n):\n", decoding=PromptLookup(draft_length=6))
        >>> print(out.stats.table())
        ```
    """

    _optional_components = ["draft", "eagle_head", "hydra_head", "acceptance_head", "kangaroo_adapter", "judge_head"]
    modality = "text"
    steps_instead = "max_new_tokens sets how many tokens it writes, the decoding how many target forwards they take"
    _callback_tensor_inputs = ["generated_ids", "new_tokens"]

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 draft: PreTrainedModel | None = None, eagle_head: EagleHead | None = None,
                 hydra_head: HydraHead | None = None, acceptance_head: AcceptanceHead | None = None,
                 kangaroo_adapter: KangarooAdapter | None = None, judge_head: JudgeHead | None = None,
                 decoding: DecodingComponent | str | dict = "auto"):
        super().__init__()
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocabulary size {draft.config.vocab_size} does not match the target's "
                             f"{target.config.vocab_size}")
        self.register_modules(target=target, tokenizer=tokenizer, draft=draft, eagle_head=eagle_head,
                              hydra_head=hydra_head, acceptance_head=acceptance_head,
                              kangaroo_adapter=kangaroo_adapter, judge_head=judge_head)
        self.decoding = decoding
        self.step_graphs: StepGraphs | None = None  # `enable_cuda_graphs`
        self.online: OnlineDistillation | None = None  # `enable_online_drafting`
        self.online_drafter = "model"  # what it trains: "model", "eagle" or "hydra"

    def enable_online_drafting(self, drafter: str = "model", **options) -> OnlineDistillation:
        """Keep a drafter learning from the target while the pipeline serves (online speculative decoding): the draft
        LM (`drafter="model"`, `mmspec.text.online.OnlineDistillation`), recorded on every call that drafts with it
        (`"model"`, `"cascade"`, `"tree"`, or auto's choice of one), or the EAGLE or Hydra head (`"eagle"`,
        `"hydra"`, `OnlineHeadDistillation`, with `unroll` too), recorded on every `"heads"` call of that kind.
        options: `every`, `buffer`, `steps`, `rows_per_step`, `lr`, `divergence`, `positions`, `seed`. Updates run
        in a background thread and are swapped in before a call, never during one, so every decoding stays exact.
        Off by default; returns the learner (its `updates` and `losses`)."""
        if drafter not in ONLINE_DRAFTERS:
            raise ValueError(f"drafter must be one of {ONLINE_DRAFTERS}, got {drafter!r}")
        learning = self.online_source(drafter)
        if learning is None and drafter == "model":
            raise ValueError("enable_online_drafting needs a draft LM (from_pretrained(..., draft=...))")
        if learning is None:
            raise ValueError(f"enable_online_drafting(drafter={drafter!r}) needs the pipeline's {drafter}_head")
        self.disable_online_drafting()
        if drafter == "model":
            self.online = OnlineDistillation(learning, **options)
        else:
            self.online = OnlineHeadDistillation(self.target, learning, **options)
        self.online_drafter = drafter
        return self.online

    def online_source(self, drafter: str) -> torch.nn.Module | None:
        """What `enable_online_drafting(drafter)` trains: the draft LM ("model") or the head of that kind (None if
        the pipeline has none)."""
        return self.draft if drafter == "model" else getattr(self, f"{drafter}_head", None)

    @staticmethod
    def online_drafter_for(decoding: str, settings: dict) -> str:
        """The drafter a call of `decoding` (a name) with `settings` drafts with, as `enable_online_drafting` names
        it: the head of its `kind` for "heads", else the draft LM ("model")."""
        return settings.get("kind", TextDraftHeads.kind) if decoding == "heads" else "model"

    def learns_online(self, decoding: DecodingComponent) -> bool:
        """Whether the online learner (if any) records a call of `decoding`: one that drafts with what it trains."""
        if self.online is None:
            return False
        if self.online_drafter == "model":
            return decoding.needs_draft_model()
        return isinstance(decoding, TextDraftHeads) and decoding.kind == self.online_drafter

    def disable_online_drafting(self) -> None:
        """Stop learning: a running update finishes and is swapped in; the draft keeps what it learned."""
        if self.online is not None:
            self.online.close()
            self.online = None

    def graph_stores(self, on: bool) -> None:
        """A speculative decoding's whole step — drafting, the target's forward, verification, commit, rollback —
        up to 16 steps per graph, on fixed-capacity caches (`speculative_generate(graphs=...)`), captured on a
        decoding's first call and replayed by later calls with the same settings and batch. AR runs the same loop
        drafting nothing (`mmspec.text.NoDrafter`), captured too, where it is transformers' `generate` without."""
        self.step_graphs = StepGraphs(cuda=True) if on else None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, draft: str | Path | PreTrainedModel | None = None,
                        **kwargs) -> SpeculativeTextPipeline:
        """A folder saved by `save_pretrained` (`model_index.json`), or a target causal LM — a zoo name
        ("pycode/target") or a transformers folder with its tokenizer — with `draft` (a zoo name, a folder or a
        model; optional). `dtype` defaults to float32 for a bare causal LM (the zoo stores float16). A bare causal
        LM's heads are loaded from `eagle_head/`, `hydra_head/`, `acceptance_head/`, `kangaroo_adapter/` and
        `judge_head/` beside its folder where they exist (the embedded `pycode/` ships them all), or given as
        `eagle_head=` / ... / `judge_head=` (a folder or a module)."""
        path = Path(resolve_model(pretrained_model_name_or_path, argument="target"))
        if isinstance(draft, (str, Path)):
            draft = load_causal_lm(resolve_model(draft, argument="draft"), dtype=kwargs.get("dtype"))[0]
        if draft is not None:
            kwargs["draft"] = draft
        if (path / "model_index.json").is_file() or not (path / "config.json").is_file():
            return super().from_pretrained(path, **kwargs)
        target, tokenizer = load_causal_lm(path, dtype=kwargs.pop("dtype", None))
        # without accelerate (the base install) diffusers would warn on every head's load that it falls back to this
        loading = dict(torch_dtype=target.dtype, low_cpu_mem_usage=is_accelerate_available())
        for name, head_class in (("eagle_head", EagleHead), ("hydra_head", HydraHead),
                                 ("acceptance_head", AcceptanceHead), ("kangaroo_adapter", KangarooAdapter),
                                 ("judge_head", JudgeHead)):
            head = kwargs.get(name, path.parent / name)
            if isinstance(head, (str, Path)):
                found = (Path(head) / "config.json").is_file()
                if not found and name in kwargs:
                    raise ValueError(f"{name}: no saved head in {head}")
                kwargs[name] = head_class.from_pretrained(head, **loading) if found else None
        return cls(target, tokenizer, **kwargs)

    @property
    def target_model(self) -> CausalLMAdapter:
        """The target behind the model protocol, what the decodings receive (`mmspec.adapters.CausalLMAdapter`)."""
        return CausalLMAdapter(self.target)

    @property
    def methods(self) -> tuple[str, ...]:
        """The names of `method_names()` this pipeline can run: the drafters it has the parts of (`"model"`,
        `"cascade"` and `"tree"` need a draft, `"layerskip"` an exit layer in the target's config, `"kangaroo"` an
        exit adapter, `"s2d"` one trained at several exits), the other registered decodings whose runtime parts it
        supplies (`"heads"`: an EAGLE head), and "ar"."""
        components = {name: self.component_named(name) for name in method_names()}
        unavailable = {name for name, c in components.items() if c.needs_draft_model()} if self.draft is None else set()
        if self.target_model.early_exit_layer is None:
            unavailable.add("layerskip")
        if self.kangaroo_adapter is not None and len(self.kangaroo_adapter.exits) < 2:
            unavailable.add("s2d")
        # and whatever needs a runtime part this pipeline cannot supply (an exit adapter, a draft head)
        unavailable |= {name for name, c in components.items() if self.supplied(c).unsupplied()}
        return tuple(name for name in components if name not in unavailable)

    component_named = staticmethod(text_component)

    @property
    def decoding_policy(self) -> TextDecodingPolicy:
        """What `decoding="auto"` asks: every method's tokens per second here, measured once, cached on disk. A choice
        holds for its batch size and sampling mode for the life of the pipeline until a run far off its figure; calls
        with a generator keep the choice the first of them was given even then (`reconsider()`, `remeasure()`)."""
        if getattr(self, "_decoding_policy", None) is None:
            self._decoding_policy = TextDecodingPolicy()
        return self._decoding_policy

    @decoding_policy.setter
    def decoding_policy(self, policy: TextDecodingPolicy) -> None:
        """Another policy (`TextDecodingPolicy(calibration_tokens=8, cache=...)`: shorter timing calls, a cache of
        its own)."""
        if not isinstance(policy, TextDecodingPolicy):
            raise TypeError(f"decoding_policy must be a TextDecodingPolicy, got {type(policy).__name__}")
        self._decoding_policy = policy

    def resolve_decoding(self, value: DecodingComponent | str | dict, **settings) -> DecodingComponent | str:
        """`"auto"`, or a component from an object, a config dict, or a registered name plus settings (`"ngram"`,
        `"heads"`, `"ar"`, a user's). `"speculative"` with `drafter=` names the drafter's decoding, and a config saved
        under that name loads as it (`TextSpeculation`)."""
        if isinstance(value, str) and value == "auto" and not settings:
            return value
        if isinstance(value, dict) and value.get("name") == "speculative":  # a config saved before each drafter had
            options = {key: v for key, v in value.items() if key != "name"}  # its own decoding: its drafter's fields
            cls = drafter_named(options.pop("drafter", "model"))
            value = {"name": cls.name, **{key: v for key, v in options.items() if key in cls.settings()}}
        if value == "speculative":
            value = drafter_named(settings.pop("drafter", None) or "model").name
        if isinstance(value, str) and value in method_names():
            check_reads(value, settings)
        return component_from(value, self.modality, names=("auto", *method_names()), **settings)

    def auto_candidates(self, settings: dict) -> dict[str, DecodingComponent]:
        """What `"auto"` chooses between: `AR()`, every chain drafter of `methods` that reads all of `settings` (a
        setting only some drafters read narrows the choice to them), and the EAGLE head's chain where the pipeline
        has one and the settings are its own. Tree drafters are named, not auto-chosen: a tree forward scores 16 to
        30 tokens, which only pays where that forward is nearly free (a GPU), and auto's first call would time them
        everywhere."""
        given = {key: value for key, value in settings.items() if value is not None}
        if "drafter" in given:
            raise ValueError(AUTO_CHOOSES_THE_DRAFTER)
        acceptance = rule_from(given.get("acceptance", "exact"), "text")
        if not acceptance.lossless:
            raise ValueError(f"decoding='auto' chooses among the exact decodings; name the decoding to use "
                             f"acceptance={acceptance.name!r}")
        chains, candidates = chain_drafters(), {}
        for name in self.methods:
            if name in chains and set(given) <= set(specs(chains[name])):
                candidates[name] = chains[name](**given)
            elif name == TextDraftHeads.name and set(given) <= TextDraftHeads.auto_settings:
                candidates[name] = TextDraftHeads(**given)
        if not candidates and set(given) - {"acceptance"}:
            raise ValueError(f"decoding='auto': no drafter of this pipeline ({', '.join(self.methods)}) takes "
                             f"{sorted(given)}")
        return {"ar": component_from("ar", self.modality), **candidates}

    @property
    def measured_modules(self) -> dict[str, torch.nn.Module | None]:
        """The modules whose identity keys `"auto"`'s cached timings."""
        return {"target": self.target, "draft": self.draft, "eagle_head": self.eagle_head,
                "kangaroo_adapter": self.kangaroo_adapter}

    def check_inputs(self, prompt) -> list[str]:
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"prompt must be a str or a non-empty list of str, got {type(prompt).__name__}")
        empty = [i for i, p in enumerate(prompts) if not p.strip()]
        if empty:
            raise ValueError(f"prompt {empty[0]} is empty (or only whitespace); give text to complete")
        return prompts

    def check_lengths(self, prompts: list[str], max_new_tokens: int) -> None:
        """max_new_tokens an int >= 1, and the longest prompt and its new tokens within the target's context."""
        check_max_new_tokens(max_new_tokens)
        context = self.target_model.context_length
        longest = max(len(ids) for ids in self.tokenizer(prompts, verbose=False)["input_ids"])
        if context is not None and longest + max_new_tokens > context:
            raise ValueError(f"prompt length {longest} + max_new_tokens {max_new_tokens} exceeds the target's context "
                             f"of {context} positions")

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: Generators = None,
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        decoding: DecodingComponent | str | dict | None = None,
        method: str | None = None,
        **decoding_settings,
    ) -> TextPipelineOutput | tuple:
        r"""Complete `prompt` (one or a batch, decoded together with per-row acceptance).

        Args:
            prompt (`str` or `list[str]`): text to complete; a list is one batch.
            max_new_tokens (`int`, defaults to 64): new tokens per row at most (a row also ends at EOS).
            temperature (`float`, defaults to 0): 0 is greedy (token for token the target's greedy output).
            top_k (`int`, defaults to 0), top_p (`float`, defaults to 1.0): the target's sampling filters; 0 / 1 = off.
            generator (`torch.Generator` or list, *optional*): one, or one per prompt; successive calls with one
                generator draw on from where the last left it. `AR()` samples with transformers' `generate` on the
                global RNG, forked for the call and seeded with a draw of this generator (one generator only).
            return_dict (`bool`, defaults to `True`): return a [`TextPipelineOutput`] instead of `(texts, stats)`.
            callback_on_step_end (`Callable`, *optional*): called after every target forward as
                `callback_on_step_end(pipe, step, n_generated, callback_kwargs)` (n_generated: the fewest new tokens of
                a row still generating); `callback_kwargs` holds the tensors named in
                `callback_on_step_end_tensor_inputs` (`"generated_ids"`: [B, max_new_tokens], each row's new tokens so
                far then padding; `"new_tokens"`: [B]). Read-only (they sit in the KV cache). Set
                `pipe._interrupt = True` to end every row there.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): see above; defaults to `["generated_ids"]`.
            decoding (component, name or config dict, *optional*): defaults to the pipeline's `decoding` (`"auto"`
                unless set or saved otherwise). A registered text decoding (`mmspec.core.registry.decodings("text")`:
                each drafter's (`TextDraftModel`, `PromptLookup`, ..., and any registered beside them),
                `TextDraftHeads`, `AR()`), or its name (`pipe.methods` lists what this pipeline can run). A name plus
                settings is the same call (`decoding="ngram", draft_length=6`).
            **decoding_settings: the named decoding's settings (`mmspec.core.settings.specs(PromptLookup)` lists
                them with their help; `mmspec text --help` shows them as flags), `acceptance` and the rules' flat
                spellings (`typical_epsilon`, ...), for the named decoding or the pipeline's own component; with
                `"auto"` they narrow its candidates to the drafters that read them (`acceptance="typical"` is lossy:
                name the decoding).
            method (`str`, *optional*): the old spelling of `decoding` (`"auto"`, `"ar"` or a drafter's name).
        """
        # 1. Check inputs and resolve the decoding
        prompts = self.check_inputs(prompt)
        names = self.callback_tensor_inputs(callback_on_step_end, callback_on_step_end_tensor_inputs)
        if method is not None:
            if decoding is not None:
                raise ValueError("give decoding= or its old spelling method=, not both")
            decoding = method
        drafter = decoding_settings.pop("drafter", None)  # `drafter=` names the method (TextSpeculation's spelling)
        if drafter is not None:
            if decoding == "auto":
                raise ValueError(AUTO_CHOOSES_THE_DRAFTER)
            if decoding not in (None, "speculative", drafter):
                raise ValueError(f"decoding={decoding!r} names its drafter; drafter={drafter!r} contradicts it")
            decoding = drafter
        sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
        SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)  # refused here, before auto times anything
        self.check_lengths(prompts, max_new_tokens)
        chosen_by = None
        auto = decoding == "auto" or decoding is None and self.decoding == "auto"
        if auto:  # settings narrow auto's candidates to the drafters that read them
            self.check_keywords(decoding_settings)
            candidates = self.auto_candidates(decoding_settings)
            key = self.decoding_policy.key(len(prompts), temperature, candidates)
            name, chosen_by = self.decoding_policy.choose(self, prompts, candidates, sampling,
                                                          seeded=generator is not None)
            decoding = candidates[name]
        else:
            decoding = self.decoding_for_call(decoding, decoding_settings)
        decoding.check_sampling(temperature)

        # 2. Decode
        started = time.perf_counter()
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")  # as generate needs
        ids, mask = encoded["input_ids"].to(self.target.device), encoded["attention_mask"].to(self.target.device)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        self.replays_graphs()
        online = self.online if self.learns_online(decoding) else None
        if online is not None:
            online.before_request()
        draft = None if self.draft is None else CausalLMAdapter(self.draft)
        steps = self.supplied(decoding).run(self.target_model, draft, ids, mask, eos_token_id=eos, pad_token_id=pad,
                                            generator=generator, graphs=self.step_graphs,
                                            block=None if callback_on_step_end is None else 1, **sampling)
        result = self.run_decoding(steps, callback_on_step_end, names, total=max_new_tokens)
        sequences, stats = result.sequences, result.stats
        if chosen_by is not None:
            stats.chosen_by = chosen_by
            if not self._interrupt:
                gap = self.decoding_policy.record(key, name, int(stats.new_tokens.sum()),
                                                  time.perf_counter() - started, len(prompts))
                if gap is not None:
                    stats.chosen_by += f"; {gap}"
        stats.describe(decoding)
        if online is not None:
            online.after_request(self.target, sequences, mask, stats)

        # 3. Decode to text
        new = sequences[:, ids.shape[1] :]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        if not return_dict:
            return texts, stats
        pieces = [self._pieces(new[b, : int(stats.new_tokens[b])], stats, b) for b in range(len(prompts))]
        return TextPipelineOutput(texts=texts, sequences=sequences, pieces=pieces, stats=stats)

    def _pieces(self, new_ids: torch.Tensor, stats: TextStats, row: int) -> list[TokenPiece]:
        """Row `row`'s new tokens as text pieces: each token's text is what it adds to the decoded prefix (so
        multi-token characters and leading spaces come out right)."""
        pieces, previous = [], ""
        for i in range(new_ids.shape[0]):
            text = self.tokenizer.decode(new_ids[: i + 1], skip_special_tokens=True)
            pieces.append(TokenPiece(text[len(previous) :], int(stats.acceptance_map[row, i]),
                                     bool(stats.from_draft[row, i])))
            previous = text
        return pieces
