"""The memory budget: what a model and one session need, as kiln-inspect --memory
shows it, is what kiln-run --memory-budget is checked against; a budget below it is
refused before the model runs, naming each part; and the peak resident memory of a
run stays at or under it.

kiln-run --json reports its peak RSS (VmHWM) and its RSS when main() began; the test
holds the difference to the declared need plus what the process itself pages in as
it runs (its code, at most the binary's size, library pages, thread stacks, the
decoded input: about 2-4 MB here, which the report does not count)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import MODELS, ROOT, run, tool

DEMO = os.path.join(MODELS, "shapes", "checkpoints", "dense")
EXAMPLES = os.path.join(MODELS, "shapes", "examples")


def _report(artifact, context, threads=2, kv=None) -> dict:
    args = [tool("kiln-inspect"), artifact, "--memory", str(context), "--threads", str(threads), "--json"]
    if kv:
        args += ["--kv-cache", kv]
    return json.loads(run(args).stdout)["memory"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    demo = d / "demo.kiln"
    run([tool("kiln-compile"), DEMO, "-o", demo])
    # A SmolLM-135M-shaped decoder (SmolVLM-256M's: 576 wide, 9/3 heads, vocab 49280),
    # cut to 4 layers.
    ckpt = d / "smollm"
    run(["/usr/bin/python3", os.path.join(ROOT, "bench", "make_checkpoint.py"), "--model", "smollm-135m",
         "--out", ckpt, "--layers", "4"])
    smollm = d / "smollm.kiln"
    run([tool("kiln-compile"), ckpt, "-o", smollm])
    return {"demo": demo, "smollm": smollm}


def test_budget_below_the_need_is_refused_naming_each_part(models):
    demo = models["demo"]
    need = _report(demo, 256)
    assert need["total_bytes"] == (need["weight_bytes"] + need["code_bytes"] + need["model_bytes"]
                                   + need["session_bytes"])
    assert need["kv_cache"] == "int8" and need["context"] == 256
    args = [tool("kiln-run"), demo, "--prompt", "How many shapes?", "--image", os.path.join(EXAMPLES, "000.png"),
            "--context", "256", "--threads", "2", "--max-new-tokens", "2", "--quiet"]
    p = subprocess.run([str(a) for a in args] + [f"--memory-budget={need['total_bytes'] - 1}"],
                       capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    for part in ("over the", "memory budget", "weights", "KV cache", "int8 for 256 tokens", "arena",
                 "does not fit the memory budget"):
        assert part in p.stderr, (part, p.stderr)
    run([str(a) for a in args] + [f"--memory-budget={need['total_bytes']}"])
    # A smaller cache encoding lowers the need below the same budget.
    assert _report(demo, 256, kv="int4")["total_bytes"] < need["total_bytes"] < _report(demo, 256, kv="f32")[
        "total_bytes"]
    for bad in ("12XB", "-5MB", "0", "MB"):
        p = subprocess.run([str(a) for a in args] + [f"--memory-budget={bad}"], capture_output=True, text=True)
        assert p.returncode == 2 and "--memory-budget must be a size" in p.stderr, (bad, p.stderr)


@pytest.mark.parametrize("name,context,prompt", [("demo", 256, "image"), ("smollm", 2048, 1500)])
def test_peak_rss_stays_within_the_declared_need(models, name, context, prompt):
    artifact = models[name]
    need = _report(artifact, context)
    args = [tool("kiln-run"), artifact, "--context", str(context), "--threads", "2",
            f"--memory-budget={need['total_bytes']}", "--quiet"]
    if prompt == "image":
        args += ["--image", os.path.join(EXAMPLES, "000.png"), "--prompt", "How many shapes are there?",
                 "--max-new-tokens", "8"]
    else:
        ids = ",".join(str(1 + (i * 7919) % 40000) for i in range(prompt))
        args += ["--input-ids", ids, "--max-new-tokens", "16"]
    stats = json.loads(run(args + ["--json"]).stdout.strip().splitlines()[-1])
    peak, baseline = stats["peak_rss_bytes"], stats["start_rss_bytes"]
    # Not the model's: kiln-run's own code as it is paged in after main() began (at
    # most the binary's size), library pages, thread stacks and the decoded input.
    process = os.path.getsize(tool("kiln-run")) + 2_000_000
    print(f"{name}: peak RSS {peak / 1e6:.1f} MB, {baseline / 1e6:.1f} MB of it when main() began, declared "
          f"{need['total_bytes'] / 1e6:.1f} MB, process allowance {process / 1e6:.1f} MB", file=sys.stderr)
    assert 0 < baseline < peak and peak - baseline <= need["total_bytes"] + process, (peak, baseline, need)
