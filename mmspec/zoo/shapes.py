"""Captioned synthetic scenes for the embedded image models: coloured shapes on textured backgrounds.

Scene `i` of a split is a pure function of (split seed, i): the same index gives the same image and caption on every
machine. Captions are compositional:

    "two small red triangles above a blue circle on a striped background"
    "a large green square on a noisy background"

Ambiguity is built in, as in natural images: each background kind is drawn with a random tint, scale, orientation and
pixel noise that the caption does not name, shapes are anti-aliased and jittered, so neighbouring VQ codes of an
image are genuinely uncertain given its caption.

The held-out split is a set of *captions* (about 1 in 10, chosen by a hash of the caption text), never shown in
training: `scene(i, split="heldout")` draws only such captions, `split="train"` never does.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 190),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
SIZES = {"small": (9, 13), "large": (17, 23)}  # object diameter range in pixels at 64x64
COUNTS = {1: "a", 2: "two", 3: "three"}
RELATIONS = ("above", "below", "left of", "right of")
BACKGROUNDS = ("plain", "striped", "checkered", "dotted", "gradient", "noisy")
HELD_OUT_FRACTION = 10  # 1 caption in 10 is held out
SPLITS = ("train", "heldout")


def plural(shape: str, count: int) -> str:
    if count == 1:
        return shape
    return shape + ("es" if shape.endswith("s") else "s")


CAPTION_WORDS = sorted(
    {"a", "on", "background"}
    | set(COUNTS.values())
    | set(SIZES)
    | set(COLORS)
    | {plural(s, n) for s in SHAPES for n in (1, 2)}
    | {w for r in RELATIONS for w in r.split()}
    | set(BACKGROUNDS)
)


@dataclass(frozen=True)
class ObjectGroup:
    count: int
    size: str
    color: str
    shape: str

    def phrase(self) -> str:
        return f"{COUNTS[self.count]} {self.size} {self.color} {plural(self.shape, self.count)}"


@dataclass(frozen=True)
class SceneSpec:
    """What a caption says: one or two object groups, their relation, the background kind."""

    first: ObjectGroup
    background: str
    second: ObjectGroup | None = None
    relation: str | None = None

    def caption(self) -> str:
        text = self.first.phrase()
        if self.second is not None:
            text += f" {self.relation} {self.second.phrase()}"
        return f"{text} on a {self.background} background"


def parse_caption(caption: str) -> SceneSpec:
    """The `SceneSpec` a caption of this grammar describes (inverse of `SceneSpec.caption`)."""
    words = caption.split()
    counts = {word: n for n, word in COUNTS.items()}
    singular = {plural(s, n): s for s in SHAPES for n in (1, 2)}

    def group(at: int) -> tuple[ObjectGroup, int]:
        count, size, color, shape = words[at : at + 4]
        if count not in counts or size not in SIZES or color not in COLORS or shape not in singular:
            raise ValueError(f"caption {caption!r} does not follow the scene grammar at word {at}")
        return ObjectGroup(counts[count], size, color, singular[shape]), at + 4

    first, at = group(0)
    second = relation = None
    if words[at] != "on":
        relation = " ".join(words[at : at + 2]) if words[at + 1] == "of" else words[at]
        second, at = group(at + len(relation.split()))
    if words[at : at + 2] != ["on", "a"] or words[at + 2] not in BACKGROUNDS or words[at + 3 :] != ["background"]:
        raise ValueError(f"caption {caption!r} does not end with 'on a <background> background'")
    return SceneSpec(first, words[at + 2], second, relation)


def class_label(caption: str) -> int:
    """The scene's class for the class-to-image MAR (`mar_shapes`): first object's shape x background, 0 .. 29."""
    spec = parse_caption(caption)
    return SHAPES.index(spec.first.shape) * len(BACKGROUNDS) + BACKGROUNDS.index(spec.background)


def is_held_out(caption: str) -> bool:
    digest = hashlib.sha256(caption.encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELD_OUT_FRACTION == 0


def _random_group(rng: random.Random, max_count: int) -> ObjectGroup:
    return ObjectGroup(
        count=rng.randint(1, max_count),
        size=rng.choice(tuple(SIZES)),
        color=rng.choice(tuple(COLORS)),
        shape=rng.choice(SHAPES),
    )


def random_spec(rng: random.Random) -> SceneSpec:
    first = _random_group(rng, 3)
    background = rng.choice(BACKGROUNDS)
    if rng.random() < 0.4:
        return SceneSpec(first, background)
    second = _random_group(rng, 2)
    while second.color == first.color and second.shape == first.shape:
        second = _random_group(rng, 2)
    return SceneSpec(first, background, second, rng.choice(RELATIONS))


def _tint(rng: random.Random, avoid: set[tuple[int, int, int]]) -> np.ndarray:
    """A muted background colour far enough from every object colour in `avoid`."""
    while True:
        tint = np.array([rng.randint(60, 200) for _ in range(3)], dtype=np.float32)
        if all(np.abs(tint - np.array(c)).sum() > 120 for c in avoid):
            return tint


def background_texture(kind: str, size: int, rng: random.Random, avoid: set) -> np.ndarray:
    """[size, size, 3] float32 in [0, 255]."""
    a, b = _tint(rng, avoid), _tint(rng, avoid)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    angle = rng.choice((0.0, 0.5, 0.25, 0.75)) * math.pi
    along = xx * math.cos(angle) + yy * math.sin(angle)
    if kind == "plain":
        mix = np.zeros_like(xx)
    elif kind == "striped":
        period = rng.uniform(5, 10)
        mix = ((along / period) % 1.0 < 0.5).astype(np.float32)
    elif kind == "checkered":
        cell = rng.randint(4, 9)
        mix = ((xx // cell + yy // cell) % 2).astype(np.float32)
    elif kind == "dotted":
        spacing, radius = rng.randint(6, 10), rng.uniform(1.2, 2.5)
        dx, dy = (xx % spacing) - spacing / 2, (yy % spacing) - spacing / 2
        mix = (dx * dx + dy * dy < radius * radius).astype(np.float32)
    elif kind == "gradient":
        mix = (along - along.min()) / max(float(np.ptp(along)), 1.0)
    elif kind == "noisy":
        coarse = np.array([rng.random() for _ in range(64)], dtype=np.float32).reshape(8, 8)
        mix = np.asarray(Image.fromarray((coarse * 255).astype(np.uint8)).resize((size, size), Image.BICUBIC)) / 255.0
    else:
        raise ValueError(f"background must be one of {BACKGROUNDS}, got {kind!r}")
    image = a * (1 - mix[..., None]) + b * mix[..., None]
    noise_level = 24.0 if kind == "noisy" else 6.0
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, noise_level, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.float32)


def _region(relation: str | None, which: int) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) in [0, 1] where group `which` (0 = first) is placed."""
    if relation is None:
        return (0.0, 0.0, 1.0, 1.0)
    first_side = {
        "above": (0, 0, 1, 0.5), "below": (0, 0.5, 1, 1), "left of": (0, 0, 0.5, 1), "right of": (0.5, 0, 1, 1)
    }
    x0, y0, x1, y1 = first_side[relation]
    if which == 0:
        return (x0, y0, x1, y1)
    # the second group takes the opposite half
    return (1 - x1, 1 - y1, 1 - x0, 1 - y0) if relation in ("above", "below") else (1 - x1, y0, 1 - x0, y1)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill, rotation: float) -> None:
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        return
    if shape == "cross":
        w = r * 0.38
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fill)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fill)
        return
    corners = {"square": 4, "triangle": 3, "diamond": 4}[shape]
    start = {"square": math.pi / 4, "triangle": -math.pi / 2, "diamond": 0.0}[shape] + rotation
    radius = r * (1.2 if shape == "triangle" else 1.0) * (1.3 if shape == "square" else 1.0)
    points = [
        (cx + radius * math.cos(angle), cy + radius * math.sin(angle))
        for angle in (start + 2 * math.pi * k / corners for k in range(corners))
    ]
    draw.polygon(points, fill=fill)


def render(spec: SceneSpec, rng: random.Random, size: int = 64, supersample: int = 4) -> np.ndarray:
    """[size, size, 3] uint8 image of `spec`, with the uncaptioned details drawn from `rng`."""
    groups = [spec.first] + ([spec.second] if spec.second is not None else [])
    background = background_texture(spec.background, size, rng, {COLORS[g.color] for g in groups})
    canvas = Image.fromarray(np.repeat(np.repeat(background.astype(np.uint8), supersample, 0), supersample, 1))
    draw = ImageDraw.Draw(canvas)
    for which, group in enumerate(groups):
        x0, y0, x1, y1 = _region(spec.relation, which)
        lo, hi = SIZES[group.size]
        for slot in range(group.count):
            # spread several objects of a group along the long side of their region, then jitter
            r = rng.uniform(lo, hi) / 2
            long_x = (x1 - x0) >= (y1 - y0)
            t = (slot + 0.5) / group.count
            cx = (x0 + (x1 - x0) * (t if long_x else 0.5)) * size + rng.uniform(-3, 3)
            cy = (y0 + (y1 - y0) * (0.5 if long_x else t)) * size + rng.uniform(-3, 3)
            cx, cy = min(max(cx, r + 1), size - r - 1), min(max(cy, r + 1), size - r - 1)
            jitter = np.array(COLORS[group.color]) + np.array([rng.randint(-12, 12) for _ in range(3)])
            fill = tuple(int(v) for v in np.clip(jitter, 0, 255))
            rotation = rng.uniform(-0.3, 0.3)
            draw_shape(draw, group.shape, cx * supersample, cy * supersample, r * supersample, fill, rotation)
    return np.asarray(canvas.resize((size, size), Image.BOX), dtype=np.uint8)


def scene(index: int, split: str = "train", size: int = 64) -> tuple[np.ndarray, str]:
    """(image [size, size, 3] uint8, caption) of scene `index` of `split` ("train" or "heldout")."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"mmspec-shapes/{split}/{index}")
    want_held_out = split == "heldout"
    spec = random_spec(rng)
    while is_held_out(spec.caption()) != want_held_out:
        spec = random_spec(rng)
    return render(spec, rng, size), spec.caption()


def scenes(start: int, stop: int, split: str = "train", size: int = 64) -> tuple[np.ndarray, list[str]]:
    """Scenes `start..stop-1` of `split` as (images [N, size, size, 3] uint8, captions)."""
    pairs = [scene(i, split, size) for i in range(start, stop)]
    return np.stack([p[0] for p in pairs]), [p[1] for p in pairs]
