"""Parity of mmspec's Emu3 decoding with baaivision/Emu3's own generation loop (`image_generation.py`).

That loop is transformers' `generate` with `UnbatchedClassifierFreeGuidanceLogitsProcessor` (the negative prompt as a
second sequence, guidance on log-probabilities) and `PrefixConstrainedLogitsProcessor` over Emu3's own
`Emu3PrefixConstrainedLogitsHelper` (imported from the checkout: visual tokens, end-of-line at each row's end), its
prompts left-padded. Its remote model code is transformers' `Emu3ForConditionalGeneration`, which runs here on a tiny
random config. Compared: the guided law of every free image position (log-probabilities over the visual tokens) and
greedy tokens, for prompts of several lengths in one batch. Writes the results as JSON.

    python docs/parity/check_emu3.py --upstream path/to/Emu3 --deps path/to/deps --json eval/results/parity_emu3.json
"""
from common import arguments, upstream_commit, write

args = arguments(work=False)
import torch
from transformers import LogitsProcessor, LogitsProcessorList, PrefixConstrainedLogitsProcessor
from transformers.generation import UnbatchedClassifierFreeGuidanceLogitsProcessor

from emu3.mllm.utils_emu3 import Emu3PrefixConstrainedLogitsHelper
from mmspec.core.probs import SamplingConfig
from mmspec.image import AR, SJD
from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.hf_image import PromptCondition
from tests.models.family_checks import run
from tests.models.test_emu3 import BOI, BOS, EOF, EOI, EOL, EOS, H, PAD, W, WRAPPER, tiny_emu3

torch.set_grad_enabled(False)
model = tiny_emu3()
for parameter in model.parameters():  # transformers' init is near zero: logits would tie and compare trivially
    torch.nn.init.normal_(parameter, std=0.2)
adapter = Emu3Adapter(model, H, W)
visual = adapter.token_ids[:-1]  # the BPE ids of the codes (the last local id is the end-of-line token)
SPAN = H * (W + 1)
PROMPTS = [[BOS, 5, BOI, 8, 9, WRAPPER], [BOS, 10, 11, 12, 6, BOI, 8, 9, WRAPPER],
           [BOS, 13, 5, 14, 9, 20, 21, 22, 7, BOI, 8, 9, WRAPPER]]
NEGATIVE = [BOS, 20, 21, 23, BOI, 8, 9, WRAPPER]  # the negative prompt, the same for every row


def left_padded(rows):
    T = max(len(r) for r in rows)
    return (torch.tensor([[PAD] * (T - len(r)) + r for r in rows]),
            torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows]))


class Recorder(LogitsProcessor):
    """The guided, constrained scores of every step, over the visual tokens."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores[:, visual].clone())
        return scores


def repo_loop(cfg: float):
    """image_generation.py's generate, greedy: (span ids [B, SPAN], guided log-laws [B, SPAN, codes])."""
    input_ids, mask = left_padded(PROMPTS)
    negative = torch.tensor([NEGATIVE] * len(PROMPTS))
    helper = Emu3PrefixConstrainedLogitsHelper(
        height=torch.tensor([H]), width=torch.tensor([W]), img_token=WRAPPER, eoi_token=EOI, eos_token=EOS,
        eol_token=EOL, eof_token=EOF, pad_token=PAD, visual_tokens=visual.tolist())
    recorder = Recorder()
    processors = [UnbatchedClassifierFreeGuidanceLogitsProcessor(cfg, model, unconditional_ids=negative)] \
        if cfg != 1.0 else []
    processors += [PrefixConstrainedLogitsProcessor(helper, num_beams=1), recorder]
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=SPAN, do_sample=False,
                         logits_processor=LogitsProcessorList(processors), pad_token_id=PAD, eos_token_id=EOS)
    return out[:, input_ids.shape[1]:], torch.stack(recorder.steps, 1).log_softmax(-1)


def ours(cfg: float, tokens: torch.Tensor):
    """(greedy AR, greedy SJD span ids [B, SPAN], guided log-laws [B, SPAN, codes] teacher-forced on `tokens`)."""
    input_ids, mask = left_padded(PROMPTS)
    condition = PromptCondition(input_ids, mask, torch.tensor([NEGATIVE] * len(PROMPTS)))
    sampling = SamplingConfig(0, guidance_scale=cfg)
    ar, _ = run(AR(), adapter, condition, sampling)
    sjd, _ = run(SJD(window=5), adapter, condition, sampling)
    local = (tokens[..., None] == adapter.token_ids).float().argmax(-1)  # BPE -> local ids
    state, first = adapter.prefill(condition, cfg=cfg != 1.0)
    rest = adapter.forward(local[:, :-1], state)
    cond = torch.cat([first.cond, rest.cond], 1)[..., :-1]
    guided = cond
    if cfg != 1.0:
        uncond = torch.cat([first.uncond, rest.uncond], 1)[..., :-1]
        guided = uncond + cfg * (cond - uncond)
    return adapter.token_ids[ar], adapter.token_ids[sjd], guided.log_softmax(-1)


results = {"upstream": "baaivision/Emu3", "commit": upstream_commit(args), "prompt_tokens": [len(p) for p in PROMPTS],
           "rows": []}
free = (torch.arange(SPAN) + 1) % (W + 1) != 0  # the span's positions that are not a forced end of line
for cfg in (1.0, 3.0, 4.0, 7.5):
    their_tokens, their_laws = repo_loop(cfg)
    ar, sjd, laws = ours(cfg, their_tokens)
    results["rows"].append({
        "guidance": cfg,
        "guided_log_law_max_abs_diff": float((laws - their_laws)[:, free].abs().max()),
        "log_law_scale": float(their_laws[:, free].abs().max()),
        "greedy_ar_equal": float((ar == their_tokens).float().mean()),
        "greedy_sjd_equal": float((sjd == their_tokens).float().mean()),
    })
write(results, args)
