"""Expert pruning (kiln-compile --prune-experts, docs/pruning.md).

The pruned artifact is checked against an independent reference: the checkpoint
rewritten in Python without the experts the precision report says were pruned (router
rows removed, the kept experts renumbered, num_local_experts lowered), run by the
PyTorch reference. Mixtral renormalises the top-k routing weights, so the two must agree
to the usual 1e-4 of the logits' scale.
"""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import MODELS, ROOT, run, tool
from kiln_models import safetensors_io

SHAPES_MOE = os.path.join(ROOT, "tests", "models", "shapes", "checkpoints", "moe")
PROMPTS = ["The quick brown fox", "How do I install this part?", "Step one: remove the cover.",
           "Tighten the four screws", "What is in the box?", "Hello there, how are you today?"]


@pytest.fixture(scope="module")
def mixtral(tiny_dir):
    """tiny-mixtral (4 experts, top 2) with a text calibration set beside it."""
    d = tiny_dir / "prune-tiny-mixtral"
    if not d.exists():
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-mixtral", "--out", d])
        with open(d / "calibration.jsonl", "w") as f:
            for p in PROMPTS:
                f.write(json.dumps({"prompt": p}) + "\n")
    return d


def pruned_checkpoint(src, report, out):
    """`src` without the experts `report` lists as pruned, as a Hugging Face checkpoint."""
    shutil.copytree(src, out)
    cfg = json.load(open(src / "config.json"))
    tensors = safetensors_io.load_file(str(src / "model.safetensors"))
    kept_counts = set()
    for entry in report["pruned_experts"]:
        router = entry["router"]                      # model.layers.L.block_sparse_moe.gate.weight
        prefix = router[: -len("gate.weight")]
        gone = {e["expert"] for e in entry["pruned"]}
        experts = cfg["num_local_experts"]
        keep = [e for e in range(experts) if e not in gone]
        kept_counts.add(len(keep))
        tensors[router] = tensors[router][keep]
        moved = {}
        for new, old in enumerate(keep):
            for w in ("w1", "w2", "w3"):
                moved[f"{prefix}experts.{new}.{w}.weight"] = tensors[f"{prefix}experts.{old}.{w}.weight"]
        for e in range(experts):
            for w in ("w1", "w2", "w3"):
                del tensors[f"{prefix}experts.{e}.{w}.weight"]
        tensors.update(moved)
    assert len(kept_counts) == 1
    cfg["num_local_experts"] = kept_counts.pop()
    json.dump(cfg, open(out / "config.json", "w"))
    safetensors_io.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("prune,kept", [("1", 3), ("50%", 2)])
def test_pruned_artifact_equals_the_pruned_reference(mixtral, tiny_dir, prune, kept):
    tag = prune.replace("%", "pct")
    artifact = tiny_dir / f"mixtral-pruned-{tag}.kiln"
    report_path = tiny_dir / f"mixtral-pruned-{tag}.json"
    out = run([tool("kiln-compile"), mixtral, "-o", artifact, "--kv-cache=f32", f"--prune-experts={prune}",
               "--report", report_path, "--remarks"])
    report = json.load(open(report_path))
    assert len(report["pruned_experts"]) == 2  # both layers
    for entry in report["pruned_experts"]:
        assert entry["kept"] == kept
        assert entry["calibration_tokens"] > 0
        for e in entry["pruned"]:
            assert f"expert {e['expert']} (selected by {e['selected']} of {entry['calibration_tokens']} tokens" \
                in out.stderr
    # Every pruned expert had the least routing mass of its layer.
    full = tiny_dir / "mixtral-unpruned.kiln"
    run([tool("kiln-compile"), mixtral, "-o", full, "--kv-cache=f32"])
    assert os.path.getsize(artifact) < os.path.getsize(full)

    ref_ckpt = tiny_dir / f"mixtral-reference-{tag}"
    if ref_ckpt.exists():
        shutil.rmtree(ref_ckpt)
    pruned_checkpoint(mixtral, report, ref_ckpt)
    golden = tiny_dir / f"mixtral-golden-{tag}"
    run(["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ref_ckpt, "--out", golden,
         "--prompt", "How do I install this part? Tell me step by step.", "--max-new-tokens", "8"])
    logits = tiny_dir / f"mixtral-pruned-{tag}-logits.npy"
    run([tool("kiln-run"), artifact, "--input-ids", golden / "input_ids.npy", "--dump-logits", logits,
         "--max-new-tokens", "1", "--threads", "2", "--quiet"])
    ref = np.load(golden / "logits.npy")
    got = np.load(logits)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max())
    assert err <= 1e-4 * float(np.abs(ref).max()), f"max abs error {err}"
    # And it is not the unpruned model's output.
    unpruned_logits = tiny_dir / f"mixtral-unpruned-{tag}-logits.npy"
    run([tool("kiln-run"), full, "--input-ids", golden / "input_ids.npy", "--dump-logits", unpruned_logits,
         "--max-new-tokens", "1", "--threads", "2", "--quiet"])
    assert float(np.abs(np.load(unpruned_logits) - ref).max()) > 10 * err


@pytest.fixture(scope="module")
def mixtral_pairs(mixtral, tiny_dir):
    """tiny-mixtral whose experts 2 and 3 are experts 0 and 1 plus noise of 5% of their
    spread (as upcycled experts are after some training): each has a near copy."""
    d = tiny_dir / "prune-tiny-mixtral-pairs"
    if not d.exists():
        shutil.copytree(mixtral, d)
        tensors = safetensors_io.load_file(str(d / "model.safetensors"))
        rng = np.random.default_rng(7)
        for name in list(tensors):
            for copy, of in ((".experts.2.", ".experts.0."), (".experts.3.", ".experts.1.")):
                if copy in name:
                    base = tensors[name.replace(copy, of)].astype(np.float32)
                    noisy = base + 0.05 * base.std() * rng.standard_normal(base.shape).astype(np.float32)
                    tensors[name] = noisy.astype(tensors[name].dtype)
        safetensors_io.save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def merged_checkpoint(src, report, out):
    """`src` with the merges `report` lists: each kept expert and those merged into it
    all get the group's mean weights; the router and the expert count stay."""
    shutil.copytree(src, out)
    tensors = safetensors_io.load_file(str(src / "model.safetensors"))
    for entry in report["pruned_experts"]:
        prefix = entry["router"][: -len("gate.weight")]
        groups = {}
        for e in entry["pruned"]:
            groups.setdefault(e["merged_into"], [e["merged_into"]]).append(e["expert"])
        for group in groups.values():
            for w in ("w1", "w2", "w3"):
                names = [f"{prefix}experts.{e}.{w}.weight" for e in group]
                mean = np.mean([tensors[n].astype(np.float64) for n in names], axis=0)
                for n in names:
                    tensors[n] = mean.astype(tensors[n].dtype)
    safetensors_io.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def test_merged_artifact_equals_the_merged_reference(mixtral_pairs, tiny_dir):
    """--prune-experts=1 --prune-experts-merge: in each layer the expert with the least
    routing mass goes into its near copy, the artifact shrinks as much as by removing
    it, and its logits equal those of the PyTorch reference on the checkpoint with the
    merged weights (router unchanged)."""
    artifact = tiny_dir / "mixtral-merged.kiln"
    report_path = tiny_dir / "mixtral-merged.json"
    out = run([tool("kiln-compile"), mixtral_pairs, "-o", artifact, "--kv-cache=f32", "--prune-experts=1",
               "--prune-experts-merge", "--report", report_path, "--remarks"])
    report = json.load(open(report_path))
    assert len(report["pruned_experts"]) == 2
    for entry in report["pruned_experts"]:
        assert entry["kept"] == 3 and len(entry["pruned"]) == 1
        for e in entry["pruned"]:
            assert e["merged_into"] == (e["expert"] + 2) % 4, entry
            assert f"expert {e['expert']} (selected by {e['selected']} of" in out.stderr
            assert f"merged into expert {e['merged_into']} (cosine 0.99" in out.stderr
    removed = tiny_dir / "mixtral-pairs-removed.kiln"
    full = tiny_dir / "mixtral-pairs-unpruned.kiln"
    run([tool("kiln-compile"), mixtral_pairs, "-o", removed, "--kv-cache=f32", "--prune-experts=1"])
    run([tool("kiln-compile"), mixtral_pairs, "-o", full, "--kv-cache=f32"])
    removed_bytes = os.path.getsize(full) - os.path.getsize(removed)
    assert os.path.getsize(full) - os.path.getsize(artifact) >= 0.95 * removed_bytes

    ref_ckpt = tiny_dir / "mixtral-merged-reference"
    if ref_ckpt.exists():
        shutil.rmtree(ref_ckpt)
    merged_checkpoint(mixtral_pairs, report, ref_ckpt)
    golden = tiny_dir / "mixtral-merged-golden"
    run(["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ref_ckpt, "--out", golden,
         "--prompt", "How do I install this part? Tell me step by step.", "--max-new-tokens", "8"])
    ref = np.load(golden / "logits.npy")
    err = {}
    for name, a in (("merged", artifact), ("unpruned", full)):
        logits = tiny_dir / f"mixtral-{name}-logits.npy"
        run([tool("kiln-run"), a, "--input-ids", golden / "input_ids.npy", "--dump-logits", logits,
             "--max-new-tokens", "1", "--threads", "2", "--quiet"])
        got = np.load(logits)
        assert got.shape == ref.shape
        err[name] = float(np.abs(got - ref).max())
    assert err["merged"] <= 1e-4 * float(np.abs(ref).max()), err
    # The merged weights are not the unpruned ones.
    assert err["unpruned"] > 10 * err["merged"], err


def test_the_least_used_experts_go(mixtral, tiny_dir):
    """The pruned experts are those with the least gate mass of their layer, and pruning
    one expert removes the first of the two that pruning two removes."""
    reports = {}
    for n in ("1", "2"):
        path = tiny_dir / f"order-{n}.json"
        run([tool("kiln-compile"), mixtral, "-o", tiny_dir / f"order-{n}.kiln", f"--prune-experts={n}",
             "--report", path])
        reports[n] = {e["router"]: e for e in json.load(open(path))["pruned_experts"]}
    for router, one in reports["1"].items():
        two = reports["2"][router]
        assert len(one["kept_experts"]) == 3 and len(two["kept_experts"]) == 2
        for r in (one, two):
            assert max(e["mass"] for e in r["pruned"]) <= min(e["mass"] for e in r["kept_experts"])
            assert sum(e["selected"] for e in r["pruned"] + r["kept_experts"]) == 2 * r["calibration_tokens"]
        assert {e["expert"] for e in one["pruned"]} < {e["expert"] for e in two["pruned"]}


def test_auto_on_the_demo_model(tiny_dir):
    """auto: held-out calibration samples score every count; the choice is a pruning whose
    held-out accuracy stays within the bound (or none), and the artifact says which experts
    are gone."""
    artifact = tiny_dir / "shapes-moe-auto.kiln"
    report_path = tiny_dir / "shapes-moe-auto.json"
    out = run([tool("kiln-compile"), SHAPES_MOE, "-o", artifact, "--prune-experts=auto", "--remarks",
               "--report", report_path])
    lines = [l for l in out.stderr.splitlines() if "--prune-experts=auto:" in l]
    assert lines, out.stderr
    chosen = [l for l in lines if l.endswith(": chosen")]
    report = json.load(open(report_path))
    if chosen:
        n = int(chosen[0].split("--prune-experts=auto: ")[1].split(" of ")[0])
        assert all(len(e["pruned"]) == n for e in report["pruned_experts"])
        assert len(report["pruned_experts"]) == 4
    else:
        assert "every expert kept" in lines[-1]
        assert report["pruned_experts"] == []
    info = json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)
    assert info["file_bytes"] > 0


def test_errors_leave_no_artifact(mixtral, tiny_dir):
    artifact = tiny_dir / "never.kiln"
    # More than top_k allows.
    p = subprocess_run([tool("kiln-compile"), mixtral, "-o", artifact, "--prune-experts=3"])
    assert p.returncode != 0 and "leaves fewer than top_k = 2" in p.stderr
    assert not artifact.exists()
    # Not a count, fraction or percentage.
    p = subprocess_run([tool("kiln-compile"), mixtral, "-o", artifact, "--prune-experts=most"])
    assert p.returncode == 2 and "--prune-experts must be a count (2)" in p.stderr
    assert not artifact.exists()
    # Merging needs a count of experts to merge.
    p = subprocess_run([tool("kiln-compile"), mixtral, "-o", artifact, "--prune-experts-merge"])
    assert p.returncode == 2 and "--prune-experts-merge goes with --prune-experts" in p.stderr
    assert not artifact.exists()
    # auto needs answers in the calibration set.
    p = subprocess_run([tool("kiln-compile"), mixtral, "-o", artifact, "--prune-experts=auto"])
    assert p.returncode != 0 and 'give every line of the calibration set an "answer"' in p.stderr
    assert not artifact.exists()
    # A dense model has no experts.
    dense = tiny_dir / "prune-tiny-llama"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", dense])
    p = subprocess_run([tool("kiln-compile"), dense, "-o", artifact, "--prune-experts=1"])
    assert p.returncode != 0 and "LlamaForCausalLM has no mixture-of-experts layers" in p.stderr
    assert not artifact.exists()


def subprocess_run(cmd):
    import subprocess
    return subprocess.run(cmd, capture_output=True, text=True)


# ----------------------------------------------------------------- visual tokens

def _select(features, keep, score):
    """The runtime's rule (runtime/src/ops/eltwise_ops.cc RunSelectTokens): the `keep`
    highest-scoring rows of [T, D] (ties: the earlier row), in their order."""
    import torch
    f = features.double()
    if score == "norm":
        s = f.norm(dim=1)
    else:
        m = f.mean(0, keepdim=True)
        s = 1 - (f @ m.T)[:, 0] / (f.norm(dim=1) * m.norm()).clamp_min(1e-300)
    order = sorted(range(f.shape[0]), key=lambda i: (-float(s[i]), i))[:keep]
    return sorted(order)


def _pruned_reference(ckpt, golden, keep, score, original_positions=False, greedy=0):
    """Logits of the PyTorch reference when the projector's tokens are cut to the `keep`
    the runtime's rule selects, and the prompt carries that many image tokens. With
    original_positions, each kept token is at the RoPE position it has unpruned and the
    text after the image too (kiln-compile --visual-token-positions=original). With
    greedy > 0, also the `greedy` tokens greedy decoding appends (each from the logits
    of the prompt and the tokens before it) -> ids, logits[, tokens]."""
    import torch
    from kiln_models.registry import load_checkpoint
    model, _ = load_checkpoint(str(ckpt))
    model.eval()
    ids = np.load(golden / "input_ids.npy")
    px = torch.from_numpy(np.load(golden / "pixel_values.npy").astype(np.float32))
    cfg = json.load(open(ckpt / "config.json"))
    image_id = cfg.get("image_token_index", cfg.get("image_token_id"))  # LLaVA, Idefics3
    body = model.language_model.model if hasattr(model, "language_model") else model.model.text_model
    original = model.get_image_features
    with torch.no_grad():
        feats = original(px)
        total = feats.reshape(-1, feats.shape[-1]).shape[0]
        rows = _select(feats.reshape(-1, feats.shape[-1]), keep, score)
        model.get_image_features = lambda _px: feats.reshape(1, -1, feats.shape[-1])[:, rows]
        positions = np.flatnonzero(ids[0] == image_id)
        pruned_ids = np.delete(ids, positions[keep:], axis=1)

        def forward(seq):
            if original_positions:
                first = int(positions[0])
                pos = [i if i < first else first + rows[i - first] if i < first + keep else i + total - keep
                       for i in range(seq.shape[1])]
                body_forward = body.forward
                body.forward = lambda *a, **k: body_forward(*a, **k, position_ids=torch.tensor([pos]))
            try:
                return model(torch.from_numpy(seq), pixel_values=px).numpy()
            finally:
                body.__dict__.pop("forward", None)

        logits = forward(pruned_ids)
        tokens, seq = [], pruned_ids
        for _ in range(greedy):
            tokens.append(int(np.argmax(forward(seq)[0, -1])))
            seq = np.concatenate([seq, [[tokens[-1]]]], axis=1)
    return (pruned_ids, logits, tokens) if greedy else (pruned_ids, logits)


def _vt_checkpoint(tiny_dir, preset):
    """A generated tiny checkpoint and its golden prompt and image (16 image tokens)."""
    ckpt = tiny_dir / f"vt-{preset}"
    golden = tiny_dir / f"vt-{preset}-golden"
    if not ckpt.exists():
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", ckpt])
        from PIL import Image
        rng = np.random.default_rng(3)
        Image.fromarray(rng.integers(0, 255, (6, 9, 3), dtype=np.uint8)).resize((90, 60)).save(tiny_dir / "vt.png")
        run(["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ckpt, "--out", golden,
             "--prompt", "How do I install this part?", "--image", tiny_dir / "vt.png", "--max-new-tokens", "1"])
    return ckpt, golden


@pytest.mark.parametrize("preset", ["tiny-llava", "tiny-idefics3"])
@pytest.mark.parametrize("score", ["distinct", "norm"])
def test_pruned_visual_tokens_equal_the_reference(tiny_dir, preset, score):
    ckpt, golden = _vt_checkpoint(tiny_dir, preset)
    artifact = tiny_dir / f"vt-{preset}-{score}.kiln"
    out = run([tool("kiln-compile"), ckpt, "-o", artifact, "--kv-cache=f32", "--visual-tokens=50%",
               f"--visual-token-score={score}", "--visual-token-positions=consecutive", "--remarks"])
    assert "keeps 8 of 16 image tokens per image" in out.stderr
    inspect = run([tool("kiln-inspect"), artifact]).stdout
    assert f"visual tokens    8 of 16 kept (score {score})" in inspect
    px = np.load(golden / "pixel_values.npy").astype(np.float32)
    np.save(tiny_dir / f"vt-{preset}-px.npy", px.reshape(px.shape[-3:]))
    # The artifact's 8 tokens, then a session that keeps 4 of them (the degrade path).
    for session_tokens in (0, 4):
        keep = session_tokens or 8
        ids, ref = _pruned_reference(ckpt, golden, keep, score)
        np.save(tiny_dir / "vt-ids.npy", ids)
        logits = tiny_dir / "vt-logits.npy"
        cmd = [tool("kiln-run"), artifact, "--input-ids", tiny_dir / "vt-ids.npy", "--pixel-values",
               tiny_dir / f"vt-{preset}-px.npy", "--dump-logits", logits, "--max-new-tokens", "1", "--quiet",
               "--threads", "2"]
        if session_tokens:
            cmd += ["--image-tokens", str(session_tokens)]
        run(cmd)
        got = np.load(logits)
        assert got.shape == ref.shape
        err = float(np.abs(got - ref).max())
        assert err <= 1e-4 * float(np.abs(ref).max()), f"{preset} {score} keep {keep}: max abs error {err}"


@pytest.mark.parametrize("preset", ["tiny-llava", "tiny-idefics3"])
def test_original_positions_equal_the_reference(tiny_dir, preset):
    """--visual-token-positions=original (the default): the prompt's logits and the greedy tokens decoded
    after it equal the reference's with each kept token at its unpruned RoPE position,
    for the artifact's 8 tokens and a session's 4; the consecutive artifact is far off."""
    ckpt, golden = _vt_checkpoint(tiny_dir, preset)
    artifact = tiny_dir / f"vt-{preset}-original.kiln"
    consecutive = tiny_dir / f"vt-{preset}-distinct.kiln"
    out = run([tool("kiln-compile"), ckpt, "-o", artifact, "--kv-cache=f32", "--visual-tokens=50%", "--remarks"])
    assert "keeps 8 of 16 image tokens per image" in out.stderr and "at their original positions" in out.stderr
    if not consecutive.exists():
        run([tool("kiln-compile"), ckpt, "-o", consecutive, "--kv-cache=f32", "--visual-tokens=50%",
             "--visual-token-positions=consecutive"])
    assert "kept (score distinct) at their original positions" in run([tool("kiln-inspect"), artifact]).stdout
    info = json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)
    assert info["image"]["visual_token_positions"] == "original"
    px = np.load(golden / "pixel_values.npy").astype(np.float32)
    np.save(tiny_dir / f"vt-{preset}-px.npy", px.reshape(px.shape[-3:]))
    for session_tokens in (0, 4):
        keep = session_tokens or 8
        ids, ref, greedy = _pruned_reference(ckpt, golden, keep, "distinct", original_positions=True, greedy=4)
        np.save(tiny_dir / "vt-ids.npy", ids)
        logits = tiny_dir / "vt-logits.npy"
        far = {}
        for name, path in (("original", artifact), ("consecutive", consecutive)):
            cmd = [tool("kiln-run"), path, "--input-ids", tiny_dir / "vt-ids.npy", "--pixel-values",
                   tiny_dir / f"vt-{preset}-px.npy", "--dump-logits", logits, "--max-new-tokens", "4",
                   "--threads", "2"]
            if session_tokens:
                cmd += ["--image-tokens", str(session_tokens)]
            stdout = run(cmd).stdout
            got = np.load(logits)
            assert got.shape == ref.shape
            far[name] = float(np.abs(got - ref).max()) / float(np.abs(ref).max())
            if name == "original":
                # The answer after the prompt: decoded at the positions after the unpruned image.
                tokens = [int(t) for t in stdout.split("tokens:")[1].split()]
                assert len(tokens) >= 2 and tokens == greedy[:len(tokens)], (tokens, greedy)
        assert far["original"] <= 1e-4, f"{preset} keep {keep}: relative error {far['original']}"
        assert far["consecutive"] > 100 * max(far["original"], 1e-7), far


def test_prompt_follows_the_kept_tokens_and_sessions_cannot_ask_for_more(tiny_dir):
    ckpt = tiny_dir / "vt-tiny-llava"
    if not ckpt.exists():
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", ckpt])
    from PIL import Image
    Image.fromarray(np.full((40, 40, 3), 200, dtype=np.uint8)).save(tiny_dir / "vt-grey.png")
    full = tiny_dir / "vt-full.kiln"
    pruned = tiny_dir / "vt-quarter.kiln"
    run([tool("kiln-compile"), ckpt, "-o", full])
    run([tool("kiln-compile"), ckpt, "-o", pruned, "--visual-tokens=4"])
    base = ["--image", tiny_dir / "vt-grey.png", "--prompt", "What is it?", "--max-new-tokens", "1", "--json"]
    stats = {}
    for name, artifact, extra in (("full", full, []), ("pruned", pruned, []),
                                  ("session", pruned, ["--image-tokens", "2"])):
        line = run([tool("kiln-run"), artifact, *base, *extra]).stdout.strip().splitlines()[-1]
        stats[name] = json.loads(line)
    assert stats["full"]["image_tokens"] == 16 and stats["pruned"]["image_tokens"] == 4
    assert stats["session"]["image_tokens"] == 2
    assert stats["full"]["prompt_tokens"] - stats["pruned"]["prompt_tokens"] == 12
    assert stats["pruned"]["prompt_tokens"] - stats["session"]["prompt_tokens"] == 2
    info = json.loads(run([tool("kiln-inspect"), pruned, "--json"]).stdout)
    assert info["image"]["image_tokens"] == 4 and info["image"]["image_tokens_scored"] == 16
    # More tokens than the artifact keeps, or fewer from an artifact that selects none.
    for artifact, n, message in ((pruned, "5", "image_tokens 5: must lie in [0, 4], the artifact's"),
                                 (full, "8", "only one compiled with visual-token pruning")):
        p = subprocess_run([tool("kiln-run"), artifact, *base, "--image-tokens", n])
        assert p.returncode != 0 and message in p.stderr, p.stderr


def test_visual_token_errors_leave_no_artifact(mixtral, tiny_dir):
    artifact = tiny_dir / "never-vt.kiln"
    ckpt = tiny_dir / "vt-tiny-llava"
    if not ckpt.exists():
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", ckpt])
    cases = [
        ([ckpt, "--visual-tokens=0"], "keeping '0' of 16 image tokens leaves none"),
        ([ckpt, "--visual-tokens=lots"], "--visual-tokens must be a count (72)"),
        ([ckpt, "--visual-tokens=8", "--visual-token-score=attention"], "--visual-token-score must be distinct or norm"),
        ([ckpt, "--visual-token-score=norm"], "--visual-token-score goes with --visual-tokens"),
        ([ckpt, "--visual-tokens=8", "--visual-token-positions=sorted"],
         "--visual-token-positions must be consecutive or original"),
        ([ckpt, "--visual-token-positions=original"], "--visual-token-positions goes with --visual-tokens"),
        ([mixtral, "--visual-tokens=8"], "the model takes no images"),
    ]
    for args, message in cases:
        p = subprocess_run([tool("kiln-compile"), *args, "-o", artifact])
        assert p.returncode != 0 and message in p.stderr, p.stderr
        assert not artifact.exists()
