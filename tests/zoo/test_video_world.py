import numpy as np
import pytest

from mmspec.zoo.video_world import (
    ACTIONS,
    FRAME_SIZE,
    State,
    episode,
    persistent_actions,
    render_frame,
    rollout,
    step,
)


def test_episodes_and_rollouts_are_pure_functions_of_their_inputs():
    a, b = episode(3), episode(3)
    actions = persistent_actions(1, 20, 0.2)
    frames_a, states_a = rollout(a, actions)
    frames_b, states_b = rollout(b, actions)
    assert np.array_equal(frames_a, frames_b) and states_a == states_b
    assert frames_a.shape == (21, FRAME_SIZE, FRAME_SIZE, 3) and frames_a.dtype == np.uint8
    assert not np.array_equal(episode(3, "heldout").background, a.background)
    assert np.array_equal(frames_a[0], render_frame(a, a.start))


def test_actions_push_the_player_with_inertia():
    world = next(w for w in (episode(i) for i in range(50)) if not w.obstacles)
    centre = State(FRAME_SIZE / 2, FRAME_SIZE / 2)
    moved = step(world, centre, ACTIONS.index("right"))
    assert moved.x > centre.x and moved.y == centre.y and moved.vx > 0
    coasting = step(world, moved, ACTIONS.index("stay"))
    assert coasting.x > moved.x and 0 < coasting.vx < moved.vx  # friction, not a stop
    up = step(world, centre, ACTIONS.index("up"))
    assert up.y < centre.y and up.x == centre.x
    assert step(world, centre, ACTIONS.index("stay")) == centre


def test_the_player_never_enters_a_wall_or_an_obstacle():
    for index in range(30):
        world = episode(index)
        _, states = rollout(world, persistent_actions(index, 120, 0.1))
        assert not any(world.collides(s.x, s.y) for s in states)
        assert len({(round(s.x, 3), round(s.y, 3)) for s in states}) > 1  # it does move


def test_persistent_actions_change_at_the_requested_rate():
    actions = persistent_actions(0, 20_000, 0.1)
    changes = np.mean([a != b for a, b in zip(actions, actions[1:])])
    assert abs(changes - 0.1) < 5 * np.sqrt(0.1 * 0.9 / 20_000)
    assert set(actions) == set(range(len(ACTIONS)))
    assert len(set(persistent_actions(0, 100, 0.0))) == 1


@pytest.mark.parametrize(
    "call,match",
    [(lambda: rollout(episode(0), [0, 5]), r"actions must be in \[0, 5\)"),
     (lambda: persistent_actions(0, 10, 1.5), r"change_prob must be in \[0, 1\]"),
     (lambda: episode(0, "test"), "split must be one of")],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
