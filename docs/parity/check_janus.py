"""Parity of mmspec's Janus decoding with deepseek-ai/Janus's own generation loop (`generation_inference.py`).

Janus's model code cannot be built offline here (its `MultiModalityCausalLM` hard-codes the full-size VQ and needs
`attrdict`, which Python 3.11 cannot import), and transformers' `JanusForConditionalGeneration` is its port. So its
loop — the prompt rows and their twins with `tokens[1:-1] = pad_id` (pads attended), `gen_head` logits, `uncond +
cfg_weight * (cond - uncond)`, image tokens entering through the generation embeddings — runs here as that file
writes it, one prompt at a time, greedy, on a tiny random port. Ours runs the prompts of every length in one
left-padded batch. Writes the results as JSON.

    python docs/parity/check_janus.py --upstream path/to/Janus --deps path/to/deps --json eval/results/parity_janus.json
"""
from common import arguments, greedy_and_guided, parity_row, randomised, upstream_commit, write

args = arguments(work=False)
import torch

from mmspec.models.hf_image import PromptCondition
from mmspec.models.janus import JanusAdapter
from tests.models.test_janus import BOI, BOS, PAD, tiny_janus

torch.set_grad_enabled(False)
model = randomised(tiny_janus())
N = model.config.vision_config.num_image_tokens
PROMPTS = [[BOS, 5, BOI], [BOS, 9, 10, 11, 12, BOI], [BOS, 13, 5, 14, 9, 20, 21, 22, 23, BOI]]


def repo_loop(input_ids: list[int], cfg_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """generation_inference.py's `generate` for one prompt (parallel_size 1), greedy: (tokens [N], guided logits
    [N, V])."""
    ids = torch.tensor(input_ids)
    tokens = torch.stack([ids, ids])
    tokens[1, 1:-1] = PAD
    inputs_embeds = model.get_input_embeddings()(tokens)
    past, generated, guided = None, [], []
    for _ in range(N):
        outputs = model.model.language_model(inputs_embeds=inputs_embeds, use_cache=True, past_key_values=past)
        past = outputs.past_key_values
        logits = model.model.generation_head(outputs.last_hidden_state[:, -1, :])
        logit_cond, logit_uncond = logits[0::2, :], logits[1::2, :]
        logits = logit_uncond + cfg_weight * (logit_cond - logit_uncond)
        next_token = logits.argmax(-1)
        generated.append(next_token)
        guided.append(logits[0])
        inputs_embeds = model.prepare_embeddings_for_image_generation(torch.cat([next_token, next_token]))[:, None]
    return torch.cat(generated), torch.stack(guided)


longest = max(len(p) for p in PROMPTS)
condition = PromptCondition(torch.tensor([[PAD] * (longest - len(p)) + p for p in PROMPTS]),
                            torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in PROMPTS]))
results = {"upstream": "deepseek-ai/Janus", "commit": upstream_commit(args), "prompt_tokens": [len(p) for p in PROMPTS],
           "rows": []}
for cfg_weight in (1.0, 4.0, 5.0, 7.5):
    theirs = [repo_loop(p, cfg_weight) for p in PROMPTS]
    their_tokens, their_logits = torch.stack([t for t, _ in theirs]), torch.stack([g for _, g in theirs])
    ours = greedy_and_guided(JanusAdapter(model), condition, their_tokens, cfg_weight)
    results["rows"].append(parity_row(cfg_weight, ours, (their_tokens, their_logits)))
write(results, args)
