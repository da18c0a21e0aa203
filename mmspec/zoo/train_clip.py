"""Train the embedded in-domain CLIP (a small transformers `CLIPModel`) contrastively on the captioned synthetic scenes
of `mmspec.zoo.shapes`, offline, on CPU. It is the evaluation model of the embedded world: CLIP score of generated
images against their captions, and, through its image tower, the feature extractor of in-domain FID ("FD-CLIP").

    python -m mmspec.zoo.train_clip              # default budget (~20 min on 2 CPU cores) -> mmspec/zoo/shapes_clip
    python -m mmspec.zoo.train_clip --steps 20   # re-running resumes from the work dir's checkpoint

The scene pools are those of `mmspec.zoo.train_image` (rendered once and cached in the same work dir). The saved folder
loads with `CLIPModel.from_pretrained` and `CLIPProcessor.from_pretrained` (word-level tokenizer with [BOS]/[EOS],
64x64 images), exactly like a local OpenAI CLIP folder. Held-out retrieval top-1 (image->text and text->image, a hit
when the retrieved caption is the true caption's text) is written to `training_metrics.json` for the model card.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from mmspec.zoo import IMAGE_CLIP, ZOO_DIR
from mmspec.zoo.shapes import CAPTION_WORDS
from mmspec.zoo.train_image import IMAGE_SIZE, add_pool_arguments, load_pools
from mmspec.zoo.training import train_loop

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
TEXT_CONTEXT = 18  # [BOS] + the longest caption (14 words) + [EOS], with room to spare
TEXT_CONFIG = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 4,
               "max_position_embeddings": TEXT_CONTEXT}
VISION_CONFIG = {"image_size": IMAGE_SIZE, "patch_size": 8, "hidden_size": 128, "intermediate_size": 512,
                 "num_hidden_layers": 4, "num_attention_heads": 4}
PROJECTION_DIM = 128
SEED = 40


def build_processor():
    """CLIPProcessor: word-level tokenizer over the caption grammar ("[BOS] words [EOS]", right padding; CLIP pools
    the text at [EOS]) and a 64x64 image processor with OpenAI CLIP's normalisation."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import CLIPImageProcessorPil, CLIPProcessor, PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate([*SPECIAL_TOKENS, *CAPTION_WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", vocab["[BOS]"]), ("[EOS]", vocab["[EOS]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        bos_token="[BOS]", eos_token="[EOS]", model_max_length=TEXT_CONTEXT)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)


def build_model(processor):
    from transformers import CLIPConfig, CLIPModel

    tokenizer = processor.tokenizer
    text_config = {**TEXT_CONFIG, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                   "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return CLIPModel(CLIPConfig(text_config=text_config, vision_config=VISION_CONFIG, projection_dim=PROJECTION_DIM))


def pixel_values(processor, images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 64, 64, 3] -> normalised float [N, 3, 64, 64], what the processor gives at this size (no resize)."""
    mean = torch.tensor(processor.image_processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_processor.image_std).view(1, 3, 1, 1)
    return (images.permute(0, 3, 1, 2).float() / 255 - mean) / std


@torch.no_grad()
def embed(model, processor, images: torch.Tensor, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """l2-normalised (image embeddings [N, D], caption embeddings [N, D])."""
    image_embeds, text_embeds = [], []
    for start in range(0, len(captions), 256):
        chunk = slice(start, start + 256)
        text = processor.tokenizer(captions[chunk], padding=True, return_tensors="pt")
        image_embeds.append(model.get_image_features(pixel_values(processor, images[chunk])).pooler_output)
        text_embeds.append(model.get_text_features(**text).pooler_output)
    return (F.normalize(torch.cat(image_embeds), dim=-1), F.normalize(torch.cat(text_embeds), dim=-1))


def retrieval_top1(image_embeds: torch.Tensor, text_embeds: torch.Tensor, captions: list[str], gallery: int) -> dict:
    """Top-1 retrieval in galleries of `gallery` held-out pairs (consecutive chunks, averaged). A hit is the true
    caption's text (image->text) or an image whose caption has the query's text (text->image): identical captions
    are equally right."""
    hits = {"image_to_text": [], "text_to_image": []}
    for start in range(0, len(captions) - gallery + 1, gallery):
        chunk = slice(start, start + gallery)
        names = captions[chunk]
        same = torch.tensor([[a == b for b in names] for a in names])
        similarity = image_embeds[chunk] @ text_embeds[chunk].T
        rows = torch.arange(gallery)
        hits["image_to_text"].append(same[rows, similarity.argmax(1)].float())
        hits["text_to_image"].append(same[similarity.argmax(0), rows].float())
    return {name: round(torch.cat(values).mean().item(), 3) for name, values in hits.items()}


def save(model, processor, out: Path, metrics: dict) -> None:
    """fp16 weights; the config records float32 so a plain from_pretrained computes in float32."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out)
    config_path = out / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "dtype": "float32"}, indent=2) + "\n")
    processor.save_pretrained(out)
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pool_arguments(parser)
    parser.add_argument("--out-dir", default=str(ZOO_DIR / IMAGE_CLIP))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ckpt-every", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    work, (pool, train_captions), (held_out, held_out_captions) = load_pools(args)
    torch.manual_seed(SEED)
    processor = build_processor()
    model = build_model(processor)
    text = processor.tokenizer(train_captions, padding="max_length", max_length=TEXT_CONTEXT, return_tensors="pt")
    if (text.input_ids == processor.tokenizer.unk_token_id).any():
        raise ValueError("a caption has a word outside CAPTION_WORDS")

    def batch_fn(generator):
        rows = torch.randint(0, len(pool), (args.batch_size,), generator=generator)
        return text.input_ids[rows], text.attention_mask[rows], pixel_values(processor, pool[rows])

    def loss_fn(model, batch):
        input_ids, attention_mask, pixels = batch
        loss = model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixels, return_loss=True).loss
        return loss, loss

    seconds = train_loop("clip", model, steps=args.steps, lr=args.lr, loss_fn=loss_fn, batch_fn=batch_fn,
                         work_dir=work, seed=SEED, ckpt_every=args.ckpt_every)
    image_embeds, text_embeds = embed(model, processor, held_out, held_out_captions)
    metrics = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_scenes": len(pool), "held_out_scenes": len(held_out), "steps": args.steps,
        "batch_size": args.batch_size, "lr": args.lr, "train_seconds": round(seconds),
        "held_out_retrieval_top1": {f"gallery_{g}": retrieval_top1(image_embeds, text_embeds, held_out_captions, g)
                                    for g in (32, 256, 1024) if g <= len(held_out)},
        "held_out_matched_cosine": round((image_embeds * text_embeds).sum(-1).mean().item(), 4),
    }
    save(model, processor, Path(args.out_dir), metrics)
    logger.info("saved %s: %s", args.out_dir, json.dumps(metrics))


if __name__ == "__main__":
    main()
