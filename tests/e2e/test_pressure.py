"""Long conversations and a device under pressure, from kiln-run: a sliding window
(--context-overflow slide) goes past the context instead of failing; --pressure
lowers the threads and the window by the session's default policy; two models share
one --memory-budget (--model), loaded when a --batch line asks for one and the least
recently used unloaded to make room, answering as each does on its own."""

import json
import os
import subprocess

import pytest

from conftest import MODELS, run, tool

CHECKPOINTS = os.path.join(MODELS, "shapes", "checkpoints")
EXAMPLES = os.path.join(MODELS, "shapes", "examples")
LONG = "Look at the picture carefully, every shape, its colour and its place. " * 5 + "How many shapes?"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("pressure")
    out = {}
    for name in ("dense", "moe"):
        out[name] = d / f"{name}.kiln"
        run([tool("kiln-compile"), os.path.join(CHECKPOINTS, name), "-o", out[name]])
    return out


def kiln_json(artifact, *flags, check=True):
    args = [str(a) for a in [tool("kiln-run"), artifact, "--image", os.path.join(EXAMPLES, "000.png"),
                             "--threads", "2", "--json", "--quiet", *flags]]
    p = subprocess.run(args, capture_output=True, text=True, errors="replace")
    if check:
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[-1])
    return p


def test_sliding_window_goes_past_the_context(demo):
    dense = demo["dense"]
    full = kiln_json(dense, "--prompt", LONG, "--max-new-tokens", "4")
    assert full["prompt_tokens"] > 100, full
    # The prompt alone is longer than 96 positions: stopping refuses it, sliding answers.
    stop = kiln_json(dense, "--prompt", LONG, "--context", "96", check=False)
    assert stop.returncode == 1 and "do not fit the 96-token context" in stop.stderr, stop.stderr
    for extra in ([], ["--kv-pool", "512", "--kv-block", "16"]):
        slid = kiln_json(dense, "--prompt", LONG, "--context", "96", "--context-overflow", "slide",
                         "--max-new-tokens", "4", *extra)
        assert slid["evicted_tokens"] > 0 and slid["context_limit"] == 96, slid
        assert slid["prompt_tokens"] == full["prompt_tokens"] and slid["generated_tokens"] >= 1, slid
    # A window that keeps all its positions cannot slide: refused when the session is made.
    p = kiln_json(dense, "--prompt", LONG, "--context", "96", "--context-overflow", "slide", "--keep-tokens", "96",
                  check=False)
    assert p.returncode == 1 and "keep_tokens 96: must be >= 0 and below the 96-token context" in p.stderr, p.stderr


def test_pressure_lowers_threads_and_window(demo):
    dense = demo["dense"]
    calm = kiln_json(dense, "--prompt", LONG, "--context", "256")
    assert calm["active_threads"] == 2 and calm["context_limit"] == 256 and calm["evicted_tokens"] == 0, calm
    hot = kiln_json(dense, "--prompt", "How many shapes?", "--pressure", "thermal=critical")
    assert hot["active_threads"] == 1, hot  # the default policy: one thread when critical
    # The demo's 256 positions are below the default policy's windows: a policy of the
    # app's (--pressure-context) keeps 128 under serious memory pressure.
    tight = kiln_json(dense, "--prompt", LONG, "--context", "256", "--pressure", "memory=serious",
                      "--pressure-context", "0,0,128,64")
    assert tight["context_limit"] == 128 and tight["evicted_tokens"] > 0, tight
    assert tight["prompt_tokens"] == calm["prompt_tokens"], tight
    battery = kiln_json(dense, "--prompt", "How many shapes?", "--pressure", "battery=serious")
    assert battery["active_threads"] == 2, battery  # serious: at most 2
    for bad in ("heat=serious", "memory=high", "memory"):
        p = kiln_json(dense, "--prompt", "x", "--pressure", bad, check=False)
        assert p.returncode == 2 and "is not KIND=LEVEL" in p.stderr, (bad, p.stderr)
    p = kiln_json(dense, "--prompt", "x", "--pressure-threads", "0,1,2", check=False)
    assert p.returncode == 2 and "four" in p.stderr, p.stderr


def _need(artifact) -> int:
    out = run([tool("kiln-inspect"), artifact, "--memory", "256", "--threads", "2", "--json"]).stdout
    return json.loads(out)["memory"]["total_bytes"]


def test_two_models_share_one_budget(demo, tmp_path):
    dense, moe = demo["dense"], demo["moe"]
    a, b = _need(dense), _need(moe)
    budget = max(a, b) + min(a, b) // 2  # one at a time
    qs = [json.loads(l) for l in open(os.path.join(EXAMPLES, "questions.jsonl"))][:3]
    lines = []
    for q in qs:
        for name in ("dense.kiln", "moe.kiln"):
            lines.append({"id": f"{q['id']}-{name}", "model": name, "prompt": q["prompt"],
                          "image": os.path.join(EXAMPLES, q["image"])})
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    common = ["--batch", path, "--threads", "2", "--context", "256", "--max-new-tokens", "8"]
    out = run([str(x) for x in [tool("kiln-run"), dense, "--model", moe, f"--memory-budget={budget}", *common]])
    got = [json.loads(l) for l in out.stdout.splitlines()]
    assert len(got) == len(lines), out.stderr
    for g in got:
        assert g["models_loaded"] == 1 and g["shared_budget_used_bytes"] <= budget, g
    assert got[-1]["model_unloads"] == len(lines) - 1 and got[-1]["model_loads"] == len(lines), got[-1]
    # Each answers as it does alone.
    for name, artifact in (("dense.kiln", dense), ("moe.kiln", moe)):
        mine = [l for l in lines if l["model"] == name]
        single = tmp_path / f"{name}.jsonl"
        single.write_text("".join(json.dumps({k: v for k, v in l.items() if k != "model"}) + "\n" for l in mine))
        ref = [json.loads(l) for l in run([str(x) for x in [tool("kiln-run"), artifact, "--batch", single,
                                                            "--threads", "2", "--context", "256",
                                                            "--max-new-tokens", "8"]]).stdout.splitlines()]
        assert [r["answer"] for r in ref] == [g["answer"] for g in got if g["id"].endswith(name)]
    # A budget the larger model alone does not fit: refused when added, naming the parts.
    p = subprocess.run([str(x) for x in [tool("kiln-run"), dense, "--model", moe, f"--memory-budget={min(a, b) - 1}",
                                         *common]], capture_output=True, text=True)
    assert p.returncode == 1 and "memory budget" in p.stderr, p.stderr
