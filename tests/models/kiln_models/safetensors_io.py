"""Reading and writing safetensors files, single or sharded, without the `safetensors` package.

File layout (https://github.com/huggingface/safetensors, README "Format"):

    [8 bytes: N, little-endian u64][N bytes: UTF-8 JSON header][data buffer]

The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}; offsets are relative
to the start of the data buffer. An optional "__metadata__" entry maps strings to strings (HF writes
{"format": "pt"}). The reference implementation rejects headers above 100 MB, offsets that leave holes
or overlap, and tensors whose byte size disagrees with shape x dtype; this reader does the same, and
reports the file and tensor name in every error.

Reading is lazy: the file is memory-mapped (numpy.memmap) and a tensor is only read when asked for,
so multi-GB checkpoints do not need to fit in RAM.

BF16 has no numpy dtype. Raw BF16 data is exposed as uint16 bit patterns; `bf16_bits_to_f32` widens
them exactly, `f32_to_bf16_bits` narrows float32 with round-to-nearest-even (NaN stays NaN).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

# The limit used by the reference implementation (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
MAX_HEADER_SIZE = 100_000_000

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# dtype name -> (numpy storage dtype, bytes per element). BF16 is stored as its uint16 bit pattern.
DTYPES: Dict[str, Tuple[np.dtype, int]] = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U64": (np.dtype("<u8"), 8),
    "U32": (np.dtype("<u4"), 4),
    "U16": (np.dtype("<u2"), 2),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
}

# Names accepted on the command line / by the writer, mapped to safetensors dtype names.
DTYPE_ALIASES = {
    "f32": "F32", "float32": "F32", "fp32": "F32",
    "f16": "F16", "float16": "F16", "fp16": "F16", "half": "F16",
    "bf16": "BF16", "bfloat16": "BF16",
    "f64": "F64", "float64": "F64",
    "i64": "I64", "int64": "I64", "i32": "I32", "int32": "I32", "u8": "U8", "uint8": "U8",
}

# safetensors dtype -> the "torch_dtype" string HF writes into config.json
TORCH_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


class SafetensorsError(ValueError):
    """A safetensors file or index is malformed. The message names the file (and tensor)."""


def canonical_dtype(name: str) -> str:
    """'bf16' / 'bfloat16' / 'BF16' -> 'BF16'. Raises SafetensorsError for unknown names."""
    if name in DTYPES:
        return name
    key = name.lower()
    if key in DTYPE_ALIASES:
        return DTYPE_ALIASES[key]
    raise SafetensorsError(f"unknown dtype {name!r}; known: {sorted(DTYPES)}")


# ----------------------------------------------------------------------------------------------
# BF16 <-> F32
# ----------------------------------------------------------------------------------------------

_CHUNK = 1 << 24  # elements per conversion chunk, bounds temporary memory for huge tensors


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even.

    Overflow rounds to +-inf as IEEE rounding does; NaN inputs give a quiet NaN with the same sign.
    """
    x = _contiguous(np.asarray(x, dtype=np.float32))
    flat = x.reshape(-1)
    out = np.empty(flat.shape, dtype=np.uint16)
    for start in range(0, flat.size, _CHUNK):
        u = flat[start:start + _CHUNK].view(np.uint32)
        # add 0x7FFF plus the lowest kept bit: exact halfway cases round to the even neighbour.
        # uint32 arithmetic can only wrap for negative NaNs, which are replaced below.
        rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
        is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        if is_nan.any():
            rounded = np.where(is_nan, (u >> np.uint32(16)) | np.uint32(0x0040), rounded)
        out[start:start + _CHUNK] = rounded.astype(np.uint16)
    return out.reshape(x.shape)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exact."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"expected uint16 bfloat16 bit patterns, got {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_storage(array, dtype: str) -> np.ndarray:
    """Convert a numpy array / torch tensor to the numpy array whose bytes are stored for `dtype`.

    Floating inputs are converted with IEEE round-to-nearest-even (numpy for F16, f32_to_bf16_bits
    for BF16). A torch.bfloat16 tensor stored as BF16 keeps its exact bits.
    """
    dtype = canonical_dtype(dtype)
    try:  # torch is optional for this module
        import torch
        if isinstance(array, torch.Tensor):
            t = array.detach().cpu().contiguous()
            if t.dtype == torch.bfloat16:
                if dtype == "BF16":
                    return t.view(torch.int16).numpy().view(np.uint16)
                t = t.float()
            array = t.numpy()
    except ImportError:  # pragma: no cover
        pass
    array = np.asarray(array)
    np_dtype, _ = DTYPES[dtype]
    if dtype == "BF16":
        if array.dtype == np.uint16:
            raise SafetensorsError(
                "ambiguous uint16 input for BF16: pass float values, or write bit patterns with SafetensorsWriter")
        return f32_to_bf16_bits(array.astype(np.float32, copy=False))
    return _contiguous(array.astype(np_dtype, copy=False))


def _contiguous(a: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array into shape (1,)
    return a if a.flags.c_contiguous else a.copy(order="C")


# ----------------------------------------------------------------------------------------------
# Header parsing and validation
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str                 # safetensors dtype name, e.g. "BF16"
    shape: Tuple[int, ...]
    begin: int                 # offset in the data buffer
    end: int
    file: str                  # path of the file holding the tensor
    data_start: int            # absolute offset of the data buffer in that file

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def file_offset(self) -> int:
        """Absolute byte offset of the tensor in its file."""
        return self.data_start + self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _reject_duplicates(path: str):
    def hook(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise SafetensorsError(f"{path}: duplicate entry {key!r} in the JSON header")
            seen[key] = value
        return seen
    return hook


def parse_header(path: str, header_bytes: bytes, data_size: int, data_start: int
                 ) -> Tuple[Dict[str, TensorInfo], Dict[str, str]]:
    """Validate a header and return ({name: TensorInfo} in offset order, metadata)."""
    try:
        text = header_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"{path}: header is not valid UTF-8 ({e})") from None
    if not text.startswith("{"):
        raise SafetensorsError(f"{path}: header does not start with '{{' (not a safetensors file?)")
    try:
        raw = json.loads(text, object_pairs_hook=_reject_duplicates(path))
    except SafetensorsError:
        raise
    except ValueError as e:
        raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise SafetensorsError(f"{path}: header must be a JSON object")

    metadata = raw.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError(f"{path}: '__metadata__' must map strings to strings")

    infos: List[TensorInfo] = []
    for name, entry in raw.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise SafetensorsError(f"{where}: entry must be an object")
        extra = set(entry) - {"dtype", "shape", "data_offsets"}
        missing = {"dtype", "shape", "data_offsets"} - set(entry)
        if missing:
            raise SafetensorsError(f"{where}: missing field(s) {sorted(missing)}")
        if extra:
            raise SafetensorsError(f"{where}: unknown field(s) {sorted(extra)}")
        dtype = entry["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise SafetensorsError(f"{where}: unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise SafetensorsError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
        offs = entry["data_offsets"]
        if (not isinstance(offs, list) or len(offs) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise SafetensorsError(f"{where}: data_offsets must be [begin, end] integers, got {offs!r}")
        begin, end = offs
        if begin < 0 or end < begin:
            raise SafetensorsError(f"{where}: invalid data_offsets [{begin}, {end}]")
        if end > data_size:
            raise SafetensorsError(
                f"{where}: data_offsets end {end} is beyond the data buffer ({data_size} bytes); "
                f"file truncated?")
        expected = math.prod(shape) * DTYPES[dtype][1]  # Python ints: no overflow
        if expected != end - begin:
            raise SafetensorsError(
                f"{where}: shape {shape} x {dtype} needs {expected} bytes but data_offsets "
                f"[{begin}, {end}] hold {end - begin}")
        infos.append(TensorInfo(name, dtype, tuple(shape), begin, end, path, data_start))

    infos.sort(key=lambda t: (t.begin, t.end))
    cursor = 0
    prev: Optional[TensorInfo] = None
    for t in infos:
        if t.begin < cursor:
            raise SafetensorsError(
                f"{path}: tensor {t.name!r} [{t.begin}, {t.end}] overlaps tensor {prev.name!r} "
                f"[{prev.begin}, {prev.end}]")
        if t.begin > cursor:
            raise SafetensorsError(
                f"{path}: tensor {t.name!r} starts at {t.begin} but the previous tensor ends at "
                f"{cursor}: offsets must be contiguous (hole of {t.begin - cursor} bytes)")
        cursor = t.end
        prev = t
    if cursor != data_size:
        raise SafetensorsError(
            f"{path}: tensors cover {cursor} bytes but the data buffer holds {data_size} bytes "
            f"({data_size - cursor} trailing bytes)")
    return {t.name: t for t in infos}, metadata


def read_header(path: str) -> Tuple[Dict[str, TensorInfo], Dict[str, str]]:
    """Read and validate only the header of `path` (no tensor data is touched)."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size < 8:
        raise SafetensorsError(f"{path}: file is {size} bytes, too small for the 8-byte header length")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > MAX_HEADER_SIZE:
            raise SafetensorsError(
                f"{path}: header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit (corrupt file?)")
        if 8 + n > size:
            raise SafetensorsError(
                f"{path}: header length {n} runs past the end of the {size}-byte file (truncated?)")
        header = f.read(n)
    return parse_header(path, header, size - 8 - n, 8 + n)


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------

def _to_torch(raw: np.ndarray, dtype: str, out_dtype=None):
    import torch
    if dtype == "BF16":
        t = torch.from_numpy(np.array(raw, copy=True).view(np.int16)).view(torch.bfloat16)
    elif dtype in ("U16", "U32", "U64"):
        t = torch.from_numpy(np.array(raw, dtype=np.int64))  # torch 1.13 lacks these dtypes
    else:
        t = torch.from_numpy(np.array(raw, copy=True))
    return t.to(out_dtype) if out_dtype is not None else t


class SafetensorsFile:
    """A memory-mapped, validated safetensors file. Tensors are read on demand.

    >>> with SafetensorsFile("model.safetensors") as f:
    ...     w = f.get_numpy("model.norm.weight")      # float32 (BF16/F16 widened exactly)
    """

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.tensors, self.metadata = read_header(self.path)
        self._mmap: Optional[np.memmap] = None

    # context manager / resource handling
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._mmap = None

    def _map(self) -> np.ndarray:
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._mmap

    # queries
    def keys(self) -> List[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def get_raw(self, name: str) -> np.ndarray:
        """Zero-copy read-only view in the storage dtype (BF16 -> uint16 bit patterns)."""
        t = self.info(name)
        np_dtype, _ = DTYPES[t.dtype]
        buf = self._map()[t.file_offset:t.file_offset + t.nbytes]
        return buf.view(np_dtype).reshape(t.shape)

    def get_numpy(self, name: str, float32: bool = True) -> np.ndarray:
        """Tensor as a numpy array (a copy). With float32=True, F16/BF16 are widened exactly."""
        t = self.info(name)
        raw = self.get_raw(name)
        if t.dtype == "BF16":
            return bf16_bits_to_f32(raw) if float32 else np.array(raw)
        if t.dtype == "F16" and float32:
            return raw.astype(np.float32)
        return np.array(raw)

    def get_torch(self, name: str, dtype=None):
        """Tensor as a torch tensor (a copy); BF16 becomes torch.bfloat16 bit-exactly unless `dtype`."""
        t = self.info(name)
        return _to_torch(self.get_raw(name), t.dtype, dtype)


def load_file(path: str, framework: str = "numpy") -> Dict[str, object]:
    """Read all tensors of one file: framework 'numpy' (F16/BF16 -> float32) or 'torch' (native)."""
    with SafetensorsFile(path) as f:
        if framework == "numpy":
            return {k: f.get_numpy(k) for k in f.keys()}
        if framework in ("torch", "pt"):
            return {k: f.get_torch(k) for k in f.keys()}
    raise ValueError(f"framework must be 'numpy' or 'torch', got {framework!r}")


class Checkpoint:
    """All safetensors of a Hugging Face checkpoint directory (single file or sharded with index).

    Resolution order: model.safetensors.index.json; model.safetensors; the only *.safetensors file.
    With an index, every tensor of `weight_map` must be in the file it names and every tensor in a
    shard must be listed (a checkpoint that silently hides tensors is rejected).
    """

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)
        if not os.path.isdir(self.directory):
            raise SafetensorsError(f"{self.directory}: not a directory")
        index_path = os.path.join(self.directory, INDEX_FILE)
        self.index_path: Optional[str] = None
        self.files: Dict[str, SafetensorsFile] = {}
        self.weight_map: Dict[str, str] = {}
        if os.path.exists(index_path):
            self.index_path = index_path
            self._open_index(index_path)
        else:
            single = os.path.join(self.directory, SINGLE_FILE)
            if not os.path.exists(single):
                found = sorted(p for p in os.listdir(self.directory) if p.endswith(".safetensors"))
                if len(found) != 1:
                    raise SafetensorsError(
                        f"{self.directory}: expected {INDEX_FILE} or {SINGLE_FILE} "
                        f"(found safetensors files: {found})")
                single = os.path.join(self.directory, found[0])
            f = SafetensorsFile(single)
            self.files[os.path.basename(single)] = f
            self.weight_map = {k: os.path.basename(single) for k in f.keys()}
        self.metadata = {name: f.metadata for name, f in self.files.items()}

    def _open_index(self, index_path: str):
        try:
            with open(index_path, "r", encoding="utf-8") as fh:
                index = json.load(fh, object_pairs_hook=_reject_duplicates(index_path))
        except SafetensorsError:
            raise
        except ValueError as e:
            raise SafetensorsError(f"{index_path}: not valid JSON ({e})") from None
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            raise SafetensorsError(f"{index_path}: missing 'weight_map' object")
        weight_map = index["weight_map"]
        for name, fname in weight_map.items():
            if not isinstance(fname, str) or os.path.basename(fname) != fname:
                raise SafetensorsError(
                    f"{index_path}: tensor {name!r} maps to {fname!r}, which is not a plain file name")
        for fname in sorted(set(weight_map.values())):
            path = os.path.join(self.directory, fname)
            if not os.path.exists(path):
                raise SafetensorsError(f"{index_path}: shard {fname!r} listed in weight_map does not exist")
            self.files[fname] = SafetensorsFile(path)
        for name, fname in weight_map.items():
            if name not in self.files[fname]:
                raise SafetensorsError(
                    f"{index_path}: tensor {name!r} is mapped to {fname!r} but that file does not contain it")
        for fname, f in self.files.items():
            for name in f.keys():
                if weight_map.get(name) != fname:
                    raise SafetensorsError(
                        f"{f.path}: tensor {name!r} is not listed for this file in {INDEX_FILE}")
        self.weight_map = dict(weight_map)
        self.index_metadata = index.get("metadata", {})

    def close(self):
        for f in self.files.values():
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def keys(self) -> List[str]:
        return list(self.weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def file_of(self, name: str) -> SafetensorsFile:
        try:
            return self.files[self.weight_map[name]]
        except KeyError:
            raise KeyError(f"{self.directory}: checkpoint has no tensor named {name!r}") from None

    def info(self, name: str) -> TensorInfo:
        return self.file_of(name).info(name)

    def get_raw(self, name: str) -> np.ndarray:
        return self.file_of(name).get_raw(name)

    def get_numpy(self, name: str, float32: bool = True) -> np.ndarray:
        return self.file_of(name).get_numpy(name, float32=float32)

    def get_torch(self, name: str, dtype=None):
        return self.file_of(name).get_torch(name, dtype=dtype)

    def total_size(self) -> int:
        return sum(self.info(k).nbytes for k in self.keys())


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: Tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


def _header_bytes(specs: Sequence[TensorSpec], metadata: Optional[Mapping[str, str]]) -> bytes:
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    seen = set()
    for s in specs:
        if s.name in seen:
            raise SafetensorsError(f"duplicate tensor name {s.name!r}")
        if s.name == "__metadata__":
            raise SafetensorsError("'__metadata__' is reserved and cannot name a tensor")
        seen.add(s.name)
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape),
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # data buffer 8-byte aligned, as the reference writer does
    return len(raw).to_bytes(8, "little") + raw


class SafetensorsWriter:
    """Streaming writer: the tensor list is declared up front, data is then written one tensor at
    a time, in order, so a checkpoint never has to be in memory as a whole."""

    def __init__(self, path: str, specs: Sequence[TensorSpec], metadata: Optional[Mapping[str, str]] = None):
        self.path = os.fspath(path)
        self.specs = [TensorSpec(s.name, canonical_dtype(s.dtype), tuple(int(d) for d in s.shape)) for s in specs]
        self._next = 0
        self._fh = open(self.path, "wb")
        self._fh.write(_header_bytes(self.specs, metadata))

    def write(self, name: str, array) -> None:
        if self._next >= len(self.specs):
            raise SafetensorsError(f"{self.path}: tensor {name!r} was not declared")
        spec = self.specs[self._next]
        if spec.name != name:
            raise SafetensorsError(f"{self.path}: expected tensor {spec.name!r} next, got {name!r}")
        data = array if isinstance(array, np.ndarray) and array.dtype == DTYPES[spec.dtype][0] \
            else to_storage(array, spec.dtype)
        if tuple(data.shape) != spec.shape:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has shape {tuple(data.shape)}, "
                                   f"declared {spec.shape}")
        self._fh.write(data.tobytes(order="C"))
        self._next += 1

    def write_chunks(self, name: str, chunks: Iterable) -> None:
        """Write tensor `name` from consecutive pieces of its row-major data (any shapes): only one
        piece is in memory at a time. The pieces must add up to exactly the declared size."""
        if self._next >= len(self.specs):
            raise SafetensorsError(f"{self.path}: tensor {name!r} was not declared")
        spec = self.specs[self._next]
        if spec.name != name:
            raise SafetensorsError(f"{self.path}: expected tensor {spec.name!r} next, got {name!r}")
        written = 0
        for piece in chunks:
            data = piece if isinstance(piece, np.ndarray) and piece.dtype == DTYPES[spec.dtype][0] \
                else to_storage(piece, spec.dtype)
            raw = data.tobytes(order="C")
            written += len(raw)
            if written > spec.nbytes:
                raise SafetensorsError(f"{self.path}: tensor {name!r}: chunks exceed the declared "
                                       f"{spec.nbytes} bytes")
            self._fh.write(raw)
        if written != spec.nbytes:
            raise SafetensorsError(f"{self.path}: tensor {name!r}: chunks hold {written} bytes, "
                                   f"declared {spec.nbytes}")
        self._next += 1

    def close(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        if self._next != len(self.specs):
            missing = [s.name for s in self.specs[self._next:]]
            raise SafetensorsError(f"{self.path}: closed before writing {missing[:5]}"
                                   f"{' ...' if len(missing) > 5 else ''}")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.close()
        elif self._fh is not None:
            self._fh.close()
            self._fh = None


def save_file(tensors: Mapping[str, object], path: str, metadata: Optional[Mapping[str, str]] = None,
              dtype: Optional[str] = None) -> None:
    """Write `tensors` (numpy arrays or torch tensors) to one file.

    The stored dtype is `dtype` when given (floats converted with round-to-nearest-even), else the
    array's own dtype (torch.bfloat16 -> BF16, float16 -> F16, float32 -> F32, ints as such).
    """
    specs, arrays = [], []
    for name, value in tensors.items():
        st_dtype = canonical_dtype(dtype) if dtype else _native_dtype(value)
        data = to_storage(value, st_dtype)
        specs.append(TensorSpec(name, st_dtype, tuple(data.shape)))
        arrays.append(data)
    with SafetensorsWriter(path, specs, metadata) as w:
        for spec, data in zip(specs, arrays):
            w.write(spec.name, data)


def _native_dtype(value) -> str:
    try:
        import torch
        if isinstance(value, torch.Tensor):
            names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                     torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
                     torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
            if value.dtype not in names:
                raise SafetensorsError(f"unsupported torch dtype {value.dtype}")
            return names[value.dtype]
    except ImportError:  # pragma: no cover
        pass
    arr = np.asarray(value)
    for name, (np_dtype, _) in DTYPES.items():
        if name != "BF16" and arr.dtype == np_dtype:
            return name
    raise SafetensorsError(f"unsupported numpy dtype {arr.dtype}")


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)


def parse_size(size: Union[int, str]) -> int:
    """'2GB' -> 2*10**9, '500MiB' -> 500*2**20, 1234 -> 1234 (HF convert_file_size_to_int rules)."""
    if isinstance(size, int):
        return size
    m = _SIZE_RE.match(size)
    if not m:
        raise ValueError(f"cannot parse size {size!r} (examples: 2GB, 500MB, 1GiB, 123456)")
    value, unit = float(m.group(1)), (m.group(2) or "B").upper()
    mult = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
            "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(value * mult)


def plan_shards(specs: Sequence[TensorSpec], max_shard_size: int) -> List[List[TensorSpec]]:
    """Greedy split in declaration order, like transformers' split_torch_state_dict_into_shards: a
    new shard starts when the next tensor would push a non-empty shard over `max_shard_size`
    (a single tensor larger than the limit gets a shard of its own)."""
    shards: List[List[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def write_checkpoint(directory: str, specs: Sequence[TensorSpec], produce: Callable[[TensorSpec], object],
                     max_shard_size: Union[int, str] = "5GB",
                     metadata: Optional[Mapping[str, str]] = None) -> List[str]:
    """Write a (possibly sharded) checkpoint, calling `produce(spec)` for one tensor at a time;
    it returns the tensor (array / torch tensor) or an iterable of consecutive row-major pieces.

    One shard -> model.safetensors. Several -> model-0000i-of-0000N.safetensors plus
    model.safetensors.index.json {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
    Returns the written file names.
    """
    os.makedirs(directory, exist_ok=True)
    metadata = {"format": "pt"} if metadata is None else metadata
    specs = [TensorSpec(s.name, canonical_dtype(s.dtype), tuple(s.shape)) for s in specs]
    shards = plan_shards(specs, parse_size(max_shard_size))
    n = len(shards)
    names = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    # remove stale files from an earlier run with a different sharding
    for old in os.listdir(directory):
        if (old.endswith(".safetensors") or old == INDEX_FILE) and old not in names:
            os.remove(os.path.join(directory, old))
    weight_map = {}
    for fname, shard in zip(names, shards):
        with SafetensorsWriter(os.path.join(directory, fname), shard, metadata) as w:
            for s in shard:
                data = produce(s)
                if isinstance(data, np.ndarray) or hasattr(data, "detach"):
                    w.write(s.name, data)
                else:  # an iterable of pieces
                    w.write_chunks(s.name, data)
                weight_map[s.name] = fname
    if n > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(directory, INDEX_FILE), "w", encoding="utf-8") as fh:
            json.dump(index, fh, indent=2)
            fh.write("\n")
    return names
