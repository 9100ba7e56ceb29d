"""safetensors_io: round trips (single / sharded, F32 / F16 / BF16 / ints), BF16 rounding, lazy
reads, and rejection of malformed files with messages naming the file and tensor."""

import json
import os
import struct

import numpy as np
import pytest
import torch

from kiln_models.safetensors_io import (INDEX_FILE, Checkpoint, SafetensorsError, SafetensorsFile, TensorSpec,
                                        bf16_bits_to_f32, f32_to_bf16_bits, load_file, parse_size,
                                        plan_shards, save_file, write_checkpoint)


def rng_arrays():
    r = np.random.default_rng(1)
    return {
        "a.weight": r.standard_normal((7, 5)).astype(np.float32),
        "b.bias": r.standard_normal(3).astype(np.float32),
        "c.scalar": np.array(2.5, dtype=np.float32),
        "d.empty": np.zeros((0, 4), dtype=np.float32),
    }


def write_raw(path, header: dict, data: bytes, header_len=None, pad=True):
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    n = len(raw) if header_len is None else header_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + raw + data)
    return str(path)


# ------------------------------------------------------------------------------------ BF16

def test_bf16_rounding_matches_torch_round_to_nearest_even():
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32) * 1000
    special = np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-40, -1e-45,
                        1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20], dtype=np.float32)
    x = np.concatenate([x, special])
    ours = f32_to_bf16_bits(x)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, ref)
    # ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.0; 1 + 3*2^-8 -> 1 + 2^-6
    assert ours[-3] == 0x3F80 and ours[-2] == 0x3F82 and ours[-1] == 0x3F81
    nan = f32_to_bf16_bits(np.array([np.nan, -np.nan], dtype=np.float32))
    assert np.isnan(bf16_bits_to_f32(nan)).all()


def test_bf16_widening_is_exact():
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    widened = bf16_bits_to_f32(bits)
    ref = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(widened[finite], ref[finite])
    assert (np.isnan(widened) == np.isnan(ref)).all()


# ------------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_single_file_roundtrip(tmp_path, dtype):
    arrays = rng_arrays()
    path = tmp_path / "x.safetensors"
    save_file(arrays, str(path), metadata={"format": "pt"}, dtype=dtype)
    with SafetensorsFile(str(path)) as f:
        assert f.metadata == {"format": "pt"}
        assert set(f.keys()) == set(arrays)
        for name, a in arrays.items():
            info = f.info(name)
            assert info.dtype == dtype and info.shape == a.shape
            raw = f.get_raw(name)
            if dtype == "F32":
                np.testing.assert_array_equal(raw, a)
            elif dtype == "F16":
                np.testing.assert_array_equal(raw, a.astype(np.float16))
            else:
                np.testing.assert_array_equal(raw, f32_to_bf16_bits(a))
                t = f.get_torch(name)
                assert t.dtype == torch.bfloat16
                torch.testing.assert_close(t, torch.from_numpy(a).to(torch.bfloat16), rtol=0, atol=0)
    # data buffer is 8-byte aligned, like the reference writer
    n = struct.unpack("<Q", open(path, "rb").read(8))[0]
    assert n % 8 == 0


def test_native_dtypes_and_ints(tmp_path):
    tensors = {
        "bf": torch.randn(4, 3).to(torch.bfloat16),
        "h": torch.randn(5).half(),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "i64": np.arange(-3, 3, dtype=np.int64),
        "u8": np.arange(250, 256, dtype=np.uint8),
    }
    path = str(tmp_path / "n.safetensors")
    save_file(tensors, path)
    back = load_file(path, framework="torch")
    assert back["bf"].dtype == torch.bfloat16 and torch.equal(back["bf"], tensors["bf"])
    assert back["h"].dtype == torch.float16 and torch.equal(back["h"], tensors["h"])
    assert torch.equal(back["i32"], tensors["i32"])
    with SafetensorsFile(path) as f:
        assert [f.info(k).dtype for k in ("bf", "h", "i32", "i64", "u8")] == ["BF16", "F16", "I32", "I64", "U8"]
        np.testing.assert_array_equal(f.get_numpy("i64"), tensors["i64"])
        np.testing.assert_array_equal(f.get_numpy("u8"), tensors["u8"])


def test_reads_are_lazy_memory_maps(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file(rng_arrays(), path)
    with SafetensorsFile(path) as f:
        raw = f.get_raw("a.weight")
        base = raw
        while getattr(base, "base", None) is not None and not isinstance(base, np.memmap):
            base = base.base
        assert isinstance(base, np.memmap)
        assert not raw.flags.writeable
        assert f.info("a.weight").file_offset == 8 + struct.unpack("<Q", open(path, "rb").read(8))[0] \
            + f.info("a.weight").begin


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_sharded_roundtrip_with_index(tmp_path, dtype):
    r = np.random.default_rng(2)
    arrays = {f"layer.{i}.w": r.standard_normal((16, 8)).astype(np.float32) for i in range(6)}
    specs = [TensorSpec(k, dtype, v.shape) for k, v in arrays.items()]
    per = specs[0].nbytes
    files = write_checkpoint(str(tmp_path), specs, lambda s: arrays[s.name], max_shard_size=2 * per)
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.load(open(tmp_path / INDEX_FILE))
    assert index["metadata"]["total_size"] == 6 * per
    assert index["weight_map"]["layer.5.w"] == "model-00003-of-00003.safetensors"
    with Checkpoint(str(tmp_path)) as ck:
        assert sorted(ck.keys()) == sorted(arrays)
        for k, a in arrays.items():
            expect = a if dtype == "F32" else bf16_bits_to_f32(f32_to_bf16_bits(a))
            np.testing.assert_array_equal(ck.get_numpy(k), expect)
        assert all(m == {"format": "pt"} for m in ck.metadata.values())
    # rewriting as a single file removes the stale shards and index
    write_checkpoint(str(tmp_path), specs, lambda s: arrays[s.name], max_shard_size="1GB")
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]


def test_chunked_writes_equal_whole_writes(tmp_path):
    a = np.random.default_rng(3).standard_normal((10, 6)).astype(np.float32)
    spec = [TensorSpec("w", "BF16", a.shape)]
    write_checkpoint(str(tmp_path / "one"), spec, lambda s: a)
    write_checkpoint(str(tmp_path / "chunks"), spec, lambda s: (a[i:i + 3].reshape(-1) for i in range(0, 10, 3)))
    assert open(tmp_path / "one" / "model.safetensors", "rb").read() == \
        open(tmp_path / "chunks" / "model.safetensors", "rb").read()
    with pytest.raises(SafetensorsError, match="chunks hold"):
        write_checkpoint(str(tmp_path / "bad"), spec, lambda s: iter([a[:3]]))


def test_parse_size_and_plan():
    assert parse_size("2GB") == 2 * 10 ** 9 and parse_size("1GiB") == 2 ** 30 and parse_size("500MB") == 5 * 10 ** 8
    assert parse_size(123) == 123 and parse_size("10KB") == 10_000
    with pytest.raises(ValueError):
        parse_size("lots")
    specs = [TensorSpec(str(i), "F32", (n,)) for i, n in enumerate([10, 10, 30, 5])]
    assert [[s.name for s in shard] for shard in plan_shards(specs, 80)] == [["0", "1"], ["2"], ["3"]]


# ------------------------------------------------------------------------------------ corrupt files

def valid_header():
    return {"__metadata__": {"format": "pt"},
            "x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "y": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]}}


def test_valid_handmade_file_is_accepted(tmp_path):
    path = write_raw(tmp_path / "ok.safetensors", valid_header(), bytes(24))
    with SafetensorsFile(path) as f:
        assert f.get_numpy("x").shape == (2, 2)


CORRUPTIONS = {
    "unknown_dtype": (lambda h: h["x"].update(dtype="F12"), "unknown dtype 'F12'"),
    "size_mismatch": (lambda h: h["x"].update(shape=[2, 3]), r"needs 24 bytes but data_offsets \[0, 16\] hold 16"),
    "overlap": (lambda h: h["y"].update(data_offsets=[8, 16], shape=[4]), "overlaps tensor"),
    "hole": (lambda h: h["y"].update(data_offsets=[17, 25]), "hole of 1 bytes", 25),
    "reversed": (lambda h: h["x"].update(data_offsets=[16, 0]), r"invalid data_offsets \[16, 0\]"),
    "beyond_end": (lambda h: h["y"].update(data_offsets=[16, 40], shape=[12]), "beyond the data buffer"),
    "negative_dim": (lambda h: h["x"].update(shape=[-2, 2]), "non-negative integers"),
    "missing_field": (lambda h: h["x"].pop("shape"), r"missing field\(s\) \['shape'\]"),
    "extra_field": (lambda h: h["x"].update(foo=1), r"unknown field\(s\) \['foo'\]"),
    "bad_metadata": (lambda h: h.update(__metadata__={"n": 1}), "must map strings to strings"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_rejects_corrupt_header(tmp_path, case):
    mutate, message, *size = CORRUPTIONS[case]
    header = valid_header()
    mutate(header)
    path = write_raw(tmp_path / f"{case}.safetensors", header, bytes(size[0] if size else 24))
    with pytest.raises(SafetensorsError, match=message) as e:
        SafetensorsFile(path)
    assert path in str(e.value)
    if case not in ("bad_metadata",):
        assert "'x'" in str(e.value) or "'y'" in str(e.value)


def test_rejects_duplicate_names(tmp_path):
    text = ('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            '"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
    raw = text.encode()
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
    with pytest.raises(SafetensorsError, match="duplicate entry 'x'"):
        SafetensorsFile(str(path))


def test_rejects_truncated_and_padded_files(tmp_path):
    good = write_raw(tmp_path / "good.safetensors", valid_header(), bytes(24))
    blob = open(good, "rb").read()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(blob[:-5])
    with pytest.raises(SafetensorsError, match="beyond the data buffer .* truncated"):
        SafetensorsFile(str(cut))
    extra = tmp_path / "extra.safetensors"
    extra.write_bytes(blob + b"\0\0\0")
    with pytest.raises(SafetensorsError, match="3 trailing bytes"):
        SafetensorsFile(str(extra))
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsError, match="too small"):
        SafetensorsFile(str(tiny))
    headcut = tmp_path / "headcut.safetensors"
    headcut.write_bytes(blob[:20])
    with pytest.raises(SafetensorsError, match="runs past the end"):
        SafetensorsFile(str(headcut))


def test_rejects_bad_header_length_and_json(tmp_path):
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 200_000_000) + b"{}")
    with pytest.raises(SafetensorsError, match="exceeds the 100000000-byte limit"):
        SafetensorsFile(str(huge))
    notjson = tmp_path / "notjson.safetensors"
    notjson.write_bytes(struct.pack("<Q", 8) + b"{nope:1}")
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        SafetensorsFile(str(notjson))
    notobj = tmp_path / "notobj.safetensors"
    notobj.write_bytes(struct.pack("<Q", 8) + b"[1,2,3] ")
    with pytest.raises(SafetensorsError, match="does not start with"):
        SafetensorsFile(str(notobj))
    utf = tmp_path / "utf.safetensors"
    utf.write_bytes(struct.pack("<Q", 4) + b"{\xff\xfe}")
    with pytest.raises(SafetensorsError, match="UTF-8"):
        SafetensorsFile(str(utf))


def test_rejects_inconsistent_index(tmp_path):
    arrays = {f"t{i}": np.full((4,), i, dtype=np.float32) for i in range(4)}
    specs = [TensorSpec(k, "F32", v.shape) for k, v in arrays.items()]
    write_checkpoint(str(tmp_path), specs, lambda s: arrays[s.name], max_shard_size=32)
    index_path = tmp_path / INDEX_FILE
    index = json.load(open(index_path))

    index["weight_map"]["t0"] = "model-00002-of-00002.safetensors"
    json.dump(index, open(index_path, "w"))
    with pytest.raises(SafetensorsError, match="'t0' is mapped to 'model-00002-of-00002.safetensors' but"):
        Checkpoint(str(tmp_path))

    index["weight_map"]["t0"] = "model-00009-of-00009.safetensors"
    json.dump(index, open(index_path, "w"))
    with pytest.raises(SafetensorsError, match="does not exist"):
        Checkpoint(str(tmp_path))

    del index["weight_map"]["t0"]
    json.dump(index, open(index_path, "w"))
    with pytest.raises(SafetensorsError, match="'t0' is not listed"):
        Checkpoint(str(tmp_path))

    index["weight_map"]["t0"] = "../model-00001-of-00002.safetensors"
    json.dump(index, open(index_path, "w"))
    with pytest.raises(SafetensorsError, match="not a plain file name"):
        Checkpoint(str(tmp_path))


def test_checkpoint_without_safetensors(tmp_path):
    with pytest.raises(SafetensorsError, match="expected model.safetensors.index.json or model.safetensors"):
        Checkpoint(str(tmp_path))
