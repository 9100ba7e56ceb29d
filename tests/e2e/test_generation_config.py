"""The checkpoint's generation_config.json as defaults (issue: chat templates and
generation settings): kiln-run samples as the checkpoint says unless flags say
otherwise, kiln-inspect prints the settings, and repetition_penalty follows
transformers' RepetitionPenaltyLogitsProcessor exactly (greedy tokens equal the
PyTorch reference's with the same penalty)."""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import MODELS, run, tool

MAX_NEW = 12


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("generation")
    ckpt = d / "tiny-llama"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", ckpt])
    golden = d / "golden"
    run(["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ckpt, "--out", golden,
         "--prompt", "the the the quick brown fox and the", "--max-new-tokens", str(MAX_NEW)])
    return d, ckpt, golden


def _with_config(d, ckpt, name, **changes):
    """A copy of `ckpt` whose generation_config.json has `changes`."""
    import shutil
    out = d / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(ckpt, out)
    cfg = json.load(open(out / "generation_config.json"))
    cfg.update(changes)
    json.dump(cfg, open(out / "generation_config.json", "w"))
    return out


def _reference_greedy(ckpt, ids, penalty, eos):
    """Greedy decoding of the PyTorch reference with transformers' repetition penalty."""
    import torch
    from kiln_models.registry import load_checkpoint
    model, _ = load_checkpoint(str(ckpt))
    model.eval()
    seq = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            logits = model(torch.tensor([seq]))[0, -1].double()
            seen = torch.tensor(sorted(set(seq)))
            score = logits[seen]
            logits[seen] = torch.where(score < 0, score * penalty, score / penalty)
            nxt = int(torch.argmax(logits))
            if nxt in eos:
                break
            out.append(nxt)
            seq.append(nxt)
    return out


def _kiln_tokens(artifact, ids_path, *flags):
    out = run([tool("kiln-run"), artifact, "--input-ids", ids_path, "--max-new-tokens", str(MAX_NEW),
               "--threads", "2", *flags]).stdout
    line = [l for l in out.splitlines() if l.startswith("tokens:")][-1]
    return [int(t) for t in line.split()[1:]]


def test_repetition_penalty_matches_the_reference(llama):
    d, ckpt, golden = llama
    ids = [int(t) for t in np.load(golden / "input_ids.npy").reshape(-1)]
    eos_id = json.load(open(ckpt / "generation_config.json"))["eos_token_id"]
    eos = set(eos_id if isinstance(eos_id, list) else [eos_id])
    penalised = _with_config(d, ckpt, "penalised", repetition_penalty=1.8)
    artifact = d / "penalised.kiln"
    run([tool("kiln-compile"), penalised, "-o", artifact, "--kv-cache=f32"])
    info = json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)
    assert info["generation"]["repetition_penalty"] == pytest.approx(1.8)
    assert "greedy, repetition_penalty 1.8" in run([tool("kiln-inspect"), artifact]).stdout
    # The checkpoint's penalty by default, another by flag, none with 1.
    expected = _reference_greedy(ckpt, ids, 1.8, eos)
    plain = [int(t) for t in np.load(golden / "greedy.npy").reshape(-1)]
    assert expected != plain, "the penalty must change this prompt's answer for the test to mean anything"
    assert _kiln_tokens(artifact, golden / "input_ids.npy") == expected
    assert _kiln_tokens(artifact, golden / "input_ids.npy", "--repetition-penalty", "1") == plain
    assert _kiln_tokens(artifact, golden / "input_ids.npy", "--repetition-penalty", "1.3") == \
        _reference_greedy(ckpt, ids, 1.3, eos)


def test_sampling_defaults_come_from_the_checkpoint(llama):
    d, ckpt, golden = llama
    sampling = _with_config(d, ckpt, "sampling", do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    artifact = d / "sampling.kiln"
    run([tool("kiln-compile"), sampling, "-o", artifact])
    info = json.loads(run([tool("kiln-inspect"), artifact, "--json"]).stdout)["generation"]
    assert info["do_sample"] is True and info["top_k"] == 5
    assert info["temperature"] == pytest.approx(0.7) and info["top_p"] == pytest.approx(0.9)
    assert "sampling (temperature 0.7, top_k 5, top_p 0.9)" in run([tool("kiln-inspect"), artifact]).stdout
    plain = [int(t) for t in np.load(golden / "greedy.npy").reshape(-1)]
    # Sampling by default: different seeds give different answers somewhere; greedy by flag.
    answers = {tuple(_kiln_tokens(artifact, golden / "input_ids.npy", "--seed", str(s))) for s in range(6)}
    assert len(answers) > 1
    assert _kiln_tokens(artifact, golden / "input_ids.npy", "--temperature", "0") == plain


def test_bad_settings_are_refused(llama):
    d, ckpt, golden = llama
    bad = _with_config(d, ckpt, "bad", repetition_penalty=-1.0)
    p = subprocess.run([tool("kiln-compile"), bad, "-o", d / "bad.kiln"], capture_output=True, text=True)
    assert p.returncode != 0 and "repetition_penalty" in p.stderr and "generation_config.json" in p.stderr, p.stderr
    assert not (d / "bad.kiln").exists()
    artifact = d / "plain.kiln"
    run([tool("kiln-compile"), ckpt, "-o", artifact])
    p = subprocess.run([tool("kiln-run"), artifact, "--prompt", "hi", "--repetition-penalty", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--repetition-penalty must be finite and > 0" in p.stderr
