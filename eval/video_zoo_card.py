"""Measure what the embedded next-frame world model shows, for its model card: over held-out episodes rolled out
frame by frame under persistent actions (the true rollout's actions, 10 % change rate), the player's position error
against the true rollout and whether it is still visible, and the frames' PSNR, at frames 8, 16, 32 and 64; the same
figures for the true frames after a round trip through the pipeline's autoencoder (the ceiling of any model that
generates its latents) and for each frame made from the true frames before it (one step, before the model's own
frames feed it: what a rollout loses beyond that is drift); how far the player goes in 8 frames of one action held
from rest, in the world and in the model; and a strip of rollouts for docs/images.

    python -m mmspec.eval.video_zoo_card            # 32 episodes, 64 frames (a few minutes on 2 CPU cores)
    python -m mmspec.eval.video_zoo_card --quick    # 8 episodes
    python -m mmspec.eval.video_zoo_card --model /tmp/candidate --json /tmp/card.json --image /tmp/card.png
                                                    # a candidate (`train_video --out-dir /tmp/candidate`)

The player is found the same way in both frames: the pixels that differ from the episode's scene without the player
(background and obstacles, which never move) by more than `CHANGED` and lie within `NEAR_COLOR` of the player's
colour; its position is their centroid, and it is visible when they cover at least `VISIBLE` of what they cover in
the true frame. A true frame is read against the true scene, a frame the model made against the scene as its
autoencoder draws it (the round trip of the scene without the player): read against the true scene, the pixel noise
and fine stripes no autoencoder keeps pass for the player wherever they come back near its colour, and a perfect model
would score what `autoencoder_round_trip_read_against_the_true_scene` shows. The estimate's own error on true frames
is reported (`estimator_error_px`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mmspec.eval.devices import write_json
from mmspec.pipelines.video import NextFramePipeline
from mmspec.zoo import VIDEO_WORLD
from mmspec.zoo.pixels import round_trip
from mmspec.zoo.video_world import (
    ACTIONS,
    DIRECTIONS,
    Episode,
    State,
    episode,
    persistent_actions,
    render_frame,
    rollout,
)

RESULTS = Path("eval") / "results" / "video_zoo_card.json"
STRIP_PATH = Path("docs") / "images" / "nextframe_rollouts.png"
FRAMES_SHOWN = (0, 8, 16, 32, 64)
CHANGED = 60.0  # summed |RGB| difference from the scene without the player that marks a pixel as changed
NEAR_COLOR = 120.0  # RGB distance from the player's colour within which a changed pixel counts as the player
VISIBLE = 0.3  # share of the true frame's player pixels a frame must show for the player to count as visible
WITHIN_PX = 3.0  # the card's position tolerance
HELD_FRAMES = 8  # frames of one action held from rest, for how far the model moves the player


def player_pixels(frame: np.ndarray, scene: np.ndarray, color) -> np.ndarray:
    """[H, W] bool: pixels of `frame` [H, W, 3] uint8 that differ from `scene` and are near the player's colour."""
    frame, scene = frame.astype(np.float64), scene.astype(np.float64)
    changed = np.abs(frame - scene).sum(-1) > CHANGED
    near = np.linalg.norm(frame - np.asarray(color, dtype=np.float64), axis=-1) < NEAR_COLOR
    return changed & near


def centroid(mask: np.ndarray) -> np.ndarray | None:
    """(x, y) of a mask's pixels (their centres), or None if it is empty."""
    ys, xs = np.nonzero(mask)
    return None if len(xs) == 0 else np.array([xs.mean() + 0.5, ys.mean() + 0.5])


def scene_without_player(world: Episode) -> np.ndarray:
    return render_frame(world, State(-100.0, -100.0))


def measure(generated: np.ndarray, truth: np.ndarray, world: Episode,
            drawn_scene: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per frame of one rollout (generated and true [T, H, W, 3] uint8): position error (px; inf where the player
    is not visible in the generated frame), visibility, PSNR (dB). drawn_scene [H, W, 3] uint8: the scene without
    the player as the model can draw it (its autoencoder's round trip of it), which the generated frames are read
    against (default: the true scene; the true frames always are): a background the autoencoder cannot keep (pixel
    noise, fine stripes) otherwise passes for the player wherever it comes back near the player's colour."""
    scene, color = scene_without_player(world), world.player.color
    drawn = scene if drawn_scene is None else drawn_scene
    errors, visible = [], []
    for made, true in zip(generated, truth, strict=True):
        ours, theirs = player_pixels(made, drawn, color), player_pixels(true, scene, color)
        seen = ours.sum() >= VISIBLE * max(1, theirs.sum())
        a, b = centroid(ours), centroid(theirs)
        visible.append(bool(seen))
        errors.append(float(np.linalg.norm(a - b)) if seen and a is not None and b is not None else float("inf"))
    mse = ((generated.astype(np.float64) - truth.astype(np.float64)) / 255) ** 2
    psnr = 10 * np.log10(1.0 / np.maximum(mse.reshape(len(mse), -1).mean(1), 1e-10))
    return {"error_px": np.array(errors), "visible": np.array(visible), "psnr_db": psnr}


def estimator_error(worlds: list[Episode], states: list[list[State]]) -> float:
    """Mean distance between the estimate on true frames and the player's true centre: the estimate's own error."""
    errors = []
    for world, path in zip(worlds, states, strict=True):
        scene = scene_without_player(world)
        for state in path[:: max(1, len(path) // 8)]:
            found = centroid(player_pixels(render_frame(world, state), scene, world.player.color))
            if found is not None:
                errors.append(float(np.hypot(found[0] - state.x, found[1] - state.y)))
    return float(np.mean(errors))


def summary(measured: list[dict[str, np.ndarray]], frames: int | slice) -> dict[str, float]:
    """The card's figures over rollouts (`measure`'s output each) at one frame index or a slice of them."""
    errors = np.concatenate([np.atleast_1d(m["error_px"][frames]) for m in measured])
    return {
        "player_visible_share": round(float(np.mean([np.mean(m["visible"][frames]) for m in measured])), 4),
        f"visible_and_within_{WITHIN_PX:g}px_share": round(float(np.mean(errors <= WITHIN_PX)), 4),
        "median_error_px": round(float(np.median(errors)), 3),
        "psnr_db": round(float(np.mean([np.mean(m["psnr_db"][frames]) for m in measured])), 3),
    }


def held_action_moves(generate, worlds: list[Episode], frames: int = HELD_FRAMES,
                      drawn_scenes: list[np.ndarray] | None = None) -> dict[str, dict[str, float]]:
    """Per moving action, held for `frames` frames from the start (at rest): how far the player goes along the
    action's direction, in the world and in `generate(starts [E, H, W, 3] uint8, actions [frames]) -> E rollouts
    [frames, H, W, 3] uint8`, mean px over `worlds` (a player a rollout lost has not moved); the rollouts are read
    against `drawn_scenes` (see `measure`; default: the true scenes)."""
    drawn_scenes = drawn_scenes or [scene_without_player(world) for world in worlds]
    moves = {}
    for action in range(1, len(ACTIONS)):
        truths = [rollout(world, [action] * frames)[0] for world in worlds]
        made = generate(np.stack([t[0] for t in truths]), [action] * frames)
        direction, went = np.array(DIRECTIONS[action]), {"world_px": [], "model_px": []}
        for world, truth, rolled, drawn in zip(worlds, truths, made, drawn_scenes, strict=True):
            scene, color = scene_without_player(world), world.player.color
            start = centroid(player_pixels(truth[0], scene, color))
            for key, last, background in (("world_px", truth[-1], scene), ("model_px", rolled[-1], drawn)):
                end = centroid(player_pixels(last, background, color))
                went[key].append(0.0 if end is None else float((end - start) @ direction))
        moves[ACTIONS[action]] = {key: round(float(np.mean(values)), 2) for key, values in went.items()}
    return moves


def from_true_frames(predict, truths: list[np.ndarray], actions: list[list[int]], window: int) -> list[np.ndarray]:
    """Per rollout (true frames [T + 1, H, W, 3] uint8 under `actions`, T ints), its frames window .. T each
    predicted from the `window` true frames before it: what the model makes of one step before its own frames feed
    it. `predict(context [E, window, H, W, 3] uint8, context_actions [E, window], actions [E]) -> [E, H, W, 3]
    uint8`; frame f's action is the one that led to it (frame 0's: stay)."""
    truth, led = np.stack(truths), np.array([[0, *taken] for taken in actions])
    made = [predict(truth[:, t - window : t], led[:, t - window : t], led[:, t]) for t in range(window, len(led[0]))]
    return list(np.stack(made, axis=1))


def strip(truths: list[np.ndarray], generated: list[np.ndarray], rows: int, upscale: int = 3) -> Image.Image:
    """Per episode a true row over a generated row, at FRAMES_SHOWN (frame 0: the start, the same in both)."""
    lines = []
    for truth, made in zip(truths[:rows], generated[:rows], strict=True):
        video = np.concatenate([truth[:1], made])
        for frames in (truth, video):
            lines.append(np.concatenate([frames[t] for t in FRAMES_SHOWN if t < len(frames)], axis=1))
    picture = Image.fromarray(np.concatenate(lines, axis=0))
    return picture.resize((picture.width * upscale, picture.height * upscale), Image.NEAREST)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=VIDEO_WORLD, help="a zoo name or a saved NextFramePipeline folder (a "
                        "retrained candidate, carded before it replaces the zoo's)")
    parser.add_argument("--episodes", type=int, default=32, help="held-out episodes")
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="Euler steps per frame")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 episodes")
    parser.add_argument("--json", default=str(RESULTS), help="where to write the figures")
    parser.add_argument("--image", default=str(STRIP_PATH), help="where to write the strip of rollouts")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.frames < 1 or args.steps < 1:
        parser.error("--episodes, --frames and --steps must be >= 1")
    count = 8 if args.quick else args.episodes
    worlds = [episode(i, "heldout") for i in range(count)]
    actions = [persistent_actions(10**6 + i, args.frames, 0.1) for i in range(count)]
    truths, states = zip(*(rollout(w, a) for w, a in zip(worlds, actions, strict=True)), strict=True)
    pipe = NextFramePipeline.from_pretrained(args.model, dtype=torch.float32)

    def roll(context: np.ndarray, taken, context_actions=None) -> np.ndarray:
        """uint8 frames [E, T, H, W, 3] after context [E, (k,) H, W, 3] under actions `taken` (T, or [E, T])."""
        seeds = [torch.Generator().manual_seed(args.seed + i) for i in range(len(context))]
        out = pipe(context, torch.as_tensor(taken), context_actions=context_actions, num_inference_steps=args.steps,
                   output_type="np", generator=seeds)
        return np.round(np.asarray(out.frames) * 255).clip(0, 255).astype(np.uint8)

    def generate(starts: np.ndarray, taken) -> list[np.ndarray]:
        return list(roll(starts, taken))

    def predict(context: np.ndarray, context_actions: np.ndarray, taken: np.ndarray) -> np.ndarray:
        return roll(context, taken[:, None], torch.as_tensor(context_actions))[:, 0]

    generated = generate(np.stack([t[0] for t in truths]), actions)
    drawn = list(round_trip(pipe.vae, torch.from_numpy(np.stack([scene_without_player(w) for w in worlds])))[1].numpy())
    measured = [measure(g, t[1:], w, d) for g, t, w, d in zip(generated, truths, worlds, drawn, strict=True)]
    # the true frames through the autoencoder: what a model that generates their latents perfectly would show
    trips = [round_trip(pipe.vae, torch.from_numpy(t[1:]))[1].numpy() for t in truths]
    round_trips = [measure(r, t[1:], w, d) for r, t, w, d in zip(trips, truths, worlds, drawn, strict=True)]
    against_true_scene = [measure(r, t[1:], w) for r, t, w in zip(trips, truths, worlds, strict=True)]
    window = pipe.transformer.config.attention_window
    one_step = [measure(made, t[window:], w, d) for made, t, w, d in
                zip(from_true_frames(predict, list(truths), actions, window), truths, worlds, drawn, strict=True)]
    report = {"model": args.model, "episodes": count, "frames": args.frames, "steps": args.steps,
              "estimator_error_px": round(estimator_error(worlds, list(states)), 3),
              "autoencoder_round_trip": summary(round_trips, slice(None)),
              "autoencoder_round_trip_read_against_the_true_scene": summary(against_true_scene, slice(None)),
              "next_frame_from_true_frames": summary(one_step, slice(None)),
              # the same frames as the last true frame before each: the player's own move, to read the one above by
              "next_frame_copying_the_last_true_frame": summary(
                  [measure(t[window - 1 : -1], t[window:], w) for t, w in zip(truths, worlds, strict=True)],
                  slice(None)),
              "held_action_moves_px": held_action_moves(generate, worlds, drawn_scenes=drawn), "at_frame": {}}
    print(f"autoencoder round trip, every frame: {report['autoencoder_round_trip']} (read against the true scene: "
          f"{report['autoencoder_round_trip_read_against_the_true_scene']})")
    print(f"one frame from the {window} true frames before it, every frame: {report['next_frame_from_true_frames']} "
          f"(copying the last of them: {report['next_frame_copying_the_last_true_frame']})")
    print(f"moved in {HELD_FRAMES} frames of one action from rest: {report['held_action_moves_px']}")
    for t in (8, 16, 32, 64):
        if t <= args.frames:
            report["at_frame"][t] = summary(measured, t - 1)
            print(f"frame {t}: {report['at_frame'][t]}")
    write_json(args.json, report)
    Path(args.image).parent.mkdir(parents=True, exist_ok=True)
    strip(list(truths), generated, rows=3).save(args.image)
    print(f"wrote {args.json} and {args.image}")
    return report


if __name__ == "__main__":
    main()
