"""Weight expressions (#kiln.concat, #kiln.slice, #kiln.permute) end to end: the
artifact writer evaluates them to the right values.

A tiny checkpoint is lowered to IR (kiln-compile --emit=planned-ir), written back to
an artifact (kiln-compile --from-ir) as is and after kiln-opt --kiln-test-split-weights,
which rewrites every [R, C] weight as concat(concat(slice, slice), permute(permute(slice)))
of its own source and every [N] weight as concat(slice, slice): an expression with the
same value. The two artifacts must store the same bytes for every weight and produce
the same logits, for float encodings (the plain source is copied, the expression
evaluated and encoded) and quantised ones, from f32 and bf16 checkpoints.
"""

import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import MODELS, run, tool

CASES = [
    # (id, generate.py arguments, kiln-compile precision arguments)
    ("f32", [], []),
    ("bf16-sharded", ["--dtype", "bf16", "--shard-size", "200KB"], []),
    ("f32-to-bf16", [], ["--precision", ".*=bf16"]),
    ("int8", [], ["--precision", ".*=int8"]),
    ("int4", [], ["--precision", ".*embed.*=int8", "--precision", ".*=int4_g32_asym"]),
]


def _inspect(artifact):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)


def _leaves(shape):
    """How often --kiln-test-split-weights reads a weight's source."""
    if len(shape) not in (1, 2) or min(shape) < 2:
        return 1
    return 2 if len(shape) == 1 else 3


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def compiled(request, tmp_path_factory):
    name, gen_args, precision = request.param
    d = tmp_path_factory.mktemp(f"weight-transforms-{name}")
    ckpt = d / "ckpt"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", ckpt]
        + gen_args)
    planned = d / "planned.mlir"
    split = d / "split.mlir"
    # Locations name the ops: keep them so that the artifacts are complete. Unfused, so
    # that every weight is one plain source the test pass can split.
    # An f32 KV cache: split and plain weights differ by float rounding.
    planned.write_text(run([tool("kiln-compile"), ckpt, "--emit=planned-ir", "--mlir-print-debuginfo", "--no-fuse",
                            "--kv-cache=f32"] + precision).stdout)
    split.write_text(run([tool("kiln-opt"), planned, "--kiln-test-split-weights",
                          "--mlir-print-debuginfo"]).stdout)
    plain_kiln, split_kiln = d / "plain.kiln", d / "split.kiln"
    run([tool("kiln-compile"), "--from-ir", planned, "-o", plain_kiln, "--report", d / "plain.json"])
    run([tool("kiln-compile"), "--from-ir", split, "-o", split_kiln, "--report", d / "split.json"])
    return {"dir": d, "ckpt": ckpt, "precision": precision, "planned": planned, "split": split,
            "plain": plain_kiln, "split_kiln": split_kiln}


def test_split_ir_uses_every_transform(compiled):
    text = compiled["split"].read_text()
    for attr in ("#kiln.concat<axis = 0", "#kiln.concat<axis = 1", "#kiln.slice<", "#kiln.permute<"):
        assert attr in text, attr
    # Every weight of rank 1 or 2 (dimensions >= 2) is rewritten, the others not.
    weights = re.findall(r"^\s*kiln\.weight @\S+ : tensor<([0-9x]+)x[a-z0-9]+> from (\S+)", text, re.M)
    assert weights
    for dims, expr in weights:
        shape = [int(d) for d in dims.split("x")]
        assert expr.startswith("#kiln.concat<") == (_leaves(shape) > 1), (shape, expr)


def test_weight_bytes_identical(compiled):
    plain, split = _inspect(compiled["plain"]), _inspect(compiled["split_kiln"])
    a = compiled["plain"].read_bytes()
    b = compiled["split_kiln"].read_bytes()
    assert len(a) == len(b)
    assert [t["tensor"] for t in plain["precision"]] == [t["tensor"] for t in split["precision"]]
    encodings = set()
    for p, s in zip(plain["precision"], split["precision"]):
        assert (p["offset"], p["bytes"], p["encoding"], p["shape"]) == \
            (s["offset"], s["bytes"], s["encoding"], s["shape"]), p["tensor"]
        assert a[p["offset"]:p["offset"] + p["bytes"]] == b[s["offset"]:s["offset"] + s["bytes"]], \
            f"{p['tensor']} ({p['encoding']}): the split expression stored different bytes"
        # The source bytes are every leaf's: the split reads its source 1, 2 or 3 times.
        assert s["source_bytes"] == p["source_bytes"] * _leaves(p["shape"]), p["tensor"]
        encodings.add(p["encoding"])
    if compiled["precision"]:
        assert encodings - {"f32"}, encodings  # the precision override took effect
    # The source hash covers every leaf, so it tells the two apart.
    assert plain["source_hash"] != split["source_hash"]


def test_report_counts_every_leaf(compiled):
    plain = json.loads((compiled["dir"] / "plain.json").read_text())
    split = json.loads((compiled["dir"] / "split.json").read_text())
    for p, s in zip(plain["weights"], split["weights"]):
        assert p["name"] == s["name"]
        assert s["source_bytes"] == p["source_bytes"] * _leaves(p["shape"]), p["name"]
        assert (s["bytes"], s["encoding"], s["source_encoding"]) == (p["bytes"], p["encoding"], p["source_encoding"])


def test_logits_identical(compiled):
    d = compiled["dir"]
    ids = np.array([[1, 17, 42, 99, 7, 300, 12, 5]], dtype=np.int64)
    np.save(d / "ids.npy", ids)
    logits = []
    for artifact in (compiled["plain"], compiled["split_kiln"]):
        out = d / f"{artifact.stem}-logits.npy"
        run([tool("kiln-run"), artifact, "--input-ids", d / "ids.npy", "--dump-logits", out,
             "--max-new-tokens", "4", "--threads", "1", "--quiet"])
        logits.append(np.load(out))
    assert logits[0].shape == logits[1].shape and logits[0].size > 0
    assert np.array_equal(logits[0], logits[1])


def test_from_ir_equals_direct_compile(compiled):
    """Without transforms, writing the artifact from the printed IR is the same as
    compiling the checkpoint: same bytes, source hash included."""
    if compiled["precision"]:
        pytest.skip("one case suffices")
    direct = compiled["dir"] / "direct.kiln"
    run([tool("kiln-compile"), compiled["ckpt"], "-o", direct, "--no-fuse", "--kv-cache=f32"])
    assert direct.read_bytes() == compiled["plain"].read_bytes()
    # Fused (the default): the concatenated weights and fused ops print and read back.
    fused_ir, from_ir, fused = (compiled["dir"] / n for n in ("fused.mlir", "fused-from-ir.kiln", "fused.kiln"))
    fused_ir.write_text(run([tool("kiln-compile"), compiled["ckpt"], "--emit=planned-ir",
                             "--mlir-print-debuginfo"]).stdout)
    assert "kiln.qkv_attention" in fused_ir.read_text()
    run([tool("kiln-compile"), "--from-ir", fused_ir, "-o", from_ir])
    run([tool("kiln-compile"), compiled["ckpt"], "-o", fused])
    assert from_ir.read_bytes() == fused.read_bytes()


def test_from_ir_rejects_checkpoint_options(compiled, tmp_path):
    if compiled["precision"]:
        pytest.skip("one case suffices")
    kc = tool("kiln-compile")
    for args, message in [
        (["--from-ir", compiled["planned"], "-o", tmp_path / "x.kiln", "--precision", ".*=int8"],
         "--precision applies to compiling a checkpoint, not to --from-ir"),
        (["--from-ir", compiled["planned"], compiled["ckpt"], "-o", tmp_path / "x.kiln"],
         "give a checkpoint directory or --from-ir FILE.mlir (one of them)"),
    ]:
        p = subprocess.run([kc] + [str(a) for a in args], capture_output=True, text=True)
        assert p.returncode != 0 and message in p.stderr, p.stderr
    assert not (tmp_path / "x.kiln").exists()
