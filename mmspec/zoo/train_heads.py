"""Train draft heads (`EagleHead`, `HydraHead`) for a target by distillation from the target's own samples.

    python -m mmspec.zoo.train_heads --target pycode/target        # the embedded text target: both kinds
    python -m mmspec.zoo.train_heads --target shapes               # the embedded text-to-image model
    python -m mmspec.zoo.train_heads --target path/to/my-lm --prompts prompts.txt --out-dir my-heads

1. Samples: the target continues prompts at temperature 1 (text: `--prompts`, a file or a folder of .txt files with
   one prompt a line, else 32-token windows of the code corpus; images: captions, `--prompts` or the shapes world's
   training captions, decoded with the pipeline's own guidance). They are kept in `--work-dir` and reused; a run
   asking for more `--samples` than are kept generates only the rest.
2. Training: each batch of samples is re-read by the frozen target (teacher forcing), which gives every position's
   feature (the input of its LM head) and law p (both classifier-free-guidance rows for images). A head is trained on
   soft cross-entropy to p plus `--feature-weight` x SmoothL1 to the target's features (to their first
   `--align-share` of dimensions: FSPAD's partial alignment, which leaves the rest free for the logits), with
   uniform noise of `--noise` on the features it reads (they are its own predictions when it drafts), and for images
   plus the soft cross-entropy of its guided law to the target's guided law (the law decoding accepts against;
   guidance multiplies the rows' errors), plus `--tv-weight` x the total variation between the head's law and the
   target's (the guided ones for images): 1 - alpha, the acceptance itself (DistillSpec's TVD, Zhou et al. 2023,
   arXiv 2310.08461; cross-entropy alone spends the head's capacity on the tail that acceptance ignores):
   - EAGLE: unrolled `--unroll` extra steps (EAGLE-3's training-time test), step s reading its own step s - 1
     predictions and attending to the true pairs before the drafted span plus its own diagonal, as drafting at depth
     s + 1 does; step losses weighted 0.8^s. `--feature-sampling`: FSPAD's input combiner (`EagleHead`).
   - Hydra: every head k on every position at once (head k reads the true tokens after the root).
3. Held-out acceptance on samples kept out of training: per depth, alpha = E[sum min(p, q)] (the acceptance of a
   sampled draft at T = 1) and the top-1 agreement (greedy), and for images the guided laws' alpha, written to
   `training_metrics.json` beside the head; the alphas also go into the head's config (`acceptance`), from which
   the image pipelines' `decoding="auto"` predicts what the head's chains reach.

The heads are saved as `eagle_head/` and `hydra_head/` in `--out-dir` (default: the target's pipeline folder,
`pycode/` or `shapes/` for the embedded ones), where the pipelines load them. Checkpoints in `--work-dir` let an
interrupted run resume (a fine-tune from `--init-from` keeps its own).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mmspec.adapters.causal_lm import CausalLMAdapter
from mmspec.adapters.features import FeatureTap
from mmspec.core.kinds import HEAD_KINDS
from mmspec.core.training.heads import Pairs, aligned, unrolled_predictions
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.zoo import ZOO_DIR, load_causal_lm, resolve_model
from mmspec.zoo.training import save_stage, total_variation, train_loop

logger = logging.getLogger(__name__)
DEPTH_DECAY = 0.8  # EAGLE-3's weight of unrolled step s: 0.8^s
CAPTION_POOL = 8192  # the shapes world's training captions image samples are drawn for


class TextTeacher:
    """A transformers causal LM as the teacher of text heads; samples are [n, T] token sequences."""

    positions_kind = "1d"

    def __init__(self, model, tokenizer=None):
        self.model, self.tokenizer = model, tokenizer
        self.model.requires_grad_(False)
        adapter = CausalLMAdapter(self.model)
        (self.embedding, self.lm_head), self.layers = adapter.feature_readout(), adapter.feature_layers()
        self.tap = FeatureTap.of(self.lm_head)
        config = self.model.config
        self.feature_size, self.vocab_size = config.hidden_size, config.vocab_size
        self.n_head, self.ffn_hidden = config.num_attention_heads, config.intermediate_size

    def prompts(self, path: str | None, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, 32] prompt tokens: windows of the user's prompts, or of up to n of the code corpus's training files
        drawn at random (over all of them: a head distilled from a few files' code accepts less elsewhere)."""
        if path is not None:
            texts = read_prompts(path)
        else:
            from mmspec.zoo.text_corpus import corpus_files, read_texts

            files = corpus_files("train")
            picked = torch.randint(0, len(files), (n,), generator=generator).unique().tolist()
            texts = read_texts([files[i] for i in picked])
        ids = [i for text in texts for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        stream = torch.tensor(ids)
        if stream.numel() < 64:
            raise ValueError(f"--prompts: {path} holds {stream.numel()} tokens; need at least 64")
        starts = torch.randint(0, stream.numel() - 32, (n,), generator=generator)
        return stream[starts[:, None] + torch.arange(32)]

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, new_tokens: int, generator: torch.Generator) -> torch.Tensor:
        from mmspec.text import speculative_generate
        from mmspec.text.drafters import NoDrafter

        out, _ = speculative_generate(self.model, prompts, drafter=NoDrafter(), max_new_tokens=new_tokens,
                                      temperature=1.0, eos_token_id=None, generator=generator)
        return out

    @torch.no_grad()
    def pairs(self, samples: torch.Tensor) -> Pairs:
        logits = self.model(input_ids=samples).logits.float()
        f = self.tap.features.float()
        T = samples.shape[1]
        return Pairs(samples[:, 1:], f[:, :-1], f[:, 1:, -self.feature_size :], logits[:, 1:].softmax(-1),
                     torch.arange(1, T).expand(samples.shape[0], -1))


class ImageTeacher:
    """A LlamaGen text-to-image pipeline as the teacher of image heads; samples are [n, N] image tokens with their
    caption index, the pairs cover the conditional rows and their unconditional twins."""

    positions_kind = "2d"

    def __init__(self, name: str):
        from mmspec.pipelines.llamagen import LlamaGenPipeline

        self.pipe = LlamaGenPipeline.from_pretrained(str(resolve_model(name, "--target")))
        self.pipe.set_progress_bar_config(disable=True)
        transformer = self.transformer = self.pipe.transformer.float().requires_grad_(False)
        self.pipe.text_encoder.float()
        self.embedding, self.lm_head, self.layers = transformer.tok_embeddings, transformer.output, transformer.layers
        self.tap = FeatureTap.of(self.lm_head)
        c = transformer.config
        self.feature_size, self.vocab_size, self.n_head = c.dim, c.vocab_size, c.n_head
        self.ffn_hidden, self.grid_size = transformer.layers[0].feed_forward.w1.out_features, c.grid_size
        self.guidance_scale = self.pipe.default_guidance_scale
        self.captions: list[str] = []

    def prompts(self, path: str | None, n: int, generator: torch.Generator) -> torch.Tensor:
        """Caption indices [n] into `self.captions`: the user's captions, or the captions of the shapes world's first
        `CAPTION_POOL` training scenes (a fixed list, so that the caption indices of kept samples stay valid)."""
        if path is not None:
            self.captions = read_prompts(path)
        else:
            from mmspec.zoo.shapes import scene

            self.captions = [scene(i, "train", 8)[1] for i in range(CAPTION_POOL)]
        return torch.randint(0, len(self.captions), (n,), generator=generator)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, new_tokens: int, generator: torch.Generator) -> torch.Tensor:
        captions = [self.captions[i] for i in prompts.tolist()]
        tokens = self.pipe(captions, decoding="ar", output_type="latent", generator=generator).images
        return torch.cat([prompts[:, None], tokens.cpu()], 1)  # the caption index, then the image tokens

    @torch.no_grad()
    def pairs(self, samples: torch.Tensor) -> Pairs:
        captions, tokens = [self.captions[i] for i in samples[:, 0].tolist()], samples[:, 1:]
        condition = self.pipe.encode_prompt(captions)
        B, N = tokens.shape
        rows = torch.cat([tokens, tokens])
        states = torch.cat([condition.states, condition.states])
        mask = torch.cat([condition.mask, condition.mask])
        drop = torch.arange(2 * B) >= B  # the unconditional twins
        logits = self.transformer(rows, states, mask, drop)  # column i: the law of token i
        f = self.tap.features.float()  # column i: what the target computed before token i
        logits = logits[:, 1:].float()
        return Pairs(rows[:, :-1], f[:, :-1], f[:, 1:, -self.feature_size :], logits.softmax(-1),
                     torch.arange(N - 1).expand(2 * B, -1), guided(logits, self.guidance_scale).softmax(-1))


def guided(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """[R / 2, ..., V]: the guided logits of the conditional rows (the first half of [R, ..., V]) and their
    unconditional twins, combined as the decoding combines them (`mmspec.core.probs`)."""
    conditional, unconditional = logits.chunk(2)
    return unconditional + (conditional - unconditional) * scale


def read_prompts(path: str) -> list[str]:
    """One prompt a non-empty line, of a file or of every .txt file in a folder (sorted)."""
    source = Path(path)
    files = sorted(source.glob("*.txt")) if source.is_dir() else [source]
    if not files or not all(f.is_file() for f in files):
        raise ValueError(f"--prompts must be a text file or a folder of .txt files, got {path}")
    prompts = [line for f in files for line in f.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts: {path} holds no prompt")
    return prompts


def build_head(kind: str, teacher, feature_sampling: bool = False, feature_layers: tuple[int, ...] = ()
               ) -> torch.nn.Module:
    if kind == "eagle":
        return EagleHead(feature_size=teacher.feature_size, vocab_size=teacher.vocab_size, n_head=teacher.n_head,
                         ffn_hidden=teacher.ffn_hidden, positions=teacher.positions_kind,
                         grid_size=getattr(teacher, "grid_size", 16), feature_sampling=feature_sampling,
                         feature_layers=feature_layers)
    return HydraHead(feature_size=teacher.feature_size, vocab_size=teacher.vocab_size, num_heads=4,
                     hidden=2 * teacher.feature_size)


def start_from(head: torch.nn.Module, folder: Path) -> None:
    """Load the weights of the head saved in `folder` into `head` (same kind and sizes). An EAGLE head with feature
    sampling started from one without keeps the saved input weights and zero for the sampled feature's, and one
    with `feature_layers` started from one without keeps its fuser's initial identity on f: it starts as the saved
    head."""
    saved = type(head).from_pretrained(folder).float().state_dict()
    own = head.state_dict()
    if not set(saved) <= set(own) or any(not name.startswith("fuser.") for name in set(own) - set(saved)):
        raise ValueError(f"--init-from: {folder} holds another kind of head")
    with torch.no_grad():
        for name, value in saved.items():
            target = own[name]
            if name == "fc.weight" and target.shape[1] > value.shape[1] and target.shape[0] == value.shape[0]:
                target.zero_()[:, : value.shape[1]] = value
            elif target.shape != value.shape:
                raise ValueError(f"--init-from: {folder}'s {name} is {tuple(value.shape)}, this head's "
                                 f"{tuple(target.shape)}")
            else:
                target.copy_(value)


def soft_cross_entropy(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[...]: -sum p log softmax(logits)."""
    return -(p * logits.log_softmax(-1)).sum(-1)


def depth_losses(head, batch: Pairs, predictions, feature_weight: float, guidance_scale: float | None = None,
                 align_share: float = 1.0, tv_weight: float = 0.0) -> list[torch.Tensor]:
    """Per depth d (index of `predictions`): the mean soft CE to the target's law plus `feature_weight` x SmoothL1
    to its feature's first `align_share` of dimensions (FSPAD's partial alignment below 1), over the columns that
    depth predicts. With guidance (images), plus the soft CE of the head's guided law to the target's: the law that
    decoding accepts against, where guidance multiplies the rows' errors. Plus `tv_weight` x the mean total
    variation between the law decoding accepts against (guided for images) and the head's."""
    aligned_dims = max(1, round(align_share * batch.target_features.shape[-1]))
    losses = []
    for d, hidden in enumerate(aligned(head, predictions)):
        logits = head.logits(hidden)
        loss = soft_cross_entropy(batch.laws[:, d:], logits).mean()
        loss = loss + feature_weight * F.smooth_l1_loss(hidden[..., :aligned_dims].float(),
                                                        batch.target_features[:, d:, :aligned_dims])
        accepted_law, accepted_logits = batch.laws[:, d:], logits
        if batch.guided_laws is not None:
            accepted_law, accepted_logits = batch.guided_laws[:, d:], guided(logits, guidance_scale)
            loss = loss + soft_cross_entropy(accepted_law, accepted_logits).mean()
        if tv_weight:
            loss = loss + tv_weight * total_variation(accepted_law, accepted_logits).mean()
        losses.append(loss)
    return losses


def predictions_of(head, batch, args, training: bool):
    return unrolled_predictions(head, batch, args.unroll, args.noise if training else 0.0)


@torch.no_grad()
def held_out_metrics(head, teacher, samples: torch.Tensor, args) -> dict:
    """Per depth, on held-out samples: alpha (E sum min(p, q), the acceptance of a draft sampled at T = 1) and the
    top-1 agreement (greedy), per cache row; for images also alpha of the guided laws, which decoding sees."""
    head.eval()
    sums = []
    for start in range(0, len(samples), args.batch_size):
        batch = teacher.pairs(samples[start : start + args.batch_size])
        rows = []
        for d, hidden in enumerate(aligned(head, predictions_of(head, batch, args, training=False))):
            logits, p = head.logits(hidden).float(), batch.laws[:, d:]
            row = [1 - total_variation(p, logits).mean(), (p.argmax(-1) == logits.argmax(-1)).float().mean()]
            if batch.guided_laws is not None:
                row.append(1 - total_variation(batch.guided_laws[:, d:], guided(logits, teacher.guidance_scale)).mean())
            rows.append(row)
        sums.append(torch.tensor(rows))
    means = torch.stack(sums).mean(0).T.tolist()  # [metric][depth]
    names = ("held_out_alpha_by_depth", "held_out_top1_by_depth", "held_out_guided_alpha_by_depth")
    return {**{name: [round(x, 4) for x in values] for name, values in zip(names, means)},
            "held_out_samples": len(samples)}


def recorded_acceptance(metrics: dict, guidance_scale: float | None) -> dict:
    """The held-out acceptance a head's config keeps (`EagleHead`'s `acceptance`), from `held_out_metrics`."""
    recorded = {"by_depth": metrics["held_out_alpha_by_depth"]}
    if guidance_scale is not None:
        recorded.update(guided_by_depth=metrics["held_out_guided_alpha_by_depth"], guidance_scale=guidance_scale)
    return recorded


def load_samples(teacher, args, work: Path) -> torch.Tensor:
    """`args.samples` target samples, kept in the work folder: generated in batches (with a progress bar, saved after
    each), and topped up when a later run asks for more than are kept (the ones kept are reused, the new ones come
    last, so they hold the held-out samples)."""
    path = work / "samples.pt"
    kept = torch.load(path) if path.exists() else None
    have = 0 if kept is None else len(kept)
    generator = torch.Generator().manual_seed(args.seed + have)
    prompts = teacher.prompts(args.prompts, args.samples, generator)
    batches = [] if kept is None else [kept]
    for start in tqdm(range(have, args.samples, args.sample_batch), desc="target samples"):
        stop = min(start + args.sample_batch, args.samples)
        batches.append(teacher.sample(prompts[start:stop], args.new_tokens, generator))
        torch.save(torch.cat(batches), path)
    return torch.cat(batches)[: args.samples]


def decoder_depth(path: Path, image: bool) -> int | None:
    """The number of decoder layers of the target in `path` (a LlamaGen pipeline or a transformers causal LM), read
    off its config without loading it (None if the config does not say)."""
    config = json.loads((path / "transformer" / "config.json" if image else path / "config.json").read_text())
    config = config.get("text_config", config)
    return next((config[key] for key in ("n_layer", "num_hidden_layers", "num_layers") if key in config), None)


def default_out_dir(target: str) -> Path:
    """The embedded targets' pipeline folder (pycode/, shapes/); else the target's own folder."""
    path = Path(resolve_model(target, "--target"))
    return path.parent if path.parent == ZOO_DIR / "pycode" else path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="a zoo name (pycode/target, shapes) or a local folder: a "
                        "transformers causal LM, or a LlamaGen pipeline")
    parser.add_argument("--kinds", nargs="+", choices=HEAD_KINDS, default=list(HEAD_KINDS))
    parser.add_argument("--prompts", default=None, help="a text file, or a folder of .txt files, one prompt a line")
    parser.add_argument("--samples", type=int, default=None, help="target samples to distil from (default: 1536 "
                        "text, 768 images)")
    parser.add_argument("--held-out", type=int, default=64, help="samples kept out of training for the metrics")
    parser.add_argument("--new-tokens", type=int, default=160, help="text: tokens each sample continues its prompt")
    parser.add_argument("--sample-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--unroll", type=int, default=2, help="EAGLE: unrolled drafting steps after the first")
    parser.add_argument("--feature-weight", type=float, default=1.0)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--align-share", type=float, default=1.0, help="the share of feature dimensions the feature "
                        "loss aligns (FSPAD's partial alignment below 1)")
    parser.add_argument("--tv-weight", type=float, default=0.0, help="the weight of the total variation between "
                        "the head's law and the target's (guided for images), 1 - alpha (DistillSpec's TVD)")
    parser.add_argument("--feature-sampling", action="store_true", help="EAGLE: FSPAD's feature sampling, the input "
                        "FC([E(x); f; E(x) * f])")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=(), metavar="LAYER", help="EAGLE: the "
                        "target's decoder layers (0-based) whose outputs the head fuses with its feature (EAGLE-3; "
                        "the shapes head reads 2 4)")
    parser.add_argument("--init-from", default=None, help="a folder with heads to start from (its eagle_head/, "
                        "hydra_head/: the same sizes; with --feature-sampling on a head without, its extra inputs "
                        "start at zero)")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    for name in ("samples", "held_out", "new_tokens", "sample_batch", "steps", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.init_from is not None:
        missing = [kind for kind in args.kinds if not (Path(args.init_from) / f"{kind}_head").is_dir()]
        if missing:
            parser.error(f"--init-from: {args.init_from} has no {', '.join(f'{k}_head/' for k in missing)}")
    if args.tv_weight < 0:
        parser.error(f"--tv-weight must be >= 0, got {args.tv_weight}")
    if not 0 < args.align_share <= 1:
        parser.error(f"--align-share must be in (0, 1], got {args.align_share}")
    if args.prompts is not None and not Path(args.prompts).exists():
        parser.error(f"--prompts: no such file or folder: {args.prompts}")
    try:
        path = Path(resolve_model(args.target, "--target"))
    except ValueError as error:
        parser.error(str(error))
    image = (path / "model_index.json").exists()
    args.samples = args.samples or (768 if image else 1536)
    if args.held_out >= args.samples:
        parser.error(f"--held-out ({args.held_out}) must be below --samples ({args.samples})")
    if args.feature_layers:
        depth = decoder_depth(path, image)
        if depth is None:
            parser.error(f"--feature-layers: {path}'s config names no number of decoder layers")
        if len(set(args.feature_layers)) < len(args.feature_layers) or not all(
                0 <= i < depth for i in args.feature_layers):
            parser.error(f"--feature-layers must be distinct indices of the target's {depth} decoder layers (0 .. "
                         f"{depth - 1}), got {' '.join(map(str, args.feature_layers))}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    teacher = ImageTeacher(args.target) if image else TextTeacher(*load_causal_lm(args.target))
    name = path.name if path.name != "target" else path.parent.name
    work = Path(args.work_dir or Path.home() / ".cache" / "mmspec" / "train_heads" / name)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    samples = load_samples(teacher, args, work)
    sampling_seconds = time.perf_counter() - started
    train, held_out = samples[: -args.held_out], samples[-args.held_out :]
    out_dir = Path(args.out_dir) if args.out_dir else default_out_dir(args.target)

    def batch_fn(generator):
        return train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]

    for kind in args.kinds:
        head = build_head(kind, teacher, args.feature_sampling, tuple(args.feature_layers) if kind == "eagle" else ())
        if args.init_from is not None:
            start_from(head, Path(args.init_from) / f"{kind}_head")
        head.bind(teacher.embedding, teacher.lm_head)
        teacher.tap = FeatureTap.of(teacher.lm_head, head.tapped_layers(teacher.layers))

        def loss(model, batch_samples):
            batch = teacher.pairs(batch_samples)
            losses = depth_losses(model, batch, predictions_of(model, batch, args, training=True),
                                  args.feature_weight, getattr(teacher, "guidance_scale", None), args.align_share,
                                  args.tv_weight)
            total = sum(DEPTH_DECAY**d * x for d, x in enumerate(losses))
            return total, losses[0]

        # a fine-tune keeps its own checkpoint: the plain run's would replace the head it starts from
        run = f"{kind}_head" if args.init_from is None else f"{kind}_head-from-{Path(args.init_from).resolve().name}"
        seconds = train_loop(run, head, steps=args.steps, lr=args.lr, loss_fn=loss, batch_fn=batch_fn,
                             work_dir=work, seed=args.seed + HEAD_KINDS.index(kind), device=args.device)
        metrics = held_out_metrics(head, teacher, held_out, args)
        head.register_to_config(acceptance=recorded_acceptance(metrics, getattr(teacher, "guidance_scale", None)))
        metrics.update({"target": args.target, "training_samples": len(train),
                        "target_sampling_s": round(sampling_seconds, 1), "unroll": args.unroll if kind == "eagle"
                        else None, "feature_weight": args.feature_weight, "noise": args.noise,
                        "align_share": args.align_share, "tv_weight": args.tv_weight, "lr": args.lr,
                        "init_from": args.init_from,
                        "feature_sampling": args.feature_sampling if kind == "eagle" else None,
                        "feature_layers": list(args.feature_layers) if kind == "eagle" else None})
        save_stage(head.half(), out_dir / f"{kind}_head", metrics, args.steps, args.batch_size, seconds)


if __name__ == "__main__":
    main()
