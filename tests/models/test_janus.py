"""JanusAdapter on a tiny random JanusForConditionalGeneration (built in code, offline): AR through the adapter equals
transformers' own image-mode generate token for token (greedy, CFG), SJD equals AR greedily, the ragged cache after
every SJD iteration equals a fresh prefill of the committed prefix, LANTERN's neighbour table builds from the
codebook, clear errors."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.image import AR
from mmspec.models.janus import JanusAdapter, JanusCondition
from tests.models.family_checks import (
    check_cache_and_its_mutation,
    check_draft_heads_read_the_family_s_features,
    check_first_two_tokens_follow,
    check_greedy_sjd_equals_ar,
    check_lantern_table,
    exact_law_of_the_first_two_tokens,
    run,
)

BOS, PAD, BOI = 2, 1, 3


def tiny_janus(seed: int = 0):
    from transformers import JanusConfig, JanusForConditionalGeneration

    config = JanusConfig(
        text_config={"model_type": "llama", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "intermediate_size": 37, "max_position_embeddings": 512,
                     "pad_token_id": PAD},
        vision_config={"image_size": 20, "patch_size": 5, "num_image_tokens": 16, "hidden_size": 32,
                       "projection_dim": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "mlp_ratio": 2},
        vq_config={"embed_dim": 12, "num_embeddings": 12, "latent_channels": 12, "base_channels": 32,
                   "channel_multiplier": [1, 1], "projection_dim": 32, "image_token_embed_dim": 32},
        image_token_id=0)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config).eval()
    model.generation_config.generation_kwargs = {"boi_token_id": BOI}
    model.generation_config.bos_token_id, model.generation_config.pad_token_id = BOS, PAD
    model.generation_config._from_model_config = False  # a checkpoint's own generation_config.json, kept on reload
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_janus()


PROMPTS = torch.tensor([[BOS, 5, 6, 7, 8, BOI], [BOS, 9, 10, 11, 12, BOI], [BOS, 13, 5, 14, 9, BOI]])


def test_greedy_ar_through_the_adapter_equals_transformers_image_generate(model):
    adapter = JanusAdapter(model)
    assert adapter.grid == (4, 4) and adapter.vocab_size == 12
    for guidance in (1.5, 2.0, 5.0):  # transformers' image loop needs CFG > 1 (at 1 its scores keep both halves)
        ours, stats = run(AR(), adapter, JanusCondition(PROMPTS), SamplingConfig(0, guidance_scale=guidance))
        with torch.no_grad():
            theirs = model.generate(input_ids=PROMPTS, attention_mask=torch.ones_like(PROMPTS),
                                    generation_mode="image", do_sample=False, guidance_scale=guidance)
        assert torch.equal(ours, theirs), guidance
        assert stats.target_forwards == 16


def test_left_padded_prompts_give_each_prompt_its_own_image(model):
    adapter = JanusAdapter(model)
    short = torch.tensor([[PAD, PAD, BOS, 7, 8, BOI]])
    mask = (short != PAD).long()
    greedy = SamplingConfig(0, guidance_scale=3.0)
    padded, _ = run(AR(), adapter, JanusCondition(torch.cat([short, PROMPTS[:1]]),
                                                          torch.cat([mask, torch.ones(1, 6, dtype=torch.long)])),
                    greedy)
    alone, _ = run(AR(), adapter, JanusCondition(short[:, 2:]), greedy)
    first, _ = run(AR(), adapter, JanusCondition(PROMPTS[:1]), greedy)
    assert torch.equal(padded[0], alone[0]) and torch.equal(padded[1], first[0])


def test_greedy_sjd_equals_greedy_ar(model):
    check_greedy_sjd_equals_ar(JanusAdapter(model), JanusCondition(PROMPTS), 3.0)


def test_draft_heads_read_janus_s_features_and_a_head_that_skips_the_readout_is_caught(model):
    check_draft_heads_read_the_family_s_features(JanusAdapter(model), JanusCondition(PROMPTS))
    skipping = JanusAdapter(model)  # mutation: logits read without the readout module, so no tap catches features
    skipping.head = lambda output: skipping.image_logits(output.last_hidden_state)
    with pytest.raises(AssertionError):
        check_draft_heads_read_the_family_s_features(skipping, JanusCondition(PROMPTS))


def test_cache_equals_a_fresh_prefill_after_every_iteration_and_a_skipped_rollback_is_caught(model):
    ids = torch.cat([torch.tensor([[PAD, BOS, 7, 8, 9, BOI]]), PROMPTS[1:]])
    check_cache_and_its_mutation(JanusAdapter(model), JanusCondition(ids, (ids != PAD).long()))


def test_sampled_ar_and_transformers_sampling_follow_the_same_law(model):
    """Seeded sampling cannot match draw for draw (different random streams); both samplers' first two tokens are
    chi-square tested against the exact law (CFG 2, top-k 6), and a stale law is rejected."""
    adapter, rows = JanusAdapter(model), 4000
    sampling = SamplingConfig(1.0, top_k=6, guidance_scale=2.0)
    law = exact_law_of_the_first_two_tokens(adapter, JanusCondition(PROMPTS[:1]), sampling)
    no_cfg = exact_law_of_the_first_two_tokens(adapter, JanusCondition(PROMPTS[:1]), SamplingConfig(1.0, top_k=6))
    ours, _ = run(AR(), adapter, JanusCondition(PROMPTS[:1].expand(rows, -1)), sampling,
                  torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    with torch.no_grad():
        theirs = model.generate(input_ids=PROMPTS[:1].expand(rows, -1), attention_mask=torch.ones(rows, 6),
                                generation_mode="image", do_sample=True, top_k=6, guidance_scale=2.0)
    check_first_two_tokens_follow(law, ours, adapter.vocab_size, wrong_law=no_cfg)
    check_first_two_tokens_follow(law, theirs, adapter.vocab_size)


def test_decode_and_lantern_neighbours_from_the_codebook(model):
    adapter = JanusAdapter(model)
    images = adapter.decode(torch.zeros(2, 16, dtype=torch.long))
    assert images.shape == (2, 3, 8, 8)
    check_lantern_table(adapter)


def test_clear_errors(model):
    with pytest.raises(TypeError, match="must be a transformers JanusForConditionalGeneration"):
        JanusAdapter(torch.nn.Linear(2, 2))
    broken = tiny_janus()
    broken.generation_config.generation_kwargs = {}
    with pytest.raises(ValueError, match=r"lacks \['generation_kwargs\[\"boi_token_id\"\]'\]"):
        JanusAdapter(broken)
    with pytest.raises(ValueError, match=r"tokens must have shape \[3, W\]"):
        adapter = JanusAdapter(model)
        state, _ = adapter.prefill(JanusCondition(PROMPTS), cfg=False)
        adapter.forward(torch.zeros(2, 1, dtype=torch.long), state)
