"""kiln-bench (issue 18): argument errors, the JSON schema, statistics recomputed from
the runs, the row formats, --compare, and agreement with kiln-run's timings. A tiny
VLM (LLaVA layout) and a tiny Llama, compiled here."""

import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from conftest import MODELS, run, tool


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    out = {}
    for preset in ("tiny-llava", "tiny-llama"):
        ckpt = d / preset
        run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", str(ckpt)])
        out[preset] = d / f"{preset}.kiln"
        run([tool("kiln-compile"), str(ckpt), "-o", str(out[preset])])
    return out


def bench(*args, check=True):
    p = subprocess.run([tool("kiln-bench"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def percentile(values, q):
    """NumPy's default (linear) percentile."""
    v = sorted(values)
    pos = q / 100 * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


@pytest.mark.parametrize("args,message", [
    ([], "no artifact given"),
    (["{llava}", "--threads", "1,x"], "--threads: 'x' is not a thread count"),
    (["{llava}", "--threads", "-1"], "is not a thread count"),
    (["{llava}", "--repetitions", "0"], "--repetitions"),
    (["{llava}", "--image-size", "64y64"], "--image-size: '64y64' is not WxH"),
    (["{llava}", "--image-size", "64x64", "--image", "{llava}"], "exclude each other"),
    (["{llava}", "--prompt", "hi", "--prompt-tokens", "9"], "exclude each other"),
    (["{llava}", "--output", "xml"], "--output"),
    (["{llava}", "--mode", "lukewarm"], "--mode"),
    (["--compare", "a.json"], "--compare"),
    (["{llava}", "--compare", "{llava}", "{llava}"], "--compare takes two JSON files and no artifacts"),
    (["{llava}", "--repetitons", "3"], "did you mean --repetitions"),
])
def test_usage_errors_exit_2(artifacts, args, message):
    args = [a.replace("{llava}", str(artifacts["tiny-llava"])) for a in args]
    p = bench(*args, check=False)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr
    assert p.stdout == ""


def test_bad_artifact_names_the_file_and_writes_nothing(artifacts, tmp_path):
    bad = tmp_path / "cut.kiln"
    data = artifacts["tiny-llava"].read_bytes()
    bad.write_bytes(data[: len(data) // 3])
    out = tmp_path / "out.json"
    p = bench(bad, "-r", "1", "--output", "json", "-o", out, check=False)
    assert p.returncode == 1, p.stderr
    assert "cut.kiln" in p.stderr
    assert not out.exists() and not (tmp_path / "out.json.part").exists()
    p = bench("--compare", bad, bad, check=False)
    assert p.returncode == 1 and "is not JSON" in p.stderr, p.stderr


def test_json_schema_and_statistics(artifacts, tmp_path):
    out = tmp_path / "b.json"
    p = bench(artifacts["tiny-llava"], artifacts["tiny-llama"], "--mode", "both", "--threads", "1,2", "-r", "3",
              "--warmup", "0", "--gen-tokens", "4", "--output", "json", "-o", out)
    assert "| artifact | mode | threads" in p.stderr  # the table goes to stderr beside a file
    d = json.loads(out.read_text())
    assert d["tool"] == "kiln-bench" and d["schema"] == 1 and d["version"]
    assert d["machine"]["cores"] >= 1 and d["machine"]["cpu"]
    assert d["params"]["repetitions"] == 3 and d["params"]["threads"] == [1, 2] and d["params"]["gen_tokens"] == 4
    configs = {(r["artifact"]["name"], r["mode"], r["threads"]) for r in d["results"]}
    assert configs == {(f"{p}.kiln", m, t) for p in ("tiny-llava", "tiny-llama") for m in ("cold", "warm")
                       for t in (1, 2)}
    for r in d["results"]:
        a = r["artifact"]
        assert a["target"] and a["architecture"] and a["file_bytes"] > a["weight_bytes"] > 0
        assert sum(a["precision_bytes"].values()) == a["weight_bytes"]  # every weight in the precision mix
        assert len(r["runs"]) == 3
        for run_ in r["runs"]:
            assert run_["threads_used"] == r["threads"]
            stages = sum(run_[k] for k in ("image_preprocess_ms", "vision_encoder_ms", "projector_ms", "prefill_ms",
                                           "first_token_ms"))
            # TTFT is measured end to end: the stages plus a little bookkeeping between them.
            assert stages <= run_["ttft_ms"] + 1e-3 and run_["ttft_ms"] - stages <= 0.05 + 0.02 * run_["ttft_ms"]
            assert 1 <= run_["generated_tokens"] <= 4 and run_["peak_rss_bytes"] > 0 and run_["kv_cache_bytes"] > 0
            if r["mode"] == "cold":
                assert run_["cold_total_ms"] >= run_["load_ms"] + run_["ttft_ms"]
                assert 0 <= run_["cached_fraction_before"] <= 1
            else:
                assert "cold_total_ms" not in run_
        vlm = r["artifact"]["name"].startswith("tiny-llava")
        assert (r["runs"][0]["image_tokens"] > 0) == vlm
        assert (r["runs"][0]["vision_encoder_ms"] > 0) == vlm
        # Every statistic recomputed from the runs.
        for metric, s in r["stats"].items():
            values = [x[metric] for x in r["runs"]]
            assert s["n"] == 3
            for key, want in (("median", percentile(values, 50)), ("p10", percentile(values, 10)),
                              ("p90", percentile(values, 90)), ("min", min(values)), ("max", max(values)),
                              ("mean", sum(values) / 3)):
                assert math.isclose(s[key], want, rel_tol=1e-6, abs_tol=1e-9), (metric, key, s[key], want)
            mean = sum(values) / 3
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
            # The runs are printed to 9 digits: the deviations lose a little more.
            scale = max(abs(v) for v in values)
            assert math.isclose(s["stddev"], sd, rel_tol=1e-5, abs_tol=1e-7 * scale), (metric, s["stddev"], sd)
        for w in r["warnings"]:
            assert "varies by" in w or "page cache" in w


def test_rows_and_prompt_tokens(artifacts):
    p = bench(artifacts["tiny-llama"], "-r", "2", "--warmup", "0", "--gen-tokens", "2", "--threads", "1",
              "--prompt-tokens", "30", "--output", "jsonl")
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == 2 and rows[0]["run"] == 1 and rows[1]["run"] == 2
    p40 = bench(artifacts["tiny-llama"], "-r", "1", "--warmup", "0", "--gen-tokens", "2", "--threads", "1",
                "--prompt-tokens", "40", "--output", "csv")
    table = list(csv.DictReader(io.StringIO(p40.stdout)))
    assert len(table) == 1 and "ttft_ms" in table[0] and table[0]["mode"] == "warm"
    # Ten more text tokens asked, ten more prompt tokens fed (the template's are the same).
    assert int(float(table[0]["prompt_tokens"])) - rows[0]["prompt_tokens"] == 10


def test_agrees_with_kiln_run(artifacts, tmp_path):
    """The same artifact, prompt, image and thread count through kiln-run: the same
    token counts and memory, and a TTFT within an order of magnitude of kiln-bench's runs
    (kiln-run's one answer pays first-run costs; timings on a shared machine vary)."""
    photo = tmp_path / "photo.png"
    from PIL import Image
    Image.new("RGB", (40, 30), (200, 30, 90)).save(photo)
    art = artifacts["tiny-llava"]
    out = tmp_path / "b.json"
    bench(art, "--image", photo, "--prompt", "What is this?", "--threads", "1", "-r", "5", "--warmup", "0",
          "--gen-tokens", "6", "--output", "json", "-o", out)
    b = json.loads(out.read_text())["results"][0]
    p = run([tool("kiln-run"), str(art), "--image", str(photo), "--prompt", "What is this?", "--threads", "1",
             "--max-new-tokens", "6", "--json"])
    k = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("prompt_tokens", "image_tokens", "generated_tokens", "decode_steps", "kv_cache_bytes", "arena_bytes"):
        assert b["runs"][0][key] == k[key], key
    assert b["stats"]["ttft_ms"]["min"] / 10 <= k["ttft_ms"] <= 10 * b["stats"]["ttft_ms"]["max"]


def test_compare(artifacts, tmp_path):
    a = tmp_path / "a.json"
    bench(artifacts["tiny-llama"], "-r", "3", "--warmup", "0", "--gen-tokens", "2", "--threads", "1",
          "--output", "json", "-o", a)
    p = bench("--compare", a, a)
    assert "| tiny-llama.kiln warm threads=1 | ttft_ms |" in p.stdout
    assert "1.000x" in p.stdout and "within noise" in p.stdout and "significant" not in p.stdout
    # B twice as slow, its range apart: a significant ratio of 2.
    d = json.loads(a.read_text())
    for r in d["results"]:
        for key in ("median", "p10", "p90"):
            r["stats"]["ttft_ms"][key] *= 2
        r["stats"]["ttft_ms"]["p10"] = max(r["stats"]["ttft_ms"]["p10"],
                                           json.loads(a.read_text())["results"][0]["stats"]["ttft_ms"]["p90"] * 1.01)
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(d))
    p = bench("--compare", a, slow)
    line = next(l for l in p.stdout.splitlines() if "| ttft_ms |" in l)
    assert "2.000x" in line and "significant" in line, p.stdout
    # Nothing in common.
    other = tmp_path / "other.json"
    shutil.copy(a, other)
    d = json.loads(other.read_text())
    d["results"][0]["threads"] = 7
    other.write_text(json.dumps(d))
    p = bench("--compare", a, other, check=False)
    assert p.returncode == 1 and "no configuration" in p.stderr
