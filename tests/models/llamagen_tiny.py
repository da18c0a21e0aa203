"""Tiny LlamaGen-architecture components built in code (no hub): t2i / c2i GPTs, a VQ tokenizer, a word-level
tokenizer and a T5 text encoder."""

import torch

WORDS = ["[PAD]", "[UNK]", "a", "red", "blue", "green", "circle", "square", "on", "the", "left"]
TEXT_CONTEXT = 6


def tiny_transformer(model_type: str = "t2i", grid_size: int = 4, vocab_size: int = 24, seed: int = 0,
                     dtype=torch.float64):
    from mmspec.models.llamagen.gpt import LlamaGenTransformer

    torch.manual_seed(seed)
    model = LlamaGenTransformer(
        vocab_size=vocab_size, dim=32, n_layer=2, n_head=4, n_kv_head=2, multiple_of=16, model_type=model_type,
        num_classes=5, caption_dim=16, cls_token_num=TEXT_CONTEXT if model_type == "t2i" else 1, grid_size=grid_size,
        token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0,
    )
    for param in model.parameters():  # the official init zeroes the head; random weights make every test meaningful
        torch.nn.init.normal_(param, std=0.5)
    return model.to(dtype).eval()


def tiny_vq(vocab_size: int = 24, seed: int = 0, dtype=torch.float64):
    from mmspec.models.llamagen.vq import LlamaGenVQModel

    torch.manual_seed(seed)
    return LlamaGenVQModel(codebook_size=vocab_size, codebook_embed_dim=4, ch=32, ch_mult=(1, 1), num_res_blocks=1,
                           z_channels=32).to(dtype).eval()


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


def tiny_text_encoder(seed: int = 0, dtype=torch.float64):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(WORDS), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, dropout_rate=0.0)
    return T5EncoderModel(config).to(dtype).eval()


def tiny_pipeline(dtype=torch.float64):
    from mmspec.pipelines.llamagen import LlamaGenPipeline

    pipe = LlamaGenPipeline(tiny_transformer(dtype=dtype), tiny_vq(dtype=dtype), tiny_tokenizer(),
                            tiny_text_encoder(dtype=dtype))
    pipe.set_progress_bar_config(disable=True)
    return pipe
