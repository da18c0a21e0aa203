"""The measurements behind the embedded models' cards: each one finds what it is meant to find on known input, and
misses what it must miss (a loop that is not one, a player that is not there, another class)."""

import numpy as np
import pytest
import torch

from mmspec.eval.mar_zoo_card import class_of, targets_of
from mmspec.eval.text_zoo_card import distinct, loops
from mmspec.eval.video_zoo_card import (
    estimator_error,
    from_true_frames,
    held_action_moves,
    measure,
    scene_without_player,
    summary,
)
from mmspec.models.mar import KLAutoencoder
from mmspec.zoo import VIDEO_WORLD, ZOO_DIR
from mmspec.zoo.pixels import round_trip
from mmspec.zoo.shapes import BACKGROUNDS, SHAPES, class_label
from mmspec.zoo.video_world import State, episode, render_frame, rollout


def test_distinct_n_counts_unique_n_grams():
    assert distinct([1, 2, 3, 4], 2) == 1.0 and distinct([7, 7, 7, 7, 7], 1) == 0.2
    assert distinct([1, 2, 1, 2, 1, 2], 2) == pytest.approx(2 / 5) and distinct([1], 3) == 1.0


@pytest.mark.parametrize("text,looping", [
    ('    """Return a list of a list of a list of a list of a list of a list', True),
    ("    return x + y + y + y + y + y + y", True),
    ("class _FTP_FTP_FTP_FTP_FTP_FTP:", True),
    ("if a:\n    return value\nif b:\n    return value\nif c:\n    return value\n", True),
    ("        x = 1", False),  # indentation
    ("# ==========================", False),  # a rule
    ("x = [0, 0, 0, 0, 0, 0]", False),  # data
    ("def f(x):\n    return x\n\ndef g(y):\n    return y\n", False),
])
def test_a_loop_is_a_repeated_piece_or_line_and_nothing_else(text, looping):
    assert loops(text) is looping


def test_the_player_is_found_where_it_is_and_missed_where_it_is_not():
    world = episode(3, "heldout")
    frames, states = rollout(world, [4] * 6 + [2] * 6)
    assert estimator_error([world], [states]) < 0.5  # the estimate on true frames: within half a pixel
    same = measure(frames[1:], frames[1:], world)
    assert (same["error_px"] == 0).all() and same["visible"].all() and (same["psnr_db"] > 90).all()
    # companions: a rollout without the player (not visible), one whose player stayed at the start (off by the walk)
    empty = np.stack([scene_without_player(world)] * (len(frames) - 1))
    missing = measure(empty, frames[1:], world)
    assert not missing["visible"].any() and np.isinf(missing["error_px"]).all()
    stayed = measure(np.stack([render_frame(world, world.start)] * (len(frames) - 1)), frames[1:], world)
    walked = np.array([np.hypot(s.x - world.start.x, s.y - world.start.y) for s in states[1:]])
    assert np.abs(stayed["error_px"] - walked).max() < 0.6 and stayed["error_px"][-1] > 3
    moved = State(world.start.x + 2, world.start.y)
    assert measure(render_frame(world, moved)[None], frames[:1], world)["error_px"][0] == pytest.approx(2, abs=0.5)


def test_a_frame_the_model_made_is_read_against_the_scene_as_its_autoencoder_draws_it():
    """Held-out episode 8's background (pixel noise near the player's orange) comes back from the shipped autoencoder
    changed enough to pass for the player: read against the scene as the autoencoder draws it, the round trips of the
    true frames show the player where it is; read against the true scene (the companion), mostly elsewhere."""
    world = episode(8, "heldout")
    frames, _ = rollout(world, [4] * 6 + [1] * 6)
    vae = KLAutoencoder.from_pretrained(ZOO_DIR / VIDEO_WORLD / "vae").float()
    trips = round_trip(vae, torch.from_numpy(frames[1:]))[1].numpy()
    drawn = round_trip(vae, torch.from_numpy(scene_without_player(world)[None].copy()))[1].numpy()[0]
    assert (measure(trips, frames[1:], world, drawn)["error_px"] <= 1.5).all()
    assert (measure(trips, frames[1:], world)["error_px"] > 3).mean() > 0.5


def test_the_video_card_sums_up_one_frame_or_every_frame_of_its_rollouts():
    first = {"error_px": np.array([1.0, 5.0]), "visible": np.array([True, True]), "psnr_db": np.array([20.0, 10.0])}
    lost = {"error_px": np.array([np.inf, 2.0]), "visible": np.array([False, True]), "psnr_db": np.array([12.0, 16.0])}
    assert summary([first, lost], 0) == {"player_visible_share": 0.5, "visible_and_within_3px_share": 0.5,
                                         "median_error_px": np.inf, "psnr_db": 16.0}
    assert summary([first, lost], slice(None)) == {"player_visible_share": 0.75, "visible_and_within_3px_share": 0.5,
                                                   "median_error_px": 3.5, "psnr_db": 14.5}


def test_a_held_action_moves_the_player_as_far_as_the_world_does_only_in_a_rollout_that_follows_it():
    worlds = [episode(i, "heldout") for i in range(2)]

    def follows(starts, actions):
        return [rollout(world, actions)[0][1:] for world in worlds]

    def stays(starts, actions):
        return [np.stack([start] * len(actions)) for start in starts]

    moves = held_action_moves(follows, worlds, frames=6)
    assert set(moves) == {"up", "down", "left", "right"}
    assert all(move["model_px"] == move["world_px"] > 2 for move in moves.values())
    assert all(move["model_px"] == 0 < move["world_px"] for move in held_action_moves(stays, worlds, 6).values())


def test_a_mar_class_is_the_first_group_s_shape_and_the_background():
    caption = "two small blue squares below a large red circle on a dotted background"
    assert class_of(class_label(caption)) == (SHAPES.index("square"), BACKGROUNDS.index("dotted"))
    background, present = targets_of([caption, "a large green cross on a plain background"])
    assert background.tolist() == [BACKGROUNDS.index("dotted"), BACKGROUNDS.index("plain")]
    assert present[0].nonzero().flatten().tolist() == sorted([SHAPES.index("square"), SHAPES.index("circle")])
    assert present[1].nonzero().flatten().tolist() == [SHAPES.index("cross")]


def test_the_mar_card_s_classifier_is_trained_once_per_machine(monkeypatch):
    import mmspec.eval.mar_zoo_card as card

    trained = []
    train = card.train_probe
    monkeypatch.setattr(card, "train_probe", lambda *args: trained.append(args) or train(*args))
    first, again = card.cached_probe(64, 2, seed=3), card.cached_probe(64, 2, seed=3)
    assert trained == [(64, 2, 3, None)]
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values(), strict=True))
    card.cached_probe(64, 3, seed=3)  # other settings: another probe
    assert trained == [(64, 2, 3, None), (64, 3, 3, None)]


def test_a_probe_of_round_trips_is_kept_per_autoencoder_and_trained_on_what_it_draws(monkeypatch):
    import mmspec.eval.mar_zoo_card as card

    def tiny_autoencoder(seed: int) -> KLAutoencoder:
        torch.manual_seed(seed)
        return KLAutoencoder(embed_dim=3, ch=32, ch_mult=(1, 1), num_res_blocks=1, encoder_attn_resolutions=(),
                             resolution=64).eval()

    drawn = []
    monkeypatch.setattr(card, "round_trip", lambda vae, images: drawn.append(vae) or round_trip(vae, images))
    vae = tiny_autoencoder(0)
    card.cached_probe(16, 1, autoencoder=vae)
    card.cached_probe(16, 1, autoencoder=tiny_autoencoder(0))  # the same weights: the kept probe
    assert drawn == [vae]
    card.cached_probe(16, 1, autoencoder=tiny_autoencoder(1))  # another autoencoder: another probe
    card.cached_probe(16, 1)  # the rendered scenes themselves: another again, with no round trip
    assert len(drawn) == 2 and drawn[1] is not vae


def test_one_step_predictions_read_the_true_frames_before_each_and_the_action_that_led_to_it():
    worlds = [episode(i, "heldout") for i in range(2)]
    actions = [[4, 4, 4, 2, 2, 0, 1, 1], [3, 3, 1, 1, 1, 4, 4, 4]]
    truths = [rollout(world, taken)[0] for world, taken in zip(worlds, actions, strict=True)]
    window, seen = 3, []

    def world_step(context, context_actions, taken):  # the world's own next frame, checked against what it is given
        seen.append(taken)
        t = window + len(seen) - 1
        for truth, led, frames, before, now in zip(truths, actions, context, context_actions, taken, strict=True):
            assert (frames == truth[t - window : t]).all() and list(before) == [0, *led][t - window : t]
            assert now == led[t - 1]
        return np.stack([truth[t] for truth in truths])

    made = from_true_frames(world_step, truths, actions, window)
    assert [m.shape for m in made] == [truths[0][window:].shape] * 2
    one_step = [measure(m, t[window:], w) for m, t, w in zip(made, truths, worlds, strict=True)]
    assert summary(one_step, slice(None))["visible_and_within_3px_share"] == 1.0
    # companion: a model that copies the last frame it is given is off by the player's walk
    copied = from_true_frames(lambda context, *_: context[:, -1], truths, actions, window)
    errors = np.concatenate([measure(m, t[window:], w)["error_px"] for m, t, w in zip(copied, truths, worlds)])
    assert errors.max() > 1
