"""Parity of mmspec's Lumina-mGPT decoding with Alpha-VLLM/Lumina-mGPT's own logits processors.

Its loop is transformers' `generate` with three processors of `lumina_mgpt/inference_solver.py`: the image-start
triggered CFG (its unconditional context: the image-start and grid tokens alone), the image structure (image tokens
only, new-lines and image end forced) and the interleaved top-k. Those classes are taken from the checkout as written
(the file's model imports are not run; the one edit: their masks are built on the CPU instead of "cuda"), with the
hard-coded ids of Chameleon's vocabulary, on a tiny random Chameleon that has that vocabulary's layout (image tokens at
4..8195, grid tokens from 8804). Prompts of several lengths, left-padded, end with the image-start and grid tokens (the
size the text asks for; its loop lets the model write them). Compared: the guided law of every free image position
(log-probabilities over the codes) and greedy tokens. Writes the results as JSON.

    python docs/parity/check_lumina_mgpt.py --upstream path/to/Lumina-mGPT --deps path/to/deps \\
        --json eval/results/parity_lumina_mgpt.json
"""
import ast
import contextlib
import copy
import io
import math
from pathlib import Path
from typing import Optional

from common import arguments, greedy_and_guided, parity_row, randomised, score_recorder, upstream_commit, write

args = arguments(work=False)
import torch
import transformers
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from mmspec.models.hf_image import PromptCondition
from mmspec.models.lumina_mgpt import LuminaMGPTAdapter, grid_token
from tests.models.test_lumina_mgpt import tiny_chameleon

torch.set_grad_enabled(False)
CODES, H, W = 8192, 4, 4  # Chameleon's codebook; a 4 x 4-token image = 2 x 2 patches
BOS, PAD, EOS, END, START, SEP, NEW_LINE = 0, 1, 2, 8196, 8197, 8710, 8803
WORDS = range(8200, 8260)


def upstream_processors() -> dict:
    """The three processor classes of inference_solver.py, executed from its source."""
    source = (Path(args.upstream) / "lumina_mgpt" / "inference_solver.py").read_text()
    wanted = ("LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor", "MultiModalLogitsProcessor",
              "InterleavedTopKLogitsWarper")
    classes = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name in wanted]
    code = "\n\n".join(ast.get_source_segment(source, node) for node in classes).replace('device="cuda"',
                                                                                        'device="cpu"')
    namespace = {"torch": torch, "math": math, "copy": copy, "transformers": transformers,
                 "LogitsProcessor": LogitsProcessor, "LogitsWarper": LogitsProcessor, "Optional": Optional}
    exec(compile(code, "inference_solver.py", "exec"), namespace)  # noqa: S102  (the authors' classes, as written)
    return {name: namespace[name] for name in wanted}


def tiny_random_chameleon():
    """A tiny Lumina-mGPT with the ids of Chameleon's vocabulary, its weights drawn at random."""
    vocab = {"<s>": BOS, "<pad>": PAD, "</s>": EOS, "<unk>": 3, "<eoss>": END, "<racm3:break>": START,
             "<reserved08706>": SEP, "<reserved08799>": NEW_LINE, "<image>": 8711}
    vocab.update({grid_token(n): 8804 + n for n in range(1, 9)})
    vocab.update({f"w{i}": i for i in WORDS})
    model, vqgan = tiny_chameleon(vocab, vocab_size=8830, codes=CODES, first_image_id=4, pad=PAD, bos=BOS, eos=EOS)
    return randomised(model), vqgan


model, vqgan = tiny_random_chameleon()
adapter = LuminaMGPTAdapter(model, vqgan, H, W)
codes_bpe = adapter.token_ids[:-1]  # the BPE id of each code, in local order
SUFFIX = adapter.prompt_suffix.tolist()
PROMPTS = [[BOS, 8200, SEP, *SUFFIX], [BOS, 8201, 8202, 8203, 8204, SEP, *SUFFIX],
           [BOS, *range(8205, 8214), SEP, *SUFFIX]]
SPAN = H * (W + 1)
ids = torch.tensor([[PAD] * (max(map(len, PROMPTS)) - len(p)) + p for p in PROMPTS])
mask = (torch.arange(ids.shape[1]) >= ids.shape[1] - torch.tensor([len(p) for p in PROMPTS])[:, None]).long()


def repo_loop(cfg: float, classes: dict):
    """generate with the authors' processors (image top-k at the codebook size: every code kept), greedy: (span ids
    [B, SPAN], guided log-laws over the codes [B, SPAN, CODES])."""
    recorder = score_recorder(codes_bpe)
    processors = LogitsProcessorList([
        classes["LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor"](
            guidance_scale=cfg, model=model, image_start_token_id=START, image_end_token_id=END,
            image_next_line_token_id=NEW_LINE, patch_size=32),
        classes["MultiModalLogitsProcessor"](image_start_token_id=START, image_end_token_id=END,
                                             image_next_line_token_id=NEW_LINE, patch_size=32,
                                             voc_size=model.config.vocab_size),
        classes["InterleavedTopKLogitsWarper"](image_top_k=CODES, text_top_k=10, image_start_token_id=START,
                                               image_end_token_id=END),
        recorder])
    config = GenerationConfig(max_new_tokens=SPAN, do_sample=False, top_k=None, eos_token_id=[SEP],
                              pad_token_id=PAD)
    with contextlib.redirect_stdout(io.StringIO()):  # the processors print every new line
        out = model.generate(ids, config, attention_mask=mask, logits_processor=processors)
    return out[:, ids.shape[1]:], torch.stack(recorder.steps, 1).log_softmax(-1)


classes = upstream_processors()
results = {"upstream": "Alpha-VLLM/Lumina-mGPT", "commit": upstream_commit(args),
           "prompt_tokens": [len(p) for p in PROMPTS], "rows": []}
free = (torch.arange(SPAN) + 1) % (W + 1) != 0
condition = PromptCondition(ids, mask)
for cfg in (1.0, 3.0, 4.0, 7.5):
    their_tokens, their_laws = repo_loop(cfg, classes)
    local = (their_tokens[..., None] == adapter.token_ids).float().argmax(-1)  # BPE -> local ids
    ar, sjd, guided = greedy_and_guided(adapter, condition, local, cfg)
    ours = adapter.to_bpe(ar), adapter.to_bpe(sjd), guided[..., :-1]  # the codes' columns (last: new line)
    results["rows"].append(parity_row(cfg, ours, (their_tokens, their_laws), free, law=True))
write(results, args)
