#!/usr/bin/env node
// llama.cpp peer measurements through node-llama-cpp (prebuilt llama.cpp, CPU only). JSON on stdout.
//
//   node bench/llamacpp.mjs tokenize --model M.gguf --text "some text"
//       llama.cpp's tokenization of the text (no BOS), to check the GGUF tokenizer
//   common options: --kv f16|f32  KV-cache element type (default f16, llama.cpp's default)
//                   --fa auto|on|off  flash attention (default: greedy off, bench auto)
//   node bench/llamacpp.mjs greedy --model M.gguf --ids 480,12,34 [--max-new 8] [--probs]
//       greedy (argmax) continuation of a token-id prompt, EOG tokens included; with --probs also
//       the log-probabilities of the whole vocabulary at every generated step (softmax of the
//       logits at temperature 1, sampled greedily: see logProbs below)
//   node bench/llamacpp.mjs bench --model M.gguf [--threads 1,2] [--prefill 128,512] [--decode 64]
//       [--reps 3] [--warmup 1]
//       prefill tokens/s for N-token prompts (one llama_decode batch of N tokens, fresh KV cache),
//       decode tokens/s over M generated tokens (after a 16-token prompt; the time from the first
//       to the last generated token, so the prompt is excluded), medians over --reps, and
//       /proc/loadavg next to every figure (ggml threads spin-wait: a loaded machine collapses the
//       2-thread numbers, so always read them with the 1-thread numbers and the load average).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const {getLlama, LlamaLogLevel} = await import(path.join(here, "node_modules/node-llama-cpp/dist/index.js"));

function parseArgs(argv) {
    const a = {_: []};
    for (let i = 0; i < argv.length; i++) {
        const s = argv[i];
        if (s.startsWith("--")) {
            const k = s.slice(2);
            if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) a[k] = argv[++i];
            else a[k] = true;
        } else a._.push(s);
    }
    return a;
}
const ints = (s) => String(s).split(",").filter(Boolean).map(Number);
const median = (xs) => {
    const s = [...xs].sort((x, y) => x - y);
    const n = s.length;
    return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
};
const loadavg = () => fs.readFileSync("/proc/loadavg", "utf8").trim().split(/\s+/).slice(0, 3).map(Number);
const now = () => Number(process.hrtime.bigint()) / 1e9;

// Deterministic pseudo-random prompt ids that are not control / EOG tokens.
function promptIds(model, n, seed = 1) {
    let x = seed >>> 0;
    const out = [];
    const limit = vocabSize(model);
    while (out.length < n) {
        x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
        const t = x % limit;
        if (model.isSpecialToken?.(t) || model.isEogToken(t)) continue;
        out.push(t);
    }
    return out;
}

function vocabSize(model) {
    const md = model.fileInfo.metadata;
    const arch = md.general.architecture;
    return Number(md[arch]?.vocab_size ?? md.tokenizer.ggml.tokens.length);
}

async function main() {
    const args = parseArgs(process.argv.slice(2));
    const cmd = args._[0];
    if (!cmd || !args.model) {
        console.error("usage: llamacpp.mjs greedy|bench|tokenize --model M.gguf [options] (see the header)");
        process.exit(2);
    }
    const maxThreads = Math.max(...ints(args.threads ?? "1,2"), 1);
    const llama = await getLlama({gpu: false, build: "never", maxThreads, logLevel: LlamaLogLevel.error});
    const model = await llama.loadModel({modelPath: path.resolve(args.model), gpuLayers: 0});
    const info = {
        model: path.resolve(args.model), bytes: fs.statSync(args.model).size,
        node_llama_cpp: JSON.parse(fs.readFileSync(path.join(here, "node_modules/node-llama-cpp/package.json"))).version,
        llama_cpp_release: llama.llamaCppRelease?.release, build: llama.buildType, cpu: os.cpus()[0]?.model,
        cores: os.cpus().length, kv_cache: String(args.kv ?? "f16").toUpperCase(),
        flash_attention: String(args.fa ?? (cmd === "greedy" ? "off" : "auto")), system_info: llama.systemInfo,
    };
    const out = {info};
    if (cmd === "greedy") {
        out.greedy = await greedy(model, ints(args.ids), Number(args["max-new"] ?? 8), !!args.probs, kvType(args), args);
    } else if (cmd === "tokenize") {
        out.tokens = Array.from(model.tokenize(String(args.text ?? ""), false));
    } else if (cmd === "bench") {
        out.bench = await bench(model, args, kvType(args));
    } else throw new Error(`unknown command ${cmd}`);
    process.stdout.write(JSON.stringify(out) + "\n");
    await model.dispose();
    await llama.dispose();
}

// KV cache element type: llama.cpp's default is F16 (--kv f16); --kv f32 for exact comparisons.
function kvType(args) {
    const t = String(args.kv ?? "f16").toUpperCase();
    return {experimentalKvCacheKeyType: t, experimentalKvCacheValueType: t};
}

// --fa auto|on|off: flash attention (llama.cpp's default is auto; its CPU path converts Q to F16,
// so greedy defaults to off for exact comparisons, bench to auto).
function flashAttention(args, dflt) {
    const v = String(args.fa ?? dflt);
    return v === "auto" ? "auto" : v === "on";
}

async function greedy(model, ids, maxNew, probs, kv, args) {
    const ctx = await model.createContext({contextSize: Math.max(64, ids.length + maxNew + 8), batchSize: Math.max(64, ids.length), threads: 1, sequences: 1, flashAttention: flashAttention(args, "off"), ...kv});
    const seq = ctx.getSequence();
    const tokens = [];
    const logProbs = [];
    // temperature 1 with topK = vocab, topP = minP = 0 leaves the softmax of the raw logits as the
    // reported probabilities; the token is still chosen greedily because tokenBias is not used and
    // the probability list is only read, so we take the argmax ourselves and feed it back.
    const n = vocabSize(model);
    const gen = seq.evaluateWithMetadata(ids, {probabilities: probs}, probs
        ? {temperature: 1, topK: n, topP: 1, minP: 0, seed: 1, yieldEogToken: true}
        : {temperature: 0, yieldEogToken: true});
    let r = await gen.next();
    while (!r.done) {
        let tok = r.value.token;
        if (probs) {
            const lp = new Array(n).fill(-Infinity);
            let best = -1, bestP = -1;
            for (const [t, p] of r.value.probabilities) {
                lp[t] = Math.log(p);
                if (p > bestP) { bestP = p; best = t; }
            }
            tok = best;
            logProbs.push(lp);
        }
        tokens.push(tok);
        if (tokens.length >= maxNew) break;
        r = await gen.next(tok); // override the sampled token with the argmax
    }
    await gen.return?.();
    await ctx.dispose();
    return probs ? {tokens, log_probs: logProbs} : {tokens};
}

// one line per finished measurement on stderr, so a slow run on a loaded machine shows progress
const progress = (r) => console.error(`${r.kind} ${r.tokens} tokens, ${r.threads} thread(s): ` +
    `${r.tokens_per_s.toFixed(1)} tok/s (load ${r.loadavg[0].join(" ")})`);

async function bench(model, args, kv) {
    const threadsList = ints(args.threads ?? "1,2");
    const prefill = ints(args.prefill ?? "128,512");
    const decodeN = Number(args.decode ?? 64);
    const reps = Number(args.reps ?? 3);
    const warmup = Number(args.warmup ?? 1);
    const maxPrefill = Math.max(...prefill, 16);
    const results = [];
    for (const threads of threadsList) {
        const ctx = await model.createContext({
            contextSize: maxPrefill + decodeN + 32, batchSize: maxPrefill, threads: {ideal: threads, min: threads},
            sequences: 1, flashAttention: flashAttention(args, "auto"), ...kv,
        });
        const seq = ctx.getSequence();
        const used = ctx.currentThreads ?? threads;
        for (const n of prefill) {
            const ids = promptIds(model, n, 7 + n);
            const times = [], loads = [];
            for (let r = 0; r < warmup + reps; r++) {
                await seq.clearHistory();
                const l = loadavg();
                const t0 = now();
                await seq.evaluateWithoutGeneratingNewTokens(ids);
                const dt = now() - t0;
                if (r >= warmup) { times.push(dt); loads.push(l); }
            }
            results.push({kind: "prefill", tokens: n, threads, context_threads: used,
                tokens_per_s: n / median(times), seconds: times, loadavg: loads});
            progress(results[results.length - 1]);
        }
        {
            const ids = promptIds(model, 16, 3);
            const rates = [], loads = [];
            for (let r = 0; r < warmup + reps; r++) {
                await seq.clearHistory();
                const l = loadavg();
                const stamps = [];
                const gen = seq.evaluate(ids, {temperature: 0, yieldEogToken: true});
                let x = await gen.next();
                while (!x.done) {
                    stamps.push(now());
                    if (stamps.length >= decodeN + 1) break;
                    x = await gen.next();
                }
                await gen.return?.();
                const rate = (stamps.length - 1) / (stamps[stamps.length - 1] - stamps[0]);
                if (r >= warmup) { rates.push(rate); loads.push(l); }
            }
            results.push({kind: "decode", tokens: decodeN, prompt: 16, threads, context_threads: used,
                tokens_per_s: median(rates), rates, loadavg: loads});
            progress(results[results.length - 1]);
        }
        await ctx.dispose();
    }
    return results;
}

await main();
