"""An action-conditioned video world for the embedded next-frame model: a player shape pushed by the user's actions,
with inertia, that collides with the frame's walls and with static obstacle shapes, on a textured background from the
image world (`mmspec.zoo.shapes`).

Episode `i` of a split is a pure function of (split, i): background, player and obstacles. A rollout is a pure function
of (episode, actions): frame 0 is the start, frame t + 1 follows action t. Actions: 0 stay, 1 up, 2 down, 3 left,
4 right; an action accelerates the player, friction slows it, and a move into a wall or an obstacle is cancelled on
that axis (its velocity dropped), so the same action can move, slide along a wall or stop the player.

    world = episode(7)
    actions = persistent_actions(seed=0, length=64, change_prob=0.1)   # VPT-like: actions persist
    frames, states = rollout(world, actions)                          # [65, 32, 32, 3] uint8
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from mmspec.zoo.shapes import BACKGROUNDS, COLORS, SHAPES, SPLITS, background_texture, draw_shape

ACTIONS = ("stay", "up", "down", "left", "right")
DIRECTIONS = ((0, 0), (0, -1), (0, 1), (-1, 0), (1, 0))  # (dx, dy) per action, y down
FRAME_SIZE = 32
ACCELERATION = 1.0  # pixels / frame^2 while an action is held
FRICTION = 0.6  # share of the velocity kept from one frame to the next
MAX_SPEED = 2.5  # pixels / frame per axis


@dataclass(frozen=True)
class Body:
    """A shape at (x, y) (pixels, frame coordinates) of radius r; collisions treat it as a disc."""

    shape: str
    color: tuple[int, int, int]
    r: float
    x: float
    y: float


@dataclass(frozen=True)
class State:
    """The player's position and velocity."""

    x: float
    y: float
    vx: float = 0.0
    vy: float = 0.0


@dataclass(frozen=True, eq=False)
class Episode:
    """background [size, size, 3] float32 (static); the player's look and start; 0-2 static obstacles."""

    background: np.ndarray
    player: Body
    obstacles: tuple[Body, ...]

    @property
    def size(self) -> int:
        return self.background.shape[0]

    @property
    def start(self) -> State:
        return State(self.player.x, self.player.y)

    def collides(self, x: float, y: float) -> bool:
        """Whether the player centred at (x, y) overlaps a wall or an obstacle."""
        r = self.player.r
        if not (r <= x <= self.size - r and r <= y <= self.size - r):
            return True
        return any(math.hypot(x - o.x, y - o.y) < r + o.r for o in self.obstacles)


def _free_body(rng: random.Random, size: int, placed: list[Body], colors: list[str]) -> Body:
    """A body of a random shape / colour at a random place that overlaps none of `placed`."""
    while True:
        r = rng.uniform(3.0, 5.0)
        x, y = rng.uniform(r, size - r), rng.uniform(r, size - r)
        if all(math.hypot(x - b.x, y - b.y) >= r + b.r + 2 for b in placed):
            color = COLORS[rng.choice(colors)]
            return Body(rng.choice(SHAPES), color, r, x, y)


def episode(index: int, split: str = "train", size: int = FRAME_SIZE) -> Episode:
    """The world of episode `index` of `split` ("train" or "heldout"; disjoint seeds)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"mmspec-video/{split}/{index}")
    colors = rng.sample(sorted(COLORS), 3)
    player = _free_body(rng, size, [], colors[:1])
    obstacles: list[Body] = []
    for _ in range(rng.randint(0, 2)):
        obstacles.append(_free_body(rng, size, [player, *obstacles], colors[1:]))
    background = background_texture(rng.choice(BACKGROUNDS), size, rng, {COLORS[c] for c in colors})
    return Episode(background, player, tuple(obstacles))


def check_actions(actions) -> list[int]:
    actions = [int(a) for a in actions]
    if any(not 0 <= a < len(ACTIONS) for a in actions):
        raise ValueError(f"actions must be in [0, {len(ACTIONS)}) ({', '.join(ACTIONS)}), got {sorted(set(actions))}")
    return actions


def step(world: Episode, state: State, action: int) -> State:
    """The player's state one frame after `action`: accelerate, keep FRICTION of the velocity, move x then y, and
    cancel (and stop) a move on an axis that would hit a wall or an obstacle."""
    dx, dy = DIRECTIONS[action]
    vx = max(-MAX_SPEED, min(MAX_SPEED, FRICTION * state.vx + ACCELERATION * dx))
    vy = max(-MAX_SPEED, min(MAX_SPEED, FRICTION * state.vy + ACCELERATION * dy))
    x, y = state.x + vx, state.y
    if world.collides(x, y):
        x, vx = state.x, 0.0
    y = state.y + vy
    if world.collides(x, y):
        y, vy = state.y, 0.0
    return State(x, y, vx, vy)


def render_frame(world: Episode, state: State, supersample: int = 4) -> np.ndarray:
    """[size, size, 3] uint8: the background, the obstacles, then the player at `state`."""
    canvas = Image.fromarray(np.repeat(np.repeat(world.background.astype(np.uint8), supersample, 0), supersample, 1))
    draw = ImageDraw.Draw(canvas)
    for body, (x, y) in [(o, (o.x, o.y)) for o in world.obstacles] + [(world.player, (state.x, state.y))]:
        draw_shape(draw, body.shape, x * supersample, y * supersample, body.r * supersample, body.color, 0.0)
    return np.asarray(canvas.resize((world.size, world.size), Image.BOX), dtype=np.uint8)


def rollout(world: Episode, actions) -> tuple[np.ndarray, list[State]]:
    """(frames [T + 1, size, size, 3] uint8, states [T + 1]) for T actions from the episode's start."""
    states = [world.start]
    for action in check_actions(actions):
        states.append(step(world, states[-1], action))
    return np.stack([render_frame(world, s) for s in states]), states


def persistent_actions(seed: int, length: int, change_prob: float) -> list[int]:
    """`length` actions that persist: the first uniform, then each frame, with probability `change_prob`, a uniformly
    drawn *different* action (so the measured change rate is change_prob)."""
    if not 0 <= change_prob <= 1:
        raise ValueError(f"change_prob must be in [0, 1], got {change_prob}")
    rng = random.Random(f"mmspec-video-actions/{seed}/{change_prob}")
    actions = [rng.randrange(len(ACTIONS))]
    for _ in range(length - 1):
        current = actions[-1]
        if rng.random() < change_prob:
            current = rng.choice([a for a in range(len(ACTIONS)) if a != current])
        actions.append(current)
    return actions[:length]
