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
  set-config KEY JSON     set a top-level config.json key (JSON value)
  remove FILE             delete a file of the checkpoint
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
        cfg[args[0]] = json.loads(args[1])
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
    elif action == "remove":
        os.remove(os.path.join(d, args[0]))
    else:
        sys.exit(f"unknown action {action}")


if __name__ == "__main__":
    main()
