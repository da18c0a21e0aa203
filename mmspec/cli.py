"""The `mmspec` command.

    mmspec text "def fibonacci(n):" --method model|ngram|layerskip|ar [--max-new-tokens 64 --temperature 0 ...]
    mmspec generate "a red circle above a blue square on a striped background" --out out.png [--n 4 --seed 0 ...]
    mmspec generate "..." --decoding draft --acceptance lantern --lantern-k 100 --lantern-delta 0.2
    mmspec video --actions right*6 down*4 stay*2 --speculate 4 --out rollout.gif [--adaptive --strict --episode 0]
    mmspec demo [--port 7860 --only image|text|world ...]

A thin front end: argument parsing, then calls into the library (`mmspec.pipelines`, `mmspec.apps.demo`). It sits at
the top of the package graph (tests/test_layering.py): nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time


def run_text(args) -> int:
    import torch

    from mmspec.pipelines.text import SpeculativeTextPipeline

    pipe = SpeculativeTextPipeline.from_pretrained(args.target, draft=args.draft if args.method == "model" else None)
    start = time.perf_counter()
    out = pipe(args.prompt, method=args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
               top_k=args.top_k, top_p=args.top_p, acceptance=args.acceptance, draft_length=args.draft_length,
               schedule=args.schedule, confidence_threshold=args.confidence_threshold, exit_layer=args.exit_layer,
               max_ngram=args.max_ngram, generator=torch.Generator().manual_seed(args.seed))
    elapsed = time.perf_counter() - start
    for prompt, completion in zip(args.prompt, out.texts, strict=True):
        print(prompt + completion)
        print("-" * 60)
    print(f"method  {args.method}\n{out.stats.table()}\ntokens/s  {int(out.stats.new_tokens.sum()) / elapsed:.1f}")
    return 0


def run_generate(args) -> int:
    import torch
    from diffusers.utils import make_image_grid

    from mmspec.pipelines.auto import image_pipeline_from_arguments

    pipe = image_pipeline_from_arguments(args)
    call = {"num_images_per_prompt": args.n, "guidance_scale": args.guidance_scale, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "height": args.height, "width": args.width,
            "negative_prompt": args.negative_prompt}
    method = {"decoding": args.decoding, "window": args.window, "init": args.init, "coupling": args.coupling,
              "draft_length": args.draft_length, "acceptance": args.acceptance, "lantern_k": args.lantern_k,
              "lantern_delta": args.lantern_delta, "lantern_lam": args.lantern_lam}

    def timed(**options):
        generator = [torch.Generator().manual_seed(args.seed + i) for i in range(len(args.prompt) * args.n)]
        start = time.perf_counter()
        out = pipe(args.prompt, generator=generator, **call, **options)
        return out, time.perf_counter() - start

    out, elapsed = timed(**method)
    images = out.images
    if args.upscale > 1:
        images = [im.resize((im.width * args.upscale, im.height * args.upscale), 0) for im in images]  # 0 = nearest
    make_image_grid(images, rows=len(args.prompt), cols=args.n).save(args.out)
    print(f"wrote {args.out}: {len(args.prompt)} prompt(s) x {args.n} image(s), one row per prompt")
    print(f"decoding  {args.decoding}\n{out.stats.table()}")
    runs = [(args.decoding, out.stats, elapsed)]
    if args.decoding != "ar" and args.compare:  # the same call decoded by plain AR, both timed warm
        ar_out, ar_elapsed = timed(decoding="ar", output_type="latent")
        out, elapsed = timed(**method, output_type="latent")
        runs = [("ar", ar_out.stats, ar_elapsed), (args.decoding, out.stats, elapsed)]
    print(f"\n{'method':<8}{'target forwards':>17}{'tokens/forward':>16}{'seconds/image':>15}{'speedup':>9}")
    for name, stats, seconds in runs:
        print(f"{name:<8}{stats.target_forwards:>17}{stats.tokens_per_target_forward:>16.2f}"
              f"{seconds / len(out.images):>15.3f}{runs[0][2] / seconds:>8.2f}x")
    return 0


def parse_actions(words: list[str], names: tuple[str, ...]) -> list[int]:
    """Action words -> ids: a name ("right") or id ("4"), optionally repeated ("right*6")."""
    actions = []
    for word in words:
        name, _, repeat = word.partition("*")
        if name not in names and not (name.isdigit() and int(name) < len(names)):
            raise ValueError(f"--actions: {word!r} is not one of {names} or an id below {len(names)} (optionally "
                             "followed by *count)")
        if repeat and not (repeat.isdigit() and int(repeat) >= 1):
            raise ValueError(f"--actions: the count in {word!r} must be an integer >= 1")
        actions += [names.index(name) if name in names else int(name)] * (int(repeat) if repeat else 1)
    return actions


def run_video(args) -> int:
    from pathlib import Path

    import numpy as np
    import torch
    from diffusers.utils import export_to_gif, export_to_video

    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.video import FrameSpeculation
    from mmspec.zoo.video_world import ACTIONS, episode, render_frame

    actions = parse_actions(args.actions, ACTIONS)
    pipe = NextFramePipeline.from_pretrained(args.model, dtype=torch.float32)
    if args.image:
        from PIL import Image

        start = np.asarray(Image.open(args.image).convert("RGB"))
    else:
        world = episode(args.episode, "heldout")
        start = render_frame(world, world.start)
    if args.strict:
        speculation = FrameSpeculation.strict()
    elif args.speculate > 1 or args.adaptive:
        speculation = FrameSpeculation(frames=args.speculate, adaptive=args.adaptive,
                                       context="pipelined" if args.pipelined else "eager")
    else:
        speculation = None
    runs = [("speculative" if speculation else "sequential", speculation)]
    if speculation is not None and args.compare:
        runs.insert(0, ("sequential", None))
    pipe(start, actions[:2], speculation=speculation, num_inference_steps=args.steps)  # warm-up, untimed
    print(f"{'method':<13}{'FPS':>8}{'forwards':>10}{'computed':>10}{'discarded':>11}{'rollbacks':>11}")
    for name, spec in runs:
        out = pipe(start, actions, speculation=spec, num_inference_steps=args.steps,
                   generator=torch.Generator().manual_seed(args.seed))
        s = out.stats
        print(f"{name:<13}{s.fps:>8.1f}{s.target_forwards:>10}{s.frames_computed:>10}{s.frames_discarded:>11}"
              f"{s.rollbacks:>11}")
    frames = [frame.resize((frame.width * args.upscale,) * 2, 0) for frame in out.frames[0]]  # 0 = nearest
    if Path(args.out).suffix == ".mp4":
        export_to_video(frames, args.out, fps=args.fps, macro_block_size=1)
    else:
        export_to_gif(frames, args.out, fps=args.fps)
    print(f"wrote {args.out}: {len(frames)} frames of the {runs[-1][0]} rollout")
    return 0


def run_demo(demo_args: list[str]) -> int:
    if importlib.util.find_spec("gradio") is None:
        raise ValueError('the demo needs Gradio: pip install "torch==2.13.0" -e ".[app]" (or mmspec[app])')
    from mmspec.apps.demo import main as demo_main

    demo_main(demo_args)
    return 0


def main(argv: list[str] | None = None) -> int:
    from mmspec.image import ACCEPTANCES, COUPLINGS, DECODINGS, INITS
    from mmspec.pipelines.auto import add_image_model_arguments
    from mmspec.pipelines.text import TEXT_METHODS
    from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, VIDEO_WORLD

    parser = argparse.ArgumentParser(prog="mmspec", description="Speculative decoding for AR generation.")
    commands = parser.add_subparsers(dest="command", required=True)
    text = commands.add_parser("text", help="speculative text generation with a causal LM (default: the embedded pair)")
    text.add_argument("prompt", nargs="+", help="one or more prompts (several prompts are decoded as one batch)")
    text.add_argument("--method", choices=TEXT_METHODS, default="model", help="drafter, or 'ar' for the plain target")
    text.add_argument("--target", default=TEXT_TARGET, help="zoo name or transformers folder of the target")
    text.add_argument("--draft", default=TEXT_DRAFT,
                      help="zoo name or transformers folder of the draft (--method model)")
    text.add_argument("--max-new-tokens", type=int, default=64)
    text.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    text.add_argument("--top-k", type=int, default=0)
    text.add_argument("--top-p", type=float, default=1.0)
    text.add_argument("--acceptance", choices=("exact", "typical"), default="exact", help="'typical' is lossy")
    text.add_argument("--draft-length", type=int, default=4)
    text.add_argument("--schedule", choices=("constant", "heuristic"), default="constant")
    text.add_argument("--confidence-threshold", type=float, default=0.0, help="adaptive draft length: stop below it")
    text.add_argument("--exit-layer", type=int, default=None, help="layer skip: draft with the first N target layers")
    text.add_argument("--max-ngram", type=int, default=3)
    text.add_argument("--seed", type=int, default=0)

    image = commands.add_parser("generate", help="text-to-image generation (default: the embedded shapes model)")
    image.add_argument("prompt", nargs="+", help="one or more prompts (decoded as one batch)")
    image.add_argument("--out", default="out.png", help="PNG to write: one row per prompt, --n images per row")
    image.add_argument("--n", type=int, default=1, help="images per prompt")
    image.add_argument("--seed", type=int, default=0, help="image i uses seed + i")
    image.add_argument("--guidance-scale", type=float, default=None,
                       help="classifier-free guidance; 1 = off (default: the family's, 3 for the embedded model)")
    image.add_argument("--temperature", type=float, default=1.0)
    image.add_argument("--top-k", type=int, default=None, help="default: the family's (0 = all codes)")
    image.add_argument("--height", type=int, default=None, help="pixels (default: the model's native size)")
    image.add_argument("--width", type=int, default=None, help="pixels (default: the model's native size)")
    image.add_argument("--negative-prompt", default=None, help="Emu3: the CFG rows' text")
    image.add_argument("--top-p", type=float, default=1.0)
    image.add_argument("--decoding", choices=tuple(DECODINGS), default="sjd",
                       help="'sjd': speculative Jacobi decoding (fewer forwards); 'draft': the pipeline's draft model "
                            "drafts; 'ar': a token per forward")
    image.add_argument("--window", type=int, default=None, help="sjd: tokens per target forward (default: best)")
    image.add_argument("--init", choices=INITS, default=None, help="sjd: draft initialisation (default: best)")
    image.add_argument("--coupling", choices=COUPLINGS, default=None, help="sjd: redraft coupling (default: best)")
    image.add_argument("--draft-length", type=int, default=None, help="draft: tokens drafted per target forward")
    image.add_argument("--acceptance", choices=ACCEPTANCES, default=None,
                       help="sjd / draft: 'exact' (default, lossless) or 'lantern' (relaxed over codebook neighbours, "
                            "lossy: prints its realised distortion)")
    image.add_argument("--lantern-k", type=int, default=None, help="lantern: neighbours per code (default 1000 or V-1)")
    image.add_argument("--lantern-delta", type=float, default=None, help="lantern: TV budget per candidate, in [0, 1]")
    image.add_argument("--lantern-lam", type=float, default=None, help="lantern++: neighbourhood mass <= lam * p(x)")
    image.add_argument("--no-compare", dest="compare", action="store_false",
                       help="skip the plain-AR run that the chosen decoding is compared with")
    add_image_model_arguments(image)
    image.add_argument("--upscale", type=int, default=1, help="enlarge the written images (nearest neighbour)")
    video = commands.add_parser("video", help="action-conditioned video with frame speculation (embedded world)")
    video.add_argument("--actions", nargs="+", required=True,
                       help="one per frame: stay / up / down / left / right or 0-4, optionally *count (right*6)")
    video.add_argument("--speculate", type=int, default=4, help="frames speculated per pass (1 = none)")
    video.add_argument("--adaptive", action="store_true", help="up to --speculate frames, by action persistence")
    video.add_argument("--pipelined", action="store_true", help="pipeline context passes into the next block")
    video.add_argument("--strict", action="store_true", help="one frame per pass, pipelined: sequential exactly")
    video.add_argument("--steps", type=int, default=4, help="Euler steps per frame")
    video.add_argument("--episode", type=int, default=0, help="start from this held-out episode's first frame")
    video.add_argument("--image", default=None, help="start from this frame (a 32 x 32 image) instead")
    video.add_argument("--seed", type=int, default=0)
    video.add_argument("--out", default="rollout.gif", help="GIF, or MP4 with the [video] extra (imageio)")
    video.add_argument("--fps", type=int, default=8, help="frame rate of the written file")
    video.add_argument("--upscale", type=int, default=4, help="enlarge the written frames (nearest neighbour)")
    video.add_argument("--no-compare", dest="compare", action="store_false", help="skip the sequential run")
    video.add_argument("--model", default=VIDEO_WORLD, help="zoo name or saved NextFramePipeline folder")
    # listed for --help only: `mmspec demo ...` hands all its options to mmspec.apps.demo's own parser
    commands.add_parser("demo", help="launch the Gradio demo (AR vs speculative, side by side); --help for its options")
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["demo"]:
            return run_demo(argv[1:])
        args = parser.parse_args(argv)
        return {"text": run_text, "generate": run_generate, "video": run_video}[args.command](args)
    except (ValueError, TypeError) as error:
        parser.exit(2, f"mmspec: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
