#!/usr/bin/env node
// Check that both peers load (bench/setup runs this): node-llama-cpp's prebuilt CPU llama.cpp, and
// onnxruntime-node's native binding + libonnxruntime.so.1 (installed with --ignore-scripts).
import path from "node:path";
import {fileURLToPath} from "node:url";
import {createRequire} from "node:module";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const {getLlama, LlamaLogLevel} = await import(path.join(here, "node_modules/node-llama-cpp/dist/index.js"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
console.log(`node-llama-cpp: ${llama.buildType} llama.cpp ${llama.llamaCppRelease.release}, gpu=${llama.gpu}`);
const ort = require(path.join(here, "node_modules/onnxruntime-node"));
// require() dlopens onnxruntime_binding.node and its libonnxruntime.so.1 (bundled, no install
// script needed); initOrt() creates the ORT environment (OrtCreateEnv) inside the library
const binding = require(path.join(here, "node_modules/onnxruntime-node/dist/binding.js"));
binding.initOrt();
console.log(`onnxruntime-node: ${require(path.join(here, "node_modules/onnxruntime-node/package.json")).version}, ` +
  `backends ${ort.listSupportedBackends().map((b) => b.name).join(",")}`);
await llama.dispose();
