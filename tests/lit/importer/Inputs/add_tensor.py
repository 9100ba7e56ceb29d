#!/usr/bin/env python3
"""Appends a small F32 tensor named NAME to DIR/model.safetensors (an extra tensor,
like the rotary inv_freq buffers old checkpoints carry)."""
import json
import struct
import sys

path = sys.argv[1] + "/model.safetensors"
with open(path, "rb") as f:
    raw = f.read()
(n,) = struct.unpack("<Q", raw[:8])
header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
header[sys.argv[2]] = {"dtype": "F32", "shape": [8], "data_offsets": [len(data), len(data) + 32]}
data += struct.pack("<8f", *range(8))
blob = json.dumps(header, separators=(",", ":")).encode()
blob += b" " * ((8 - len(blob) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob + data)
