"""The "shapes" visual-question task: procedurally rendered scenes and questions.

A scene is a 4x4 grid of cells on a light background; between one and five objects
sit in distinct cells, each a shape (circle, square, triangle, cross) in a colour
(red, green, blue, yellow, purple, orange), with a random size and a small jitter
inside its cell. Questions ask about colours, shapes, counts, positions and
left/right/above/below relations, in a few natural phrasings; answers are one or two
words ("red", "triangle", "three", "yes", "top left").

Everything is a pure function of a seed: `sample(rng)` draws a scene and a question,
`render(scene, size)` draws the picture with PIL. The splits are disjoint by seed
range (see SPLITS).
"""

from __future__ import annotations

import dataclasses
import random
from typing import List, Optional, Tuple

from PIL import Image, ImageDraw

SHAPES = ["circle", "square", "triangle", "cross"]
COLORS = {
    "red": (215, 35, 35),
    "green": (30, 160, 60),
    "blue": (35, 80, 220),
    "yellow": (235, 205, 20),
    "purple": (135, 45, 180),
    "orange": (245, 135, 20),
}
COLOR_NAMES = list(COLORS)
NUMBERS = ["zero", "one", "two", "three", "four", "five"]
GRID = 4
MAX_OBJECTS = 5

# Seed ranges of the splits: a sample's seed is split_base + index.
SPLITS = {"train": 0, "val": 10_000_000, "test": 20_000_000}


@dataclasses.dataclass(frozen=True)
class Obj:
    shape: str
    color: str
    row: int  # 0 = top
    col: int  # 0 = left
    size: float  # fraction of a cell, 0.5 .. 0.85
    dx: float  # jitter, fraction of a cell
    dy: float

    @property
    def name(self) -> str:
        return f"{self.color} {self.shape}"


@dataclasses.dataclass(frozen=True)
class Scene:
    objects: Tuple[Obj, ...]
    background: Tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Sample:
    scene: Scene
    question: str
    answer: str
    kind: str


def random_scene(rng: random.Random, n: Optional[int] = None) -> Scene:
    n = rng.randint(1, MAX_OBJECTS) if n is None else n
    cells = rng.sample(range(GRID * GRID), n)
    objs = []
    for c in cells:
        size = rng.uniform(0.5, 0.85)
        slack = (1.0 - size) / 2
        objs.append(
            Obj(
                shape=rng.choice(SHAPES),
                color=rng.choice(COLOR_NAMES),
                row=c // GRID,
                col=c % GRID,
                size=size,
                dx=rng.uniform(-slack, slack),
                dy=rng.uniform(-slack, slack),
            )
        )
    bg = tuple(rng.randint(225, 255) for _ in range(3))
    return Scene(tuple(objs), bg)


def draw_object(d: ImageDraw.ImageDraw, o, cell: float) -> None:
    """Draws object o (shape, color, row, col, size, dx, dy) on a grid of `cell` pixels."""
    cx = (o.col + 0.5 + o.dx) * cell
    cy = (o.row + 0.5 + o.dy) * cell
    r = o.size * cell / 2
    fill = COLORS[o.color]
    if o.shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif o.shape == "square":
        s = r * 0.88
        d.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    elif o.shape == "triangle":
        d.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    elif o.shape == "cross":
        w = r * 0.36
        d.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        d.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    else:
        raise ValueError(f"unknown shape {o.shape}")


def render(scene: Scene, size: int = 256) -> Image.Image:
    """Draws the scene as an RGB image of size x size pixels."""
    # Draw at 4x and downsample: smooth edges at any output size.
    big = size * 4
    img = Image.new("RGB", (big, big), scene.background)
    d = ImageDraw.Draw(img)
    cell = big / GRID
    for o in scene.objects:
        draw_object(d, o, cell)
    return img.resize((size, size), Image.LANCZOS)


def _quadrant(o: Obj) -> str:
    v = "top" if o.row < GRID // 2 else "bottom"
    h = "left" if o.col < GRID // 2 else "right"
    return f"{v} {h}"


def _plural(shape: str) -> str:
    return shape + ("es" if shape.endswith("s") else "s")


# Training also uses descriptions ("describe"): listing every object in reading
# order gives the model far more signal per picture than a one-word answer, which
# is what lets it learn to read the image within minutes. They are not part of the
# evaluated question kinds.
AUX_KINDS = ["describe"]

QUESTION_KINDS = [
    "color_of_shape",
    "shape_of_color",
    "count_shape",
    "count_color",
    "count_all",
    "exists",
    "position",
    "relation",
]


def scene_index(scene):
    """A scene's objects by shape, by colour and by name, and those whose name is unique."""
    objs = scene.objects
    by_shape = {s: [o for o in objs if o.shape == s] for s in SHAPES}
    by_color = {c: [o for o in objs if o.color == c] for c in COLOR_NAMES}
    names = {}
    for o in objs:
        names.setdefault(o.name, []).append(o)
    unique = [o for o in objs if len(names[o.name]) == 1]
    return by_shape, by_color, names, unique


def _question(rng: random.Random, scene: Scene, kind: str) -> Optional[Tuple[str, str]]:
    objs = scene.objects
    by_shape, by_color, names, unique = scene_index(scene)

    if kind == "color_of_shape":
        cands = [s for s in SHAPES if len(by_shape[s]) == 1]
        if not cands:
            return None
        s = rng.choice(cands)
        q = rng.choice(["What color is the {s}?", "What colour is the {s}?", "Which color is the {s}?"])
        return q.format(s=s), by_shape[s][0].color
    if kind == "shape_of_color":
        cands = [c for c in COLOR_NAMES if len(by_color[c]) == 1]
        if not cands:
            return None
        c = rng.choice(cands)
        q = rng.choice(["What shape is the {c} object?", "What is the {c} shape?", "Which shape is {c}?"])
        return q.format(c=c), by_color[c][0].shape
    if kind == "count_shape":
        # Mostly ask about what is there, so that answers are not mostly "zero".
        s = rng.choice([o.shape for o in objs] if rng.random() < 0.75 else SHAPES)
        q = rng.choice(["How many {p} are there?", "How many {p} are in the picture?", "Count the {p}."])
        return q.format(p=_plural(s)), NUMBERS[len(by_shape[s])]
    if kind == "count_color":
        c = rng.choice([o.color for o in objs] if rng.random() < 0.75 else COLOR_NAMES)
        q = rng.choice(["How many {c} objects are there?", "How many {c} shapes are in the picture?"])
        return q.format(c=c), NUMBERS[len(by_color[c])]
    if kind == "count_all":
        q = rng.choice(["How many objects are there?", "How many shapes are in the picture?", "How many shapes are there?"])
        return q, NUMBERS[len(objs)]
    if kind == "exists":
        if rng.random() < 0.5 and objs:
            o = rng.choice(objs)
            c, s, ans = o.color, o.shape, "yes"
        else:
            for _ in range(20):
                c, s = rng.choice(COLOR_NAMES), rng.choice(SHAPES)
                if f"{c} {s}" not in names:
                    break
            else:
                return None
            ans = "no"
        q = rng.choice(["Is there a {c} {s}?", "Is there a {c} {s} in the picture?", "Can you see a {c} {s}?"])
        return q.format(c=c, s=s), ans
    if kind == "position":
        if not unique:
            return None
        o = rng.choice(unique)
        q = rng.choice(["Where is the {n}?", "In which corner is the {n}?", "Where is the {n} in the picture?"])
        return q.format(n=o.name), _quadrant(o)
    if kind == "describe":
        q = rng.choice(["Describe the picture.", "What is in the picture?", "List the objects."])
        order = sorted(objs, key=lambda o: (o.row, o.col))
        return q, ", ".join(o.name for o in order)
    if kind == "relation":
        if len(unique) < 2:
            return None
        a, b = rng.sample(unique, 2)
        rel = rng.choice(["left of", "right of", "above", "below"])
        if rel in ("left of", "right of"):
            if a.col == b.col:
                return None
            truth = a.col < b.col if rel == "left of" else a.col > b.col
        else:
            if a.row == b.row:
                return None
            truth = a.row < b.row if rel == "above" else a.row > b.row
        return f"Is the {a.name} {rel} the {b.name}?", "yes" if truth else "no"
    raise ValueError(f"unknown question kind {kind}")


class Questions:
    """How a version of the task draws its samples: the question kinds (uniformly, in
    proportion to kind weights, or an auxiliary kind with probability aux_fraction), its
    scenes and its question function, and the seed ranges of its splits."""

    def __init__(self, kinds, aux_kinds, random_scene, question, splits):
        self.kinds, self.aux_kinds, self.splits = kinds, aux_kinds, splits
        self.random_scene, self.question = random_scene, question

    def draw_kind(self, rng: random.Random, aux_fraction: float, kind_weights: Optional[dict] = None) -> str:
        if aux_fraction > 0 and rng.random() < aux_fraction:
            return rng.choice(self.aux_kinds)
        if kind_weights:
            return rng.choices(self.kinds, weights=[kind_weights.get(k, 1.0) for k in self.kinds])[0]
        return rng.choice(self.kinds)

    def sample(self, rng: random.Random, kind: Optional[str] = None, aux_fraction: float = 0.0,
               kind_weights: Optional[dict] = None) -> Sample:
        """One scene with one question about it."""
        # The kind is drawn once: scenes are redrawn until it can be asked, so kinds that
        # need particular scenes (relations between two unique objects) are not rarer.
        k = kind or self.draw_kind(rng, aux_fraction, kind_weights)
        while True:
            scene = self.random_scene(rng)
            qa = self.question(rng, scene, k)
            if qa is not None:
                return Sample(scene, qa[0], qa[1], k)

    def sample_at(self, split: str, index: int, kind: Optional[str] = None, aux_fraction: float = 0.0,
                  kind_weights: Optional[dict] = None) -> Sample:
        """The index-th sample of a split: a pure function of (split, index) and the mix."""
        return self.sample(random.Random(self.splits[split] + index), kind, aux_fraction, kind_weights)

    def text_corpus(self, n: int, seed: int) -> List[str]:
        """Question/answer text of the task, for training the tokenizer."""
        # Drawn with its own stream (the kind redrawn whenever a scene cannot carry it), so
        # that the tokenizer, and with it the bundled checkpoints, does not change when
        # the mix of training questions does.
        rng = random.Random(seed)
        out = []
        while len(out) < n:
            k = self.draw_kind(rng, 0.2)
            qa = self.question(rng, self.random_scene(rng), k)
            if qa is not None:
                out.append(f"USER: {qa[0]} ASSISTANT: {qa[1]}")
        return out


QUESTIONS = Questions(QUESTION_KINDS, AUX_KINDS, random_scene, _question, SPLITS)
_draw_kind = QUESTIONS.draw_kind


def sample(rng: random.Random, kind: Optional[str] = None, aux_fraction: float = 0.0,
           kind_weights: Optional[dict] = None) -> Sample:
    """One scene with one question about it (Questions.sample)."""
    return QUESTIONS.sample(rng, kind, aux_fraction, kind_weights)


def sample_at(split: str, index: int, kind: Optional[str] = None, aux_fraction: float = 0.0,
              kind_weights: Optional[dict] = None) -> Sample:
    """The index-th sample of a split: a pure function of (split, index) and the mix."""
    return QUESTIONS.sample_at(split, index, kind, aux_fraction, kind_weights)


def all_answers() -> List[str]:
    quads = [f"{v} {h}" for v in ("top", "bottom") for h in ("left", "right")]
    return sorted(set(COLOR_NAMES + SHAPES + NUMBERS + ["yes", "no"] + quads))


def text_corpus(n: int = 4000, seed: int = 12345) -> List[str]:
    """Question/answer text of the task, for training the tokenizer."""
    return QUESTIONS.text_corpus(n, seed)
