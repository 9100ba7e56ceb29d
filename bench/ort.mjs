#!/usr/bin/env node
// ONNX Runtime peer: time an encoder exported by bench/onnx_export.py with onnxruntime-node (CPU,
// fp32) and check its output against the PyTorch reference. JSON on stdout.
//
//   node bench/ort.mjs --model /tmp/kbench/onnx/siglip-smolvlm-2l.onnx [--threads 1,2] [--reps 5] [--warmup 1]
//
// Reads <stem>.json / .input.bin / .ref.bin next to the .onnx. Per intra-op thread count: one
// session (graphOptimizationLevel "all", sequential execution, inter-op 1 thread), --warmup runs,
// then --reps timed runs of session.run(); median seconds, images/s, the load average before each
// run, and max |ORT - PyTorch| over the output.
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {createRequire} from "node:module";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const ort = require(path.join(here, "node_modules/onnxruntime-node"));

function parseArgs(argv) {
    const a = {};
    for (let i = 0; i < argv.length; i++) {
        if (argv[i].startsWith("--")) {
            const k = argv[i].slice(2);
            a[k] = i + 1 < argv.length && !argv[i + 1].startsWith("--") ? argv[++i] : true;
        }
    }
    return a;
}
const median = (xs) => {
    const s = [...xs].sort((x, y) => x - y);
    const n = s.length;
    return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
};
const loadavg = () => fs.readFileSync("/proc/loadavg", "utf8").trim().split(/\s+/).slice(0, 3).map(Number);
const now = () => Number(process.hrtime.bigint()) / 1e9;
const readF32 = (p) => {
    const b = fs.readFileSync(p);
    return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
};

const args = parseArgs(process.argv.slice(2));
if (!args.model) {
    console.error("usage: ort.mjs --model M.onnx [--threads 1,2] [--reps 5] [--warmup 1]");
    process.exit(2);
}
const stem = args.model.replace(/\.onnx$/, "");
const meta = JSON.parse(fs.readFileSync(stem + ".json", "utf8"));
const input = readF32(stem + ".input.bin");
const ref = readF32(stem + ".ref.bin");
const threadsList = String(args.threads ?? "1,2").split(",").map(Number);
const reps = Number(args.reps ?? 5);
const warmup = Number(args.warmup ?? 1);

const out = {
    info: {
        model: path.resolve(args.model), meta,
        onnxruntime_node: JSON.parse(fs.readFileSync(path.join(here, "node_modules/onnxruntime-node/package.json"))).version,
        backends: ort.listSupportedBackends?.().map((b) => b.name),
    },
    runs: [],
};
for (const threads of threadsList) {
    const session = await ort.InferenceSession.create(args.model, {
        executionProviders: ["cpu"], graphOptimizationLevel: "all", executionMode: "sequential",
        intraOpNumThreads: threads, interOpNumThreads: 1,
    });
    const feeds = {[meta.input.name]: new ort.Tensor("float32", input, meta.input.shape)};
    const times = [], loads = [];
    let maxErr = 0, maxRef = 0;
    for (let r = 0; r < warmup + reps; r++) {
        const l = loadavg();
        const t0 = now();
        const res = await session.run(feeds);
        const dt = now() - t0;
        if (r === 0) {
            const y = res[meta.output.name].data;
            if (y.length !== ref.length) throw new Error(`output has ${y.length} values, reference ${ref.length}`);
            for (let i = 0; i < y.length; i++) {
                maxErr = Math.max(maxErr, Math.abs(y[i] - ref[i]));
                maxRef = Math.max(maxRef, Math.abs(ref[i]));
            }
        }
        if (r >= warmup) { times.push(dt); loads.push(l); }
    }
    out.runs.push({threads, seconds_median: median(times), images_per_s: 1 / median(times), seconds: times,
        loadavg: loads, max_abs_err_vs_torch: maxErr, max_abs_ref: maxRef});
    await session.release?.();
}
process.stdout.write(JSON.stringify(out) + "\n");
