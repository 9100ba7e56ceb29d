"""The "shapes v2" task and data pipeline (tests/models/shapes_v2): questions are
answered by their scenes, splits and training scenes never meet, packed training
sequences put the targets on the answers, the per-patch targets cover what is drawn,
and the visual-token selection the pruning-aware training uses is Kiln's rule."""

import random

import pytest
import torch

from shapes_v2 import model as sm
from shapes_v2 import task


@pytest.fixture(scope="module")
def tok():
    return sm.build_tokenizer()


def test_samples_are_pure_functions_of_split_and_index():
    for kind in task.QUESTION_KINDS:
        a, b = task.sample_at("test", 7, kind), task.sample_at("test", 7, kind)
        assert a == b and a.kind == kind
    assert task.sample_at("train", 3) != task.sample_at("test", 3)
    assert task.scene_at("train", 3) == task.scene_at("train", 3)
    assert task.scene_at("train", 3) != task.sample_at("train", 3).scene


def test_answers_follow_from_the_scene():
    answers = set(task.all_answers())
    kinds = set()
    for i in range(600):
        s = task.sample_at("val", i)
        kinds.add(s.kind)
        assert s.answer in answers, s
        objs = s.scene.objects
        assert task.MIN_OBJECTS <= len(objs) <= task.MAX_OBJECTS
        cells = [(o.row, o.col) for o in objs] + ([(s.scene.sign.row, s.scene.sign.col)] if s.scene.sign else [])
        assert len(set(cells)) == len(cells)
        if s.kind == "count_all":
            assert s.answer == task.NUMBERS[len(objs)]
        elif s.kind == "read":
            assert s.scene.sign is not None and s.answer == s.scene.sign.digit
        elif s.kind == "position":
            name = s.question.split("the ", 1)[1].split(" in the picture")[0].rstrip("?")
            (o,) = [o for o in objs if o.name == name]
            assert s.answer == task.region(o.row, o.col)
    assert kinds == set(task.QUESTION_KINDS)


def test_regions_are_a_3x3_grid():
    names = {task.region(r, c) for r in range(task.GRID) for c in range(task.GRID)}
    assert len(names) == 9 and "center" in names and "top left" in names and "bottom" in names
    assert task.region(0, 0) == "top left" and task.region(2, 3) == "center" and task.region(5, 2) == "bottom"


def test_pictures_show_objects_and_the_sign():
    s = task.sample_at("test", 0, "read")
    img = task.render(s.scene, 192)
    assert img.size == (192, 192)
    cell = 192 // task.GRID
    sign = s.scene.sign
    # the digit's dark strokes sit inside the sign's white tile
    tile = img.crop((sign.col * cell, sign.row * cell, (sign.col + 1) * cell, (sign.row + 1) * cell))
    lo = min(min(p) for p in tile.getdata())
    assert lo < 80, lo
    assert task.MAX_OBJECTS + 1 <= 0.3 * task.GRID * task.GRID  # most of the picture is background


def test_packed_rows_train_on_the_answers(tok):
    pipe = sm.Pipeline(tok)
    px, ids, labels, colors, shapes, keeps, positions, segments, _ = pipe.batch(range(4), random.Random(3), 4, 0.2)
    assert px.shape == (4, 3, sm.IMAGE_SIZE, sm.IMAGE_SIZE)
    assert keeps.tolist() == [sm.NUM_IMAGE_TOKENS] * 4
    eos = sm.SPECIALS["</s>"]
    image = tok.token_to_id("<image>")
    for b in range(4):
        assert int((ids[b] == image).sum()) == sm.NUM_IMAGE_TOKENS
        targets = [int(t) for t in labels[b] if t != -100]
        # position t predicts token t + 1 of its own segment
        for t in range(ids.shape[1] - 1):
            if labels[b, t] != -100:
                assert labels[b, t] == ids[b, t + 1] and segments[b, t] == segments[b, t + 1] > 0
        assert targets.count(eos) == 4 and targets[-1] == eos
        assert int(segments[b].max()) == 4
    # a pruned sample carries as many image tokens as it keeps
    _, ids, _, _, _, keeps, _, _, _ = pipe.batch(range(8), random.Random(4), 2, 0.0, None, 1.0)
    for b in range(8):
        assert sm.NUM_IMAGE_TOKENS // 4 <= keeps[b] <= sm.NUM_IMAGE_TOKENS
        assert int((ids[b] == image).sum()) == keeps[b]


NAMES = set(task.COLOR_NAMES) | set(task.SHAPES) | {"circles", "squares", "triangles", "crosses"}


def test_attention_targets_cover_what_the_question_names(tok):
    """The answer position of a lookup question is taught to look at the tokens of the
    object it names, that of a count at a sink and each counted object with equal
    weight: the targets sit on the predicting position and cover tokens whose per-patch
    classes are the named object's (or the sign's)."""
    pipe = sm.Pipeline(tok)
    rng = random.Random(6)
    px, ids, labels, colors, shapes, keeps, positions, segments, (rows, poss, roles, targets, words) = \
        pipe.batch(range(16), rng, 6, 0.0)
    # the same draws again (questions, then the render size), to know each row's questions
    rng = random.Random(6)
    qass = []
    for i in range(16):
        qass.append(task.questions(rng, task.scene_at("train", i), 6, 0.0, None))
        rng.choice(sm.TRAIN_RENDER_SIZES)
    assert len(rows) > 16
    per_object = (sm.GRID_PATCHES // task.GRID) ** 2
    seen_kinds = set()
    for n in range(len(rows)):
        b, p = int(rows[n]), int(poss[n])
        assert labels[b, p] != -100 and labels[b, p - 1] == -100  # predicts the answer's first token
        q, a, kind = qass[b][int(segments[b, p]) - 1]
        seen_kinds.add(kind)
        # the word targets: the question's colour and shape words, in its own segment
        named = [tok.decode([int(ids[b, j])]).strip() for j in range(ids.shape[1]) if words[n, j] > 0]
        assert all(segments[b, j] == segments[b, p] for j in range(ids.shape[1]) if words[n, j] > 0)
        assert named == [w for w in q.rstrip("?.").split() if w in NAMES], (q, named)
        assert abs(float(targets[n].sum()) - 1.0) < 1e-5
        sink, image = float(targets[n][0]), targets[n][1:]
        on = image > 0
        assert int(on.sum()) % per_object == 0
        scene = task.scene_at("train", b)
        if kind in sm.COUNT_KINDS:
            assert int(roles[n]) == sm.COUNT
            count = int(on.sum()) // per_object
            assert task.NUMBERS[count] == a and abs(sink - 1.0 / (1 + count)) < 1e-6
            continue
        assert int(roles[n]) == sm.LOOKUP and kind in sm.ATTEND_KINDS and sink == 0.0
        if kind == "read":
            assert set(colors[b][on].tolist()) == {len(task.COLOR_NAMES)}  # the sign's class
        elif kind in ("color_of_shape", "shape_of_color"):
            named = [o for o in scene.objects if o.color == a or o.shape == a]
            assert {task.COLOR_NAMES.index(o.color) for o in named} >= set(colors[b][on].tolist())
    assert {"color_of_shape", "shape_of_color", "position", "count_color"} <= seen_kinds
    # questions about nothing there (absent objects, descriptions) have nothing to look at
    scene = task.scene_at("train", 0)
    assert task.referents(scene, "Is there a purple cross?", "exists") == [
        (o.row, o.col) for o in scene.objects if o.name == "purple cross"]
    assert task.referents(scene, "Describe the picture.", "describe") == []


def test_split_relations_look_up_each_object_apart(tok):
    """With split relations, a relation question teaches the lookup head the first named
    object (from its two words) and the second head the other."""
    pipe = sm.Pipeline(tok)
    pipe.split_relations = True
    weights = {k: (1.0 if k == "relation" else 0.0) for k in task.QUESTION_KINDS}
    rng = random.Random(8)
    _, ids, _, _, _, _, _, segments, (rows, poss, roles, targets, words) = pipe.batch(range(8), rng, 3, 0.0, weights)
    rng = random.Random(8)
    qass = []
    for i in range(8):
        qass.append(task.questions(rng, task.scene_at("train", i), 3, 0.0, weights))
        rng.choice(sm.TRAIN_RENDER_SIZES)
    per_cell = sm.GRID_PATCHES // task.GRID
    checked = 0
    for n in range(len(rows)):
        b, p = int(rows[n]), int(poss[n])
        q, a, kind = qass[b][int(segments[b, p]) - 1]
        assert kind == "relation"
        scene = task.scene_at("train", b)
        text = q.lower()
        first, second = sorted((o for o in scene.objects if o.name in text), key=lambda o: text.index(o.name))
        o = first if int(roles[n]) == sm.LOOKUP else second
        assert int(roles[n]) in (sm.LOOKUP, sm.SECOND)
        said = " ".join(tok.decode([int(ids[b, j])]).strip() for j in range(ids.shape[1]) if words[n, j] > 0)
        assert said == o.name, (q, said, o.name)
        on = (targets[n][1:] > 0).nonzero().flatten().tolist()
        assert on == sorted((o.row * per_cell + r) * sm.GRID_PATCHES + o.col * per_cell + c
                            for r in range(per_cell) for c in range(per_cell))
        checked += 1
    assert checked >= 8 and sorted(roles.tolist()).count(sm.SECOND) == checked // 2


@pytest.mark.parametrize("variant", ["dense", "idefics3"])
def test_a_packed_question_is_the_question_asked_alone(variant):
    """forward_packed: each segment's logits equal those of its question alone (the
    model's own forward), also with the picture's tokens pruned; no segment sees another."""
    from kiln_models.idefics3 import Idefics3ForConditionalGeneration
    from kiln_models.llava import LlavaForConditionalGeneration
    tok = sm.build_tokenizer(variant)
    config = sm.model_config(tok, variant)
    for c in (config["text_config"], config["vision_config"]):
        c.update(num_hidden_layers=1)
    torch.manual_seed(0)
    model = (Idefics3ForConditionalGeneration if variant == "idefics3" else LlavaForConditionalGeneration)(config)
    model.eval()
    pipe = sm.Pipeline(tok, variant)
    scene = task.scene_at("train", 5)
    qas = task.questions(random.Random(1), scene, 3, 0.3)
    px = torch.from_numpy(pipe.pixels(task.render(scene, 192)))[None]
    for keep in (sm.NUM_IMAGE_TOKENS, 50):
        ids, labels, positions, segments = pipe.pack(qas, keep)
        with torch.no_grad():
            packed = sm.forward_packed(model, torch.tensor([ids]), px, torch.tensor([keep]), torch.tensor([positions]),
                                       torch.tensor([segments]))[0]
            for n, (q, a, _) in enumerate(qas):
                alone_ids, _, _, _ = pipe.pack([(q, a, "")], keep)
                alone = sm.forward_packed(model, torch.tensor([alone_ids]), px, torch.tensor([keep]),
                                          torch.tensor([list(range(len(alone_ids)))]),
                                          torch.zeros(1, len(alone_ids), dtype=torch.long))[0]
                if keep == sm.NUM_IMAGE_TOKENS:  # the model's own forward, unpacked
                    assert torch.allclose(alone, model(torch.tensor([alone_ids]), pixel_values=px)[0], atol=1e-5)
                rows = [t for t in range(len(ids)) if segments[t] == n + 1]
                prefix = len(alone_ids) - len(rows)
                assert torch.allclose(packed[rows], alone[prefix:], atol=1e-5), (variant, keep, n)


def test_patch_targets_cover_the_drawn_cells():
    s = task.sample_at("test", 1, "read")
    for grid in (sm.GRID_PATCHES, sm.IMAGE_SIZE // sm.IDEFICS3_PATCH_SIZE):
        colors, shapes = sm.patch_targets([s.scene], grid)
        per = grid // task.GRID
        covered = int((colors[0] != sm.AUX_COLORS - 1).sum())
        assert covered == (len(s.scene.objects) + 1) * per * per
        o = s.scene.objects[0]
        p = (o.row * per) * grid + o.col * per
        assert colors[0, p] == task.COLOR_NAMES.index(o.color) and shapes[0, p] == task.SHAPES.index(o.shape)
        g = s.scene.sign
        p = (g.row * per) * grid + g.col * per
        assert shapes[0, p] == len(task.SHAPES) + int(g.digit)


def test_keep_tokens_is_the_distinct_rule():
    torch.manual_seed(0)
    f = torch.randn(20, 8)
    f[5] = f[6]  # a tie keeps the earlier row
    kept = sm.keep_tokens(f, 7)
    mean = f.double().mean(0)
    score = [1 - float(f[r].double() @ mean) / float(f[r].double().norm() * mean.norm()) for r in range(20)]
    order = sorted(sorted(range(20), key=lambda r: (-score[r], r))[:7])
    assert torch.equal(kept, f[order])
    assert torch.equal(sm.keep_tokens(f, 20), f)


def test_idefics3_prompt_wraps_the_image():
    tok = sm.build_tokenizer("idefics3")
    ids = sm.prompt_ids(tok, "What does the sign say?", 3, "idefics3")
    fake, glob, image = (tok.token_to_id(t) for t in ("<fake_token_around_image>", "<global-img>", "<image>"))
    wrapped = [fake, glob, image, image, image, fake]
    assert any(ids[i:i + 6] == wrapped for i in range(len(ids))), ids
    assert tok.token_to_id("<image>") == sm.build_tokenizer().token_to_id("<image>")
    config = sm.model_config(tok, "idefics3")
    assert sm.variant_of(config) == "idefics3"
    assert (sm.IMAGE_SIZE // config["vision_config"]["patch_size"] // config["scale_factor"]) ** 2 == sm.NUM_IMAGE_TOKENS


def test_the_shipped_test_set_is_held_out_and_complete():
    """tests/models/shapes_v2/test/test.jsonl: at least 500 questions of the task's test
    split (seeds training and calibration never draw), every question kind, images beside
    the list, and each line is exactly the sample its id names."""
    import json
    import os
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes_v2", "test")
    qs = [json.loads(l) for l in open(os.path.join(here, "test.jsonl"))]
    assert len(qs) >= 500
    assert len({q["id"] for q in qs}) == len(qs)
    assert {q["kind"] for q in qs} == set(task.QUESTION_KINDS)
    for q in qs:
        assert os.path.isfile(os.path.join(here, q["image"])), q
        s = task.sample_at("test", int(q["id"]))
        assert (s.question, s.answer, s.kind) == (q["prompt"], q["answer"], q["kind"]), q
    from PIL import Image
    first = qs[0]
    drawn = task.render(task.sample_at("test", int(first["id"])).scene, sm.EVAL_RENDER_SIZE)
    assert list(Image.open(os.path.join(here, first["image"])).convert("RGB").getdata()) == list(drawn.getdata())
