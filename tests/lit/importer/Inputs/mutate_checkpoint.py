#!/usr/bin/env python3
"""Damages a generated checkpoint in one specific way, for the importer's negative
tests. Works on the raw safetensors bytes so that the damage is exactly the one
named (no library re-validates or repairs anything).

usage: mutate_checkpoint.py DIR ACTION [ARGS]
  truncate N              cut N bytes off the end of model.safetensors
  header-length N         set the 8-byte header length to N
  header-garbage          overwrite the start of the header JSON
  drop-tensor NAME        remove a tensor (header entry and bytes)
  transpose-tensor NAME   swap the two dimensions of a 2-D tensor in the header
  dtype NAME DTYPE        change a tensor's dtype string in the header
  duplicate-key NAME      repeat a tensor's entry in the header JSON
  overlap NAME            make a tensor's data_offsets start 4 bytes early
  set-config KEY JSON     set a config.json key (JSON value; a.b sets a nested key)
  set-generation KEY JSON set a generation_config.json key (JSON value)
  remove FILE             delete a file of the checkpoint
  nonfinite NAME VALUE    set a tensor's first element to nan or inf
  tokenizer-drop-token T  remove token T from the vocabulary (and merges using it)
  tokenizer-set PATH JSON set a dotted key path of tokenizer.json (list indices as numbers)
  tokenizer-dup-added     list the first added token twice
"""
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write(path, header, data, header_text=None):
    text = header_text if header_text is not None else json.dumps(header, separators=(",", ":"))
    blob = text.encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.write(data)


def main():
    d, action, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    st = os.path.join(d, "model.safetensors")
    if action == "truncate":
        size = os.path.getsize(st)
        os.truncate(st, size - int(args[0]))
    elif action == "header-length":
        with open(st, "r+b") as f:
            f.write(struct.pack("<Q", int(args[0])))
    elif action == "header-garbage":
        with open(st, "r+b") as f:
            f.seek(8)
            f.write(b"#!garbage")
    elif action == "drop-tensor":
        header, data = read(st)
        victim = header.pop(args[0])
        b, e = victim["data_offsets"]
        data = data[:b] + data[e:]
        for k, v in header.items():
            if k != "__metadata__" and v["data_offsets"][0] >= e:
                v["data_offsets"] = [v["data_offsets"][0] - (e - b), v["data_offsets"][1] - (e - b)]
        write(st, header, data)
    elif action == "transpose-tensor":
        header, data = read(st)
        shape = header[args[0]]["shape"]
        header[args[0]]["shape"] = [shape[1], shape[0]]
        write(st, header, data)
    elif action == "dtype":
        header, data = read(st)
        header[args[0]]["dtype"] = args[1]
        write(st, header, data)
    elif action == "duplicate-key":
        header, data = read(st)
        text = json.dumps(header, separators=(",", ":"))
        entry = json.dumps({args[0]: header[args[0]]}, separators=(",", ":"))[1:-1]
        write(st, header, data, header_text=text[:-1] + "," + entry + "}")
    elif action == "overlap":
        header, data = read(st)
        b, e = header[args[0]]["data_offsets"]
        header[args[0]]["data_offsets"] = [b - 4, e - 4]
        write(st, header, data)
    elif action == "set-config":
        path = os.path.join(d, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        node, keys = cfg, args[0].split(".")  # a dotted key sets a nested one
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = json.loads(args[1])
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
    elif action == "set-generation":
        path = os.path.join(d, "generation_config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg[args[0]] = json.loads(args[1])
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
    elif action == "nonfinite":
        header, data = read(st)
        entry = header[args[0]]
        b = entry["data_offsets"][0]
        value = float(args[1])
        if entry["dtype"] == "F32":
            blob = struct.pack("<f", value)
        elif entry["dtype"] == "F16":
            blob = struct.pack("<e", value)
        else:  # BF16: the high half of the f32
            blob = struct.pack("<f", value)[2:]
        data = data[:b] + blob + data[b + len(blob) :]
        write(st, header, data)
    elif action.startswith("tokenizer-"):
        path = os.path.join(d, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        if action == "tokenizer-drop-token":
            del tok["model"]["vocab"][args[0]]
            merges = tok["model"].get("merges", [])
            def uses(m):
                l, r = m.split(" ", 1) if isinstance(m, str) else m
                return args[0] in (l, r, l + r)
            tok["model"]["merges"] = [m for m in merges if not uses(m)]
        elif action == "tokenizer-set":
            keys = args[0].split(".")
            node = tok
            for k in keys[:-1]:
                node = node[int(k)] if isinstance(node, list) else node[k]
            last = keys[-1]
            node[int(last) if isinstance(node, list) else last] = json.loads(args[1])
        elif action == "tokenizer-dup-added":
            first = dict(tok["added_tokens"][0])
            first["id"] = max(t["id"] for t in tok["added_tokens"]) + 1
            tok["added_tokens"].append(first)
        else:
            sys.exit(f"unknown action {action}")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)
    elif action == "remove":
        os.remove(os.path.join(d, args[0]))
    else:
        sys.exit(f"unknown action {action}")


if __name__ == "__main__":
    main()
