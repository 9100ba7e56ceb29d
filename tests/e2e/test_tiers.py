"""Precision tiers in one artifact (kiln-compile --tiers): the file is smaller than
the tiers compiled apart, kiln-inspect lists them, each tier computes exactly what the
artifact compiled for its budget alone does, and kiln-run loads the largest tier that
fits --memory-budget and says which."""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import calibrated_tiny_llava, run, tool

CONTEXT = "128"


@pytest.fixture(scope="module")
def tiers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiers")
    ckpt = calibrated_tiny_llava(root)
    full = root / "f32.kiln"
    run([tool("kiln-compile"), ckpt, "-o", full])
    total = sum(r["bytes"] for r in _inspect(full)["precision"])
    budgets = [int(total * f) for f in (0.6, 0.35, 0.2)]
    cache = root / "cache"
    tiered = root / "tiered.kiln"
    run([tool("kiln-compile"), ckpt, "-o", tiered, "--tiers", ",".join(map(str, budgets)), "--cache-dir", cache])
    alone = []
    for b in budgets:
        alone.append(root / f"alone-{b}.kiln")
        run([tool("kiln-compile"), ckpt, "-o", alone[-1], "--memory-budget", str(b), "--cache-dir", cache])
    return {"tiered": tiered, "alone": alone, "budgets": budgets, "dir": root}


def _inspect(artifact, *extra):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json", *map(str, extra)]).stdout)


def _logits(artifact, out, *extra):
    run([str(a) for a in [tool("kiln-run"), artifact, "--input-ids", "1,5,9,14,20,27", "--dump-logits", out,
                          "--max-new-tokens", "1", "--quiet", *extra]])
    return np.load(out)


def test_tiers_share_storage_and_compute_as_compiled_alone(tiers):
    tiered, alone, budgets = tiers["tiered"], tiers["alone"], tiers["budgets"]
    assert os.path.getsize(tiered) < sum(os.path.getsize(a) for a in alone)
    info = _inspect(tiered)
    assert [t["weight_budget"] for t in info["tiers"]] == budgets
    for k, a in enumerate(alone):
        mine = _inspect(tiered, "--tier", k)
        theirs = _inspect(a)
        assert mine["tier"] == k
        assert [(p["tensor"], p["encoding"], p["bytes"]) for p in mine["precision"]] == \
               [(p["tensor"], p["encoding"], p["bytes"]) for p in theirs["precision"]]
        assert info["tiers"][k]["weight_bytes"] == theirs["memory_plan"]["weight_bytes"]
        got = _logits(tiered, tiers["dir"] / f"t{k}.npy", "--tier", k)
        want = _logits(a, tiers["dir"] / f"a{k}.npy")
        assert np.array_equal(got, want), f"tier {k} differs from its artifact compiled alone"


def _need(artifact, tier):
    out = _inspect(artifact, "--tier", tier, "--memory", CONTEXT, "--threads", "1")
    return out["memory"]["total_bytes"]


def _run_json(artifact, *extra):
    p = subprocess.run([str(a) for a in [tool("kiln-run"), artifact, "--prompt", "Hello", "--max-new-tokens", "2",
                                         "--threads", "1", "--context", CONTEXT, "--json", "--quiet", *extra]],
                       capture_output=True, text=True)
    return p


def test_the_largest_tier_that_fits_is_loaded(tiers):
    tiered = tiers["tiered"]
    needs = [_need(tiered, k) for k in range(3)]
    # Fewer weight bytes per tier; the session need is not always smaller with them (a
    # tier whose gate and up got different encodings keeps them apart, and its gated
    # MLPs need more scratch), so the expected tier is the first whose need fits.
    assert tiers["budgets"][0] > tiers["budgets"][1] > tiers["budgets"][2]
    budgets = sorted({b for n in needs for b in (n, n - 1)} - {min(needs) - 1})
    assert len(budgets) >= 3
    for budget in budgets:
        k = next(k for k in range(3) if needs[k] <= budget)
        p = _run_json(tiered, f"--memory-budget={budget}")
        assert p.returncode == 0, p.stderr
        stats = json.loads(p.stdout)
        assert (stats["tier"], stats["tiers"]) == (k, 3), (budget, needs, stats)
    p = _run_json(tiered, f"--memory-budget={min(needs) - 1}")
    assert p.returncode == 1 and "no tier of 3 fits" in p.stderr, p.stderr
    # Asked for, a tier is that one (or refused).
    p = _run_json(tiered, "--tier", "2")
    assert p.returncode == 0 and json.loads(p.stdout)["tier"] == 2, p.stderr
    p = _run_json(tiered, "--tier", "3")
    assert p.returncode == 1 and "tier 3: the artifact has 3" in p.stderr, p.stderr


def test_tiers_option_errors(tiers):
    ckpt = tiers["dir"] / "tiny-llava"
    for bad, why in ((["--tiers", "1MB"], "2 to 16 different weight budgets"),
                     (["--tiers", "1MB,1MB"], "2 to 16 different weight budgets"),
                     (["--tiers", "1MB,lots"], "is not a size"),
                     (["--tiers", "1MB,2MB", "--memory-budget", "1MB"], "--tiers replaces --memory-budget")):
        p = subprocess.run([str(a) for a in [tool("kiln-compile"), ckpt, "-o", tiers["dir"] / "bad.kiln", *bad]],
                           capture_output=True, text=True)
        assert p.returncode == 2 and why in p.stderr, (bad, p.stderr)
        assert not (tiers["dir"] / "bad.kiln").exists()
