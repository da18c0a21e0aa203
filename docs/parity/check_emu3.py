"""Parity of mmspec's Emu3 decoding with baaivision/Emu3's own generation loop (`image_generation.py`).

That loop is transformers' `generate` with `UnbatchedClassifierFreeGuidanceLogitsProcessor` (the negative prompt as a
second sequence, guidance on log-probabilities) and `PrefixConstrainedLogitsProcessor` over Emu3's own
`Emu3PrefixConstrainedLogitsHelper` (imported from the checkout: visual tokens, end-of-line at each row's end), its
prompts left-padded. Its remote model code is transformers' `Emu3ForConditionalGeneration`, which runs here on a tiny
random config. Compared: the guided law of every free image position (log-probabilities over the visual tokens) and
greedy tokens, for prompts of several lengths in one batch. Writes the results as JSON.

    python docs/parity/check_emu3.py --upstream path/to/Emu3 --deps path/to/deps --json eval/results/parity_emu3.json
"""
from common import arguments, greedy_and_guided, parity_row, randomised, score_recorder, upstream_commit, write

args = arguments(work=False)
import torch
from emu3.mllm.utils_emu3 import Emu3PrefixConstrainedLogitsHelper
from transformers import LogitsProcessorList, PrefixConstrainedLogitsProcessor
from transformers.generation import UnbatchedClassifierFreeGuidanceLogitsProcessor

from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.hf_image import PromptCondition
from tests.models.test_emu3 import BOI, BOS, EOF, EOI, EOL, EOS, PAD, WRAPPER, H, W, tiny_emu3

torch.set_grad_enabled(False)
model = randomised(tiny_emu3())
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


def repo_loop(cfg: float):
    """image_generation.py's generate, greedy: (span ids [B, SPAN], guided log-laws [B, SPAN, codes])."""
    input_ids, mask = left_padded(PROMPTS)
    negative = torch.tensor([NEGATIVE] * len(PROMPTS))
    helper = Emu3PrefixConstrainedLogitsHelper(
        height=torch.tensor([H]), width=torch.tensor([W]), img_token=WRAPPER, eoi_token=EOI, eos_token=EOS,
        eol_token=EOL, eof_token=EOF, pad_token=PAD, visual_tokens=visual.tolist())
    recorder = score_recorder(visual)
    processors = [UnbatchedClassifierFreeGuidanceLogitsProcessor(cfg, model, unconditional_ids=negative)] \
        if cfg != 1.0 else []
    processors += [PrefixConstrainedLogitsProcessor(helper, num_beams=1), recorder]
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=SPAN, do_sample=False,
                         logits_processor=LogitsProcessorList(processors), pad_token_id=PAD, eos_token_id=EOS)
    return out[:, input_ids.shape[1]:], torch.stack(recorder.steps, 1).log_softmax(-1)


results = {"upstream": "baaivision/Emu3", "commit": upstream_commit(args), "prompt_tokens": [len(p) for p in PROMPTS],
           "rows": []}
free = (torch.arange(SPAN) + 1) % (W + 1) != 0  # the span's positions that are not a forced end of line
input_ids, mask = left_padded(PROMPTS)
condition = PromptCondition(input_ids, mask, torch.tensor([NEGATIVE] * len(PROMPTS)))
for cfg in (1.0, 3.0, 4.0, 7.5):
    their_tokens, their_laws = repo_loop(cfg)
    local = (their_tokens[..., None] == adapter.token_ids).float().argmax(-1)  # BPE -> local ids
    ar, sjd, guided = greedy_and_guided(adapter, condition, local, cfg)
    ours = adapter.token_ids[ar], adapter.token_ids[sjd], guided[..., :-1]  # the codes' columns (last: end of line)
    results["rows"].append(parity_row(cfg, ours, (their_tokens, their_laws), free, law=True))
write(results, args)
