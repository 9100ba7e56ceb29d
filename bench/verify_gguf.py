#!/usr/bin/python3
"""Check bench/gguf.py against the PyTorch reference through llama.cpp (node-llama-cpp).

    /usr/bin/python3 bench/verify_gguf.py [CKPT ...] [--types f32,f16,q8_0,q4_0] [--ids 1,2,3] [--max-new 16]

Default checkpoints: tiny-llama and tiny-llama-tied (tests/models/generate.py presets, written to
--work if missing). For every checkpoint and GGUF type:

  1. golden: tests/models/golden.py's run() (fp32 PyTorch reference) -> greedy.npy for the prompt ids;
  2. bench/gguf.py converts the checkpoint; bench/llamacpp.mjs greedy --probs runs llama.cpp on it
     (greedy tokens + log-probabilities of the whole vocabulary at every generated step);
  3. a "same-weights" reference: the GGUF's tensors read back, dequantized and un-permuted, loaded
     into the PyTorch model, greedy again (for f32 this equals the golden run);
  4. max |log-prob diff|: llama.cpp's log-softmax vs PyTorch's (fp32 weights) on the same token
     history (teacher-forced on llama.cpp's tokens), max over steps and vocabulary. node-llama-cpp
     exposes probabilities, not raw logits; log-softmax differs from the logits by a per-step
     constant only, so this is the logit difference up to that shift.

Also, once per checkpoint: llama.cpp's tokenization of a fixed text with the GGUF's tokenizer vs
tests/models' byte-level BPE (kiln_models/tokenizer.py) on the checkpoint's tokenizer.json.

Verdict per line: f32 PASS iff llama.cpp's greedy tokens equal the golden tokens. f16 / q8_0 / q4_0
PASS iff they equal the same-weights reference (the encoding is then what llama.cpp decodes;
llama.cpp still quantizes activations to 8 bits in the quantized matmuls, so a near-tie may flip);
"PASS (near-tie)" when they diverge where the reference's logit margin between the two tokens is
below twice the max |log-prob diff| measured against the same-weights reference (a flip within the
measured numeric noise). The agreement length with the fp32 golden tokens is reported for every type
(quantized weights may legitimately diverge from fp32 after a few tokens; the tiny random models
have nearly flat next-token distributions, so near-ties are common). Exit status 1 if an f32 line
fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import gguf  # noqa: E402  (bench/gguf.py)
import golden  # noqa: E402  (tests/models/golden.py)
from kiln_models.registry import load_checkpoint  # noqa: E402
from kiln_models.tokenizer import ByteLevelBPE  # noqa: E402

TOKENIZER_TEXT = "The quick brown fox jumps over 12345 lazy dogs! It's  a\ttest,\nwith   spaces and ünïcödé."


def prefix_len(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agree_same_n(a, b):
    """Index of the first differing token within the common length, or None."""
    n = prefix_len(a, b)
    return n if n < min(len(a), len(b)) else None


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of gguf.permute_rope."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def same_weights_model(ckpt: str, path: str):
    """The PyTorch reference with the GGUF's (dequantized) weights."""
    model, config = load_checkpoint(ckpt)
    n_head = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_head)
    _, tensors = gguf.read_gguf(path)
    by_gguf = {}
    for hf in model.state_dict():
        try:
            g = gguf.gguf_name(hf)
        except ValueError:
            continue
        if g is not None:
            by_gguf[g] = hf
    sd = model.state_dict()
    for name, (t, shape, raw) in tensors.items():
        if name not in by_gguf:
            continue
        x = gguf.dequantize(raw, t, shape)
        if ".attn_q." in name:
            x = unpermute_rope(x, n_head)
        elif ".attn_k." in name:
            x = unpermute_rope(x, n_kv)
        sd[by_gguf[name]] = torch.from_numpy(x)
    if config.get("tie_word_embeddings"):  # output = token_embd, already replaced
        pass
    model.load_state_dict(sd)
    model.eval()
    return model


def run_llama(path: str, ids, max_new: int, kv: str) -> dict:
    cmd = ["node", os.path.join(HERE, "llamacpp.mjs"), "greedy", "--model", path, "--ids",
           ",".join(map(str, ids)), "--max-new", str(max_new), "--probs", "--kv", kv]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*")
    ap.add_argument("--types", default="f32,f16,q8_0,q4_0")
    ap.add_argument("--ids", help="prompt token ids (default: BOS of the config + 7 fixed ids)")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--work", default="/tmp/kbench")
    ap.add_argument("--kv", default="f32", choices=["f32", "f16"], help="llama.cpp KV-cache type (default f32)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(a.work, exist_ok=True)
    ckpts = a.checkpoints
    if not ckpts:
        ckpts = []
        for p in ("tiny-llama", "tiny-llama-tied"):
            d = os.path.join(a.work, p)
            if not os.path.exists(os.path.join(d, "config.json")):
                subprocess.run([sys.executable, os.path.join(ROOT, "tests/models/generate.py"), "--preset", p,
                                "--out", d], check=True)
            ckpts.append(d)
    results, failed = [], False
    for ckpt in ckpts:
        name = os.path.basename(os.path.normpath(ckpt))
        with open(os.path.join(ckpt, "config.json")) as f:
            config = json.load(f)
        vocab = int(config["vocab_size"])
        if a.ids:
            ids = [int(x) for x in a.ids.split(",")]
        else:
            bos = config.get("bos_token_id")
            ids = ([int(bos)] if isinstance(bos, int) else []) + [(37 * k + 11) % min(vocab, 400) + 3 for k in range(7)]
        gdir = os.path.join(a.work, f"golden-{name}")
        golden.run(ckpt, gdir, input_ids=ids, max_new_tokens=a.max_new)
        gold = np.load(os.path.join(gdir, "greedy.npy"))[0].tolist()
        ref_model, _ = load_checkpoint(ckpt)
        for ftype in a.types.split(","):
            path = os.path.join(a.work, f"{name}-{ftype}.gguf")
            gguf.convert(ckpt, path, ftype, quiet=True)
            out = run_llama(path, ids, a.max_new, a.kv)
            toks = out["greedy"]["tokens"]
            lp = np.asarray(out["greedy"]["log_probs"], dtype=np.float64)
            with torch.no_grad():
                same = same_weights_model(ckpt, path) if ftype != "f32" else None
                same_toks = (same.greedy_generate(torch.tensor([ids]), max_new_tokens=a.max_new)[0].tolist()
                             if same is not None else gold)
                seq = torch.tensor([ids + toks[:-1]])
                ref_lp = torch.log_softmax(ref_model(seq)[0, len(ids) - 1:], dim=-1).double().numpy()
                same_lp = (torch.log_softmax(same(seq)[0, len(ids) - 1:], dim=-1).double().numpy()
                           if same is not None else ref_lp)
                # at the first divergence from the same-weights reference: the reference's logit
                # margin between its token and llama.cpp's token (small = a near-tie)
                margin = None
                if agree_same_n(toks, same_toks) is not None:
                    k = agree_same_n(toks, same_toks)
                    m = (same if same is not None else ref_model)(torch.tensor([ids + toks[:k]]))[0, -1]
                    margin = float(m[same_toks[k]] - m[toks[k]])
            finite = np.isfinite(lp)
            diff = float(np.abs(lp - ref_lp)[finite].max()) if finite.any() else float("nan")
            diff_same = float(np.abs(lp - same_lp)[finite].max()) if finite.any() else float("nan")
            n_cmp = len(gold)  # golden stops at EOS
            agree_gold = prefix_len(toks, gold)
            agree_same = prefix_len(toks, same_toks)
            if ftype == "f32":
                ok = toks[:n_cmp] == gold
                failed |= not ok
            else:
                ok = toks[:len(same_toks)] == same_toks
            verdict = "PASS" if ok else "FAIL"
            if not ok and ftype != "f32" and margin is not None and abs(margin) < 2 * diff_same:
                verdict = "PASS (near-tie)"
            line = (f"{verdict} {name} {ftype}: llama.cpp greedy {len(toks)} tokens; agrees with fp32 golden for "
                    f"{agree_gold}/{n_cmp}, with the same-weights reference for {agree_same}/{len(same_toks)}"
                    + ("" if margin is None else f" (reference logit margin at the divergence {margin:.3g})")
                    + f"; max |log-prob diff| vs fp32 {diff:.3g}, vs same weights {diff_same:.3g}")
            print(line, flush=True)
            if ftype == a.types.split(",")[0]:
                # the GGUF tokenizer: llama.cpp's tokenization vs tests/models' byte-level BPE
                r = subprocess.run(["node", os.path.join(HERE, "llamacpp.mjs"), "tokenize", "--model", path,
                                    "--text", TOKENIZER_TEXT], capture_output=True, text=True, check=True)
                got = json.loads(r.stdout.strip().splitlines()[-1])["tokens"]
                want = ByteLevelBPE.load(os.path.join(ckpt, "tokenizer.json")).encode(TOKENIZER_TEXT)
                print(f"{'PASS' if got == want else 'FAIL'} {name} tokenizer: llama.cpp {len(got)} tokens, "
                      f"tests/models tokenizer {len(want)}, equal prefix {prefix_len(got, want)}", flush=True)
                results.append({"checkpoint": ckpt, "type": "tokenizer", "verdict": "PASS" if got == want else "FAIL",
                                "text": TOKENIZER_TEXT, "llama_cpp": got, "reference": want})
            results.append({"checkpoint": ckpt, "type": ftype, "verdict": verdict, "prompt": ids, "llama_cpp": toks,
                            "golden": gold, "same_weights": same_toks, "agree_golden": agree_gold,
                            "agree_same_weights": agree_same, "margin_at_divergence": margin,
                            "max_abs_logprob_diff": diff, "max_abs_logprob_diff_same_weights": diff_same,
                            "gguf_bytes": os.path.getsize(path)})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
