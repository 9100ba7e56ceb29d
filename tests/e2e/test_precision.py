"""Per-layer precision end to end: the compiler's quantiser against the NumPy
reference, budgets met and reported, infeasible budgets diagnosed, and quantised
models that still answer like the reference."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from conftest import MODELS, run, tool

from kiln_models import quant
from kiln_models.safetensors_io import Checkpoint


def _inspect(artifact):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision") / "tiny-llama"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", d])
    return d


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision-vlm")
    d = root / "tiny-llava"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", d])
    rng = np.random.default_rng(5)
    lines = []
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).resize((40, 40)).save(d / f"calib{i}.png")
        lines.append(json.dumps({"image": f"calib{i}.png", "prompt": "What is in the picture?", "answer": "a part"}))
    # In the checkpoint directory: kiln-compile finds it without --calibration.
    (d / "calibration.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize("label", ["int8", "fp8_e4m3", "fp8_e5m2", "int4_g32", "int4_g64_asym"])
def test_compiler_quantiser_matches_numpy(label, tiny_llama, tmp_path):
    """Every quantised tensor's bytes equal the NumPy reference's (round to nearest)."""
    artifact = tmp_path / f"{label}.kiln"
    run([tool("kiln-compile"), tiny_llama, "-o", artifact, "--precision", f".*={label}"])
    info = _inspect(artifact)
    data = artifact.read_bytes()
    enc = label.split("_g")[0] if label.startswith("int4") else label
    group = int(label.split("_g")[1].split("_")[0]) if label.startswith("int4") else 0
    symmetric = "asym" not in label
    checked = 0
    with Checkpoint(str(tiny_llama)) as ckpt:
        for row in info["precision"]:
            if row["encoding"] != label:
                continue
            w = np.array(ckpt.get_numpy(row["tensor"]))
            expected = quant.to_bytes(quant.quantize(w, enc, group, symmetric), enc)
            got = data[row["offset"]:row["offset"] + row["bytes"]]
            assert got == expected, f"{row['tensor']} ({label}) differs from the NumPy reference"
            checked += 1
    assert checked >= 10


def test_budget_met_and_reported(tiny_llava, tmp_path):
    """A memory budget is met, every decision is in the report, and the artifact's
    precision table agrees with the report."""
    artifact = tmp_path / "mix.kiln"
    report = tmp_path / "mix.json"
    base = _inspect(run_compile(tiny_llava, tmp_path / "f32.kiln"))
    total = sum(r["bytes"] for r in base["precision"])
    budget = int(total * 0.35)
    run([tool("kiln-compile"), tiny_llava, "-o", artifact, "--memory-budget", str(budget), "--report", report,
         "--cache-dir", tmp_path / "cache"])
    info = _inspect(artifact)
    stored = sum(r["bytes"] for r in info["precision"])
    assert stored <= budget
    rep = json.loads(report.read_text())
    assert rep["bytes"] == stored
    by_name = {r["tensor"]: r for r in info["precision"]}
    assert {w["name"] for w in rep["weights"]} == set(by_name)
    for w in rep["weights"]:
        row = by_name[w["name"]]
        assert (w["encoding"], w["bytes"]) == (row["encoding"], row["bytes"]), w["name"]
        if w["sensitivity"] is not None and row["sensitivity"] is not None:
            assert abs(w["sensitivity"] - row["sensitivity"]) <= 1e-6 * max(1.0, abs(w["sensitivity"]))
    assert (tmp_path / "mix.svg").read_text().startswith("<svg")
    encodings = {r["encoding"] for r in info["precision"]}
    assert len(encodings) >= 3, f"expected a mix of encodings, got {encodings}"
    # The quantised model still runs and answers with the reference tokenizer's ids.
    run([tool("kiln-run"), artifact, "--prompt", "Hello", "--max-new-tokens", "4", "--quiet"])
    # Recompiling with another budget reuses the cached sensitivities.
    out = run([tool("kiln-compile"), tiny_llava, "-o", tmp_path / "mix2.kiln", "--bits-per-weight", "6",
               "--cache-dir", tmp_path / "cache", "--remarks"])
    assert "sensitivities from the cache" in out.stderr


def run_compile(ckpt, out, *extra):
    run([tool("kiln-compile"), ckpt, "-o", out, *extra])
    return out


def test_infeasible_budget_names_the_smallest(tiny_llama, tmp_path):
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"prompt": "The quick brown fox"}\n')
    out = tmp_path / "never.kiln"
    import subprocess
    p = subprocess.run([tool("kiln-compile"), tiny_llama, "-o", out, "--memory-budget", "1KB",
                        "--calibration", calib, "--cache-dir", tmp_path / "c"], capture_output=True, text=True)
    assert p.returncode != 0
    assert "cannot be met" in p.stderr and "give --memory-budget=" in p.stderr, p.stderr
    assert not out.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith("never.kiln")]


def test_gptq_writes_a_working_artifact(tiny_llava, tmp_path):
    artifact = tmp_path / "gptq.kiln"
    run([tool("kiln-compile"), tiny_llava, "-o", artifact, "--precision", ".*=int4_g32", "--quantizer", "gptq"])
    info = _inspect(artifact)
    assert any(r["encoding"] == "int4_g32" for r in info["precision"])
    run([tool("kiln-run"), artifact, "--prompt", "Hello", "--max-new-tokens", "4", "--quiet"])
