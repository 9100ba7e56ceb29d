"""Per-layer precision end to end: the compiler's quantiser against the NumPy
reference, budgets met and reported, infeasible budgets diagnosed, and quantised
models that still answer like the reference."""

import json
import os

import numpy as np
import pytest

from conftest import MODELS, calibrated_tiny_llava, run, tool

from kiln_models import quant
from kiln_models.safetensors_io import Checkpoint


def _inspect(artifact):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)


def _log_softmax(logits):
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _mean_kl(logp_ref, logp):
    """Mean over rows of KL(ref || other), both given as log-probabilities."""
    return float((np.exp(logp_ref) * (logp_ref - logp)).sum(-1).mean())


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision") / "tiny-llama"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", d])
    return d


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    return calibrated_tiny_llava(tmp_path_factory.mktemp("precision-vlm"))


@pytest.mark.parametrize("label", ["int8", "fp8_e4m3", "fp8_e5m2", "int4_g32", "int4_g64_asym"])
def test_compiler_quantiser_matches_numpy(label, tiny_llama, tmp_path):
    """Every quantised tensor's bytes equal the NumPy reference's (round to nearest), in
    the layout kiln-inspect names."""
    artifact = tmp_path / f"{label}.kiln"
    run([tool("kiln-compile"), tiny_llama, "-o", artifact, "--precision", f".*={label}"])
    info = _inspect(artifact)
    data = artifact.read_bytes()
    enc = label.split("_g")[0] if label.startswith("int4") else label
    group = int(label.split("_g")[1].split("_")[0]) if label.startswith("int4") else 0
    symmetric = "asym" not in label
    checked = 0
    layouts = set()
    with Checkpoint(str(tiny_llama)) as ckpt:
        for row in info["precision"]:
            if row["encoding"] != label:
                continue
            layouts.add(row["layout"])
            name = row["tensor"]
            if "qkv_proj" in name:  # fused by kiln-fuse-qkv: the rows of q, k and v
                w = np.concatenate([np.array(ckpt.get_numpy(name.replace("qkv_proj", p))) for p in
                                    ("q_proj", "k_proj", "v_proj")])
            elif "gate_up_proj" in name:  # kiln-fuse-gate-up: rows of gate and up in turns of 128
                g, u = (np.array(ckpt.get_numpy(name.replace("gate_up_proj", p))) for p in ("gate_proj", "up_proj"))
                w = np.concatenate([m[i:i + 128] for i in range(0, len(g), 128) for m in (g, u)])
            else:
                w = np.array(ckpt.get_numpy(name))
            # Packed for the generated matmuls that read it (kiln-pack-weights).
            expected = quant.to_packed_bytes(quant.quantize(w, enc, group, symmetric), enc, row["layout"])
            got = data[row["offset"]:row["offset"] + row["bytes"]]
            assert got == expected, f"{row['tensor']} ({label}) differs from the NumPy reference"
            checked += 1
    assert checked >= 8  # per layer: qkv_proj, o_proj, gate_up_proj, down_proj
    # The generated matmuls read every encoding packed but int4 with zero points.
    assert layouts - {"row_major"} if symmetric else layouts == {"row_major"}, layouts


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
    assert rep["quantizer"] == "gptq"  # --quantizer=auto under a budget
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
    # An f32 KV cache: the scores measure the weights' precision alone.
    run([tool("kiln-compile"), ckpt, "-o", out, "--kv-cache=f32", *extra])
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


# The bundled demo model, quantised: compiled at about 4.5 bits per weight (the
# solver calibrated on the checkpoint's bundled calibration set), its answers to
# 100 held-out questions are scored through kiln-run --score against the fp32
# artifact's.
DEMO = os.path.join(MODELS, "shapes", "checkpoints", "dense")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo-precision")
    run(["/usr/bin/python3", os.path.join(MODELS, "shapes", "make_examples.py"), "--out", d / "q", "--count", "100",
         "--split", "test", "--start", "1000"])
    arts = {"fp32": run_compile(DEMO, d / "fp32.kiln", "--precision", ".*=f32"),
            "int4": run_compile(DEMO, d / "int4.kiln", "--precision", ".*=int4_g32")}
    int4_bytes = sum(r["bytes"] for r in _inspect(arts["int4"])["precision"])
    arts["mix45"] = run_compile(DEMO, d / "mix45.kiln", "--bits-per-weight", "4.5", "--cache-dir", d / "cache")
    arts["mix_eq"] = run_compile(DEMO, d / "mix_eq.kiln", "--memory-budget", str(int4_bytes), "--cache-dir",
                                 d / "cache")
    scores = {}
    for name, art in arts.items():
        logits = d / f"{name}.npy"
        out = run([tool("kiln-run"), art, "--batch", d / "q" / "questions.jsonl", "--score", "--answer-suffix", "</s>",
                   "--dump-logits", logits, "--threads", "2"]).stdout
        lines = [json.loads(l) for l in out.splitlines()]
        table = _inspect(art)["precision"]
        scores[name] = {"accuracy": np.mean([l["greedy_match"] for l in lines]), "logp": _log_softmax(np.load(logits)),
                        "params": sum(int(np.prod(r["shape"])) for r in table),
                        "bytes": sum(r["bytes"] for r in table)}
    return scores


def _kl(demo, name):
    return _mean_kl(demo["fp32"]["logp"], demo[name]["logp"])


def test_demo_at_4_5_bits_answers_like_fp32(demo):
    mix = demo["mix45"]
    assert 8 * mix["bytes"] <= 4.5 * mix["params"]
    for name in ("int4", "mix45", "mix_eq"):
        assert demo[name]["accuracy"] >= demo["fp32"]["accuracy"] - 0.02, (name, demo[name]["accuracy"],
                                                                          demo["fp32"]["accuracy"])
    assert demo["fp32"]["accuracy"] >= 0.75


def test_demo_solved_mix_beats_uniform_int4_at_equal_bytes(demo):
    """At the bytes of uniform int4 (g32, round to nearest), the solved mix's answer
    distributions are closer to fp32's (mean KL over the scored answer tokens)."""
    assert demo["mix_eq"]["bytes"] <= demo["int4"]["bytes"]
    kl_int4, kl_mix = _kl(demo, "int4"), _kl(demo, "mix_eq")
    assert kl_mix < kl_int4, f"solved mix KL {kl_mix:.3e} vs uniform int4 {kl_int4:.3e}"


def test_gptq_covers_moe_experts(tmp_path):
    """GPTQ rounds MoE experts with the Hessian of the rows routed to them: their
    bytes differ from round-to-nearest's, and on held-out text the model's
    next-token distributions are closer to fp32's (only the experts quantised)."""
    from kiln_models.tokenizer import ByteLevelBPE, corpus_text
    ckpt = tmp_path / "tiny-mixtral"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-mixtral", "--out", ckpt])
    sentences = [s.strip() + "." for s in corpus_text().split(".") if len(s.strip()) > 20]
    assert len(sentences) >= 52
    (ckpt / "calibration.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in sentences[:40]))
    only_experts = ["--precision", ".*experts.*=int4_g32", "--precision", ".*=f32"]
    f32 = run_compile(ckpt, tmp_path / "f32.kiln", "--precision", ".*=f32")
    rtn = run_compile(ckpt, tmp_path / "rtn.kiln", *only_experts, "--quantizer", "rtn")
    gptq = run_compile(ckpt, tmp_path / "gptq.kiln", *only_experts, "--quantizer", "gptq")
    rows = {a: {r["tensor"]: r for r in _inspect(a)["precision"]} for a in (rtn, gptq)}
    experts = [t for t in rows[rtn] if rows[rtn][t]["encoding"] == "int4_g32"]
    assert len(experts) >= 12 and all(".experts." in t for t in experts)
    data = {a: a.read_bytes() for a in (rtn, gptq)}

    def stored(a, t):
        r = rows[a][t]
        return data[a][r["offset"]:r["offset"] + r["bytes"]]

    changed = [t for t in experts if stored(rtn, t) != stored(gptq, t)]
    assert len(changed) >= len(experts) // 2, f"GPTQ changed {len(changed)} of {len(experts)} expert weights"

    tok = ByteLevelBPE.load(str(ckpt))
    kl = {rtn: [], gptq: []}
    for i, text in enumerate(sentences[40:52]):
        ids = tmp_path / f"ids{i}.npy"
        np.save(ids, np.array(tok.encode(text, add_special_tokens=True), dtype=np.int64))
        logp = {}
        for a in (f32, rtn, gptq):
            out = tmp_path / "logits.npy"
            run([tool("kiln-run"), a, "--input-ids", ids, "--dump-logits", out, "--max-new-tokens", "1", "--quiet"])
            logp[a] = _log_softmax(np.load(out)[0])
        for a in (rtn, gptq):
            kl[a].append(_mean_kl(logp[f32], logp[a]))
    assert np.mean(kl[gptq]) < np.mean(kl[rtn]), (np.mean(kl[gptq]), np.mean(kl[rtn]))


def test_progress_on_a_terminal_only(tiny_llava, tmp_path):
    """On a terminal (a pseudo-terminal from script(1)) a budgeted compile draws the
    progress of calibration, sensitivity and the weights (what, how many of how many,
    the time so far); --quiet, or stderr not a terminal, draws none."""
    import shlex
    import shutil
    import subprocess
    if shutil.which("script") is None:
        pytest.skip("script(1) not installed")
    base = [tool("kiln-compile"), tiny_llava, "--bits-per-weight=6", "--calibration-threads=2",
            "--cache-dir", tmp_path / "cache"]

    def on_terminal(extra, out):
        cmd = " ".join(shlex.quote(str(c)) for c in base + ["-o", out] + extra)
        p = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, errors="replace")
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    drawn = on_terminal([], tmp_path / "a.kiln")
    for what in ("calibration: 0/4", "sensitivity: 0/", "weights: 0/"):
        assert what in drawn, drawn
    assert "\033[K" in drawn
    assert "weights:" not in on_terminal(["--quiet"], tmp_path / "b.kiln")
    piped = run(base + ["-o", tmp_path / "c.kiln"])
    assert "weights:" not in piped.stderr and "\033[K" not in piped.stderr
