"""The "shapes v2" visual-question task: busier scenes on a finer grid, with a sign
to read.

A scene is a 6x6 grid of cells on a light background. Between two and nine objects
sit in distinct cells, each a shape (circle, square, triangle, cross) in a colour
(red, green, blue, yellow, purple, orange), with a random size and a small jitter
inside its cell. Half the scenes also carry a sign: a white tile in a cell of its own
with one digit on it, drawn as a seven-segment figure, small enough that reading it
takes the detail of a few patches. Objects and the sign together cover at most ten of
the 36 cells: most of the picture is background, so the information is spread
unevenly over the image tokens.

Questions ask about colours, shapes, counts up to nine, whether something is there,
positions on a 3x3 grid of regions ("top left", "top", ..., "center", ...,
"bottom right"), left/right/above/below relations, and the sign's digit. Answers are
one or two words or a digit.

Everything is a pure function of a seed: `sample_at(split, index)` draws a scene and a
question, `scene_at(split, index)` the scene alone (training asks several questions of
one scene), `render(scene, size)` draws the picture with PIL. The splits are disjoint
by seed range (SPLITS).
"""

from __future__ import annotations

import dataclasses
import random
from typing import List, Optional, Tuple

import os
import sys

from PIL import Image, ImageDraw

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shapes import task as v1  # noqa: E402

SHAPES = v1.SHAPES
COLORS = v1.COLORS
COLOR_NAMES = v1.COLOR_NAMES
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
DIGITS = [str(d) for d in range(10)]
GRID = 6
REGION = 2  # cells per region side: a 3x3 grid of regions
MIN_OBJECTS = 2
MAX_OBJECTS = 9
SIGN_PROBABILITY = 0.5

REGION_ROWS = ["top", "middle", "bottom"]
REGION_COLS = ["left", "center", "right"]

# Seed ranges of the splits: a sample's seed is split_base + index.
SPLITS = {"train": 0, "val": 10_000_000, "test": 20_000_000}

# Seven-segment figures: segments a (top), b (top right), c (bottom right), d (bottom),
# e (bottom left), f (top left), g (middle).
SEGMENTS = {
    "0": "abcdef", "1": "bc", "2": "abdeg", "3": "abcdg", "4": "bcfg",
    "5": "acdfg", "6": "acdefg", "7": "abc", "8": "abcdefg", "9": "abcdfg",
}


Obj = v1.Obj  # shape, color, row, col, size (0.55 .. 0.9 of a cell here), dx, dy


@dataclasses.dataclass(frozen=True)
class Sign:
    digit: str
    row: int
    col: int


@dataclasses.dataclass(frozen=True)
class Scene:
    objects: Tuple[Obj, ...]
    sign: Optional[Sign]
    background: Tuple[int, int, int]


Sample = v1.Sample  # scene, question, answer, kind


def random_scene(rng: random.Random) -> Scene:
    n = rng.randint(MIN_OBJECTS, MAX_OBJECTS)
    has_sign = rng.random() < SIGN_PROBABILITY
    cells = rng.sample(range(GRID * GRID), n + has_sign)
    objs = []
    for c in cells[:n]:
        size = rng.uniform(0.55, 0.9)
        slack = (1.0 - size) / 2
        objs.append(Obj(shape=rng.choice(SHAPES), color=rng.choice(COLOR_NAMES), row=c // GRID, col=c % GRID,
                        size=size, dx=rng.uniform(-slack, slack), dy=rng.uniform(-slack, slack)))
    sign = Sign(rng.choice(DIGITS), cells[n] // GRID, cells[n] % GRID) if has_sign else None
    bg = tuple(rng.randint(225, 255) for _ in range(3))
    return Scene(tuple(objs), sign, bg)


def _draw_digit(d: ImageDraw.ImageDraw, digit: str, x0: float, y0: float, w: float, h: float) -> None:
    t = w * 0.22  # stroke
    half = h / 2
    boxes = {
        "a": (x0, y0, x0 + w, y0 + t),
        "b": (x0 + w - t, y0, x0 + w, y0 + half),
        "c": (x0 + w - t, y0 + half, x0 + w, y0 + h),
        "d": (x0, y0 + h - t, x0 + w, y0 + h),
        "e": (x0, y0 + half, x0 + t, y0 + h),
        "f": (x0, y0, x0 + t, y0 + half),
        "g": (x0, y0 + half - t / 2, x0 + w, y0 + half + t / 2),
    }
    for s in SEGMENTS[digit]:
        d.rectangle(boxes[s], fill=(20, 20, 20))


def render(scene: Scene, size: int = 192) -> Image.Image:
    """Draws the scene as an RGB image of size x size pixels."""
    big = size * 4  # drawn at 4x and downsampled: smooth edges at any output size
    img = Image.new("RGB", (big, big), scene.background)
    d = ImageDraw.Draw(img)
    cell = big / GRID
    for o in scene.objects:
        v1.draw_object(d, o, cell)
    if scene.sign is not None:
        s = scene.sign
        x0, y0 = (s.col + 0.1) * cell, (s.row + 0.1) * cell
        d.rectangle([x0, y0, x0 + 0.8 * cell, y0 + 0.8 * cell], fill=(255, 255, 255), outline=(60, 60, 60),
                    width=max(1, int(cell * 0.03)))
        _draw_digit(d, s.digit, (s.col + 0.32) * cell, (s.row + 0.2) * cell, 0.36 * cell, 0.6 * cell)
    return img.resize((size, size), Image.LANCZOS)


def region(row: int, col: int) -> str:
    """The name of the 3x3 region holding a cell: "top left", "top", ..., "center"."""
    r, c = REGION_ROWS[row // REGION], REGION_COLS[col // REGION]
    if r == "middle" and c == "center":
        return "center"
    if r == "middle":
        return c
    if c == "center":
        return r
    return f"{r} {c}"


# Training also asks for descriptions ("describe"): every object in reading order,
# then the sign. They give far more signal per picture than a one-word answer and are
# not among the evaluated question kinds.
AUX_KINDS = ["describe"]

QUESTION_KINDS = v1.QUESTION_KINDS + ["read"]  # version 1's kinds (position on a finer grid), the sign


def _question(rng: random.Random, scene: Scene, kind: str) -> Optional[Tuple[str, str]]:
    objs = scene.objects
    by_shape, by_color, _, unique = v1.scene_index(scene)

    if kind in ("color_of_shape", "shape_of_color", "exists", "relation"):
        return v1._question(rng, scene, kind)  # as in version 1
    if kind == "count_shape":
        s = rng.choice([o.shape for o in objs] if rng.random() < 0.85 else SHAPES)
        q = rng.choice(["How many {p} are there?", "How many {p} are in the picture?", "Count the {p}."])
        return q.format(p=v1._plural(s)), NUMBERS[len(by_shape[s])]
    if kind == "count_color":
        c = rng.choice([o.color for o in objs] if rng.random() < 0.85 else COLOR_NAMES)
        q = rng.choice(["How many {c} objects are there?", "How many {c} shapes are in the picture?"])
        return q.format(c=c), NUMBERS[len(by_color[c])]
    if kind == "count_all":
        q = rng.choice(["How many objects are there?", "How many shapes are in the picture?",
                        "How many shapes are there?"])
        return q, NUMBERS[len(objs)]
    if kind == "position":
        if not unique:
            return None
        o = rng.choice(unique)
        q = rng.choice(["Where is the {n}?", "Where is the {n} in the picture?", "In which part is the {n}?"])
        return q.format(n=o.name), region(o.row, o.col)
    if kind == "read":
        if scene.sign is None:
            return None
        q = rng.choice(["What number is on the sign?", "Which digit is written on the sign?",
                        "What does the sign say?"])
        return q, scene.sign.digit
    if kind == "describe":
        q = rng.choice(["Describe the picture.", "What is in the picture?", "List the objects."])
        order = sorted(objs, key=lambda o: (o.row, o.col))
        text = ", ".join(o.name for o in order)
        if scene.sign is not None:
            text += f", sign {scene.sign.digit}"
        return q, text
    raise ValueError(f"unknown question kind {kind}")


QUESTIONS = v1.Questions(QUESTION_KINDS, AUX_KINDS, random_scene, _question, SPLITS)


def sample(rng: random.Random, kind: Optional[str] = None, aux_fraction: float = 0.0,
           kind_weights: Optional[dict] = None) -> Sample:
    """One scene with one question about it. The kind is drawn first (uniformly, in
    proportion to kind_weights, or a description with probability aux_fraction) and
    scenes are redrawn until it can be asked, so kinds that need particular scenes
    (a sign, two unique objects) are not rarer."""
    return QUESTIONS.sample(rng, kind, aux_fraction, kind_weights)


def sample_at(split: str, index: int, kind: Optional[str] = None, aux_fraction: float = 0.0,
              kind_weights: Optional[dict] = None) -> Sample:
    """The index-th sample of a split: a pure function of (split, index) and the mix."""
    return QUESTIONS.sample_at(split, index, kind, aux_fraction, kind_weights)


def questions(rng: random.Random, scene: Scene, count: int, aux_fraction: float = 0.0,
              kind_weights: Optional[dict] = None) -> List[Tuple[str, str, str]]:
    """Up to `count` different (question, answer, kind) about one scene; kinds the
    scene cannot carry are skipped."""
    out: List[Tuple[str, str, str]] = []
    seen = set()
    for _ in range(count * 4):
        if len(out) == count:
            break
        k = QUESTIONS.draw_kind(rng, aux_fraction, kind_weights)
        qa = _question(rng, scene, k)
        if qa is None or qa[0] in seen:
            continue
        seen.add(qa[0])
        out.append((qa[0], qa[1], k))
    return out


def referents(scene: Scene, question: str, kind: str) -> List[Tuple[int, int]]:
    """The cells (row, col) a question is about: the object a colour, shape or name
    picks out, both objects of a relation (in the question's order), every object for a total count, the sign
    for reading; [] when nothing answers it (an absent object, a count of zero, a
    description)."""
    words = set(question.lower().rstrip("?.").split())
    objs = scene.objects
    if kind == "read":
        return [] if scene.sign is None else [(scene.sign.row, scene.sign.col)]
    if kind == "count_all":
        found = list(objs)
    elif kind in ("exists", "position", "relation"):
        text = " ".join(question.lower().rstrip("?.").split())
        found = sorted((o for o in objs if o.name in text), key=lambda o: text.index(o.name))  # as named
    elif kind in ("color_of_shape", "count_shape"):
        found = [o for o in objs if o.shape in words or v1._plural(o.shape) in words]
    elif kind in ("shape_of_color", "count_color"):
        found = [o for o in objs if o.color in words]
    else:
        found = []
    return [(o.row, o.col) for o in found]


def scene_at(split: str, index: int) -> Scene:
    """The scene of a training pack: its own seed stream (high bit set), disjoint from
    the single-question samples of the same split."""
    return random_scene(random.Random((SPLITS[split] + index) | (1 << 40)))


def all_answers() -> List[str]:
    regions = sorted({region(r, c) for r in range(GRID) for c in range(GRID)})
    return sorted(set(COLOR_NAMES + SHAPES + NUMBERS + DIGITS + ["yes", "no"] + regions))


def text_corpus(n: int = 6000, seed: int = 12345) -> List[str]:
    """Question/answer text of the task, for training the tokenizer."""
    return QUESTIONS.text_corpus(n, seed)
