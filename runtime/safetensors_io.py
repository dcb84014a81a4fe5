"""Read and write the safetensors format ourselves: memory-mapped reads, checked headers.

Layout: an 8-byte little-endian header length, a JSON header mapping each tensor name to
{dtype, shape, data_offsets: [begin, end]} (offsets relative to the data section, which
starts right after the header), then the raw little-endian bytes. A `__metadata__` entry
holds string metadata. Sharded checkpoints list their files in
`model.safetensors.index.json` ({"weight_map": {name: file}}).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from sandwich.errors import SandwichError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit


class CheckpointError(SandwichError):
    """A safetensors file or checkpoint index is missing, truncated or malformed."""


# numpy has no bfloat16: BF16 is read as uint16 bits and widened to float32 (see `to_f32`).
_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


class Tensor:
    """A tensor read lazily from a mapped file: `.array` is a zero-copy view of the bytes."""

    def __init__(self, dtype: str, shape: tuple[int, ...], array: np.ndarray) -> None:
        self.dtype, self.shape, self.array = dtype, shape, array

    def to_f32(self) -> np.ndarray:
        """Float32 values (BF16 bits shifted into the high half; F16/F64 converted)."""
        if self.dtype == "BF16":
            return (self.array.astype(np.uint32) << 16).view(np.float32)
        return self.array.astype(np.float32, copy=False)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns (round to nearest even), for writing BF16 tensors."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def _parse_header(raw: bytes, path: Path, data_len: int) -> dict:
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header must be a JSON object, got {type(header).__name__}")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise CheckpointError(f"{path}: tensor '{name}' lacks dtype/shape/data_offsets")
        if info["dtype"] not in _DTYPES:
            raise CheckpointError(f"{path}: tensor '{name}' has unknown dtype {info['dtype']!r} "
                                  f"(supported: {', '.join(_DTYPES)})")
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            n = int(np.prod([int(d) for d in info["shape"]], dtype=np.int64)) * _DTYPES[info["dtype"]].itemsize
        except (TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor '{name}' has a malformed shape or data_offsets") from None
        if end - begin != n or begin < 0:
            raise CheckpointError(f"{path}: tensor '{name}' data_offsets {[begin, end]} do not "
                                  f"match its shape {info['shape']} and dtype {info['dtype']}")
        if end > data_len:
            raise CheckpointError(f"{path}: truncated: tensor '{name}' ends at byte {end} of the "
                                  f"data section, the file holds {data_len}; re-download or rewrite it")
    return header


class SafeTensorsFile:
    """One memory-mapped safetensors file; header checked on open, data read on access."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such safetensors file")
        size = self.path.stat().st_size
        if size < 8:
            raise CheckpointError(f"{self.path}: truncated: {size} bytes, shorter than the 8-byte header length")
        with open(self.path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen > MAX_HEADER:
                raise CheckpointError(f"{self.path}: header length {hlen} is implausible; not a safetensors file")
            if 8 + hlen > size:
                raise CheckpointError(f"{self.path}: truncated: header declares {hlen} bytes, "
                                      f"the file holds {size - 8} after the length")
            raw = f.read(hlen)
        self._start = 8 + hlen
        header = _parse_header(raw, self.path, size - self._start)
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._info: dict[str, dict] = header
        self._map: np.ndarray | None = (
            np.memmap(self.path, dtype=np.uint8, mode="r") if size > self._start else None)

    def keys(self) -> list[str]:
        return list(self._info)

    def __contains__(self, name: object) -> bool:
        return name in self._info

    def get(self, name: str) -> Tensor:
        info = self._info.get(name)
        if info is None:
            raise CheckpointError(f"{self.path}: no tensor named '{name}'")
        begin, end = info["data_offsets"]
        dt = _DTYPES[info["dtype"]]
        shape = tuple(int(s) for s in info["shape"])
        if end == begin:
            arr = np.zeros(shape, dtype=dt)
        else:
            assert self._map is not None
            arr = self._map[self._start + begin: self._start + end].view(dt).reshape(shape)
        return Tensor(info["dtype"], shape, arr)


def save_file(tensors: Mapping[str, np.ndarray], path: str | Path, *,
              metadata: Mapping[str, str] | None = None, bf16: frozenset[str] = frozenset()) -> None:
    """Write tensors (names in `bf16` are stored as BF16 from float32 values), 8-byte aligned,
    and flush the file to disk before returning: a benchmark that loads a checkpoint it has
    just written would otherwise share the machine with the file's writeback (Sheared-LLaMA's
    5.4 GB made the first TTFTs of a Zen 4 measurement up to 1.75x the steady ones)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for name, arr in tensors.items():
        a = np.asarray(arr)
        if name in bf16:
            dtype, a = "BF16", bf16_bits(a)
        else:
            dtype = _NAMES.get(a.dtype.name)
            if dtype is None:
                raise CheckpointError(f"tensor '{name}': dtype {a.dtype} cannot be stored in safetensors")
            a = np.asarray(a, dtype=a.dtype.newbyteorder("<"), order="C")
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a)
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in blobs:
            f.write(a.tobytes())
        f.flush()
        os.fsync(f.fileno())


class Checkpoint:
    """All tensors of a model directory: one `model.safetensors`, or shards via the index."""

    def __init__(self, model_dir: str | Path) -> None:
        self.dir = Path(model_dir)
        self._where: dict[str, SafeTensorsFile] = {}
        index = self.dir / INDEX_NAME
        if index.is_file():
            self._open_index(index)
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.dir}: no *.safetensors file and no {INDEX_NAME}; "
                                      f"write a checkpoint with `sandwichc init-model`")
            for p in files:
                f = SafeTensorsFile(p)
                self._where.update(dict.fromkeys(f.keys(), f))

    def _open_index(self, index: Path) -> None:
        try:
            wmap = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid index (needs a 'weight_map' object): {e}") from None
        if not isinstance(wmap, dict):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to file names")
        files: dict[str, SafeTensorsFile] = {}
        for name, fname in wmap.items():
            if fname not in files:
                files[fname] = SafeTensorsFile(self.dir / fname)
            if name not in files[fname]:
                raise CheckpointError(f"{index}: tensor '{name}' is mapped to {fname}, which lacks it")
            self._where[name] = files[fname]

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def get(self, name: str) -> Tensor:
        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"{self.dir}: checkpoint has no tensor '{name}'")
        return f.get(name)

    def items(self) -> Iterator[tuple[str, Tensor]]:
        for name in self._where:
            yield name, self.get(name)


def save_sharded(tensors: Mapping[str, np.ndarray], model_dir: str | Path, *, shards: int) -> None:
    """Split tensors over `shards` files plus the index, the way HF's save_pretrained names them."""
    names = list(tensors)
    d = Path(model_dir)
    wmap: dict[str, str] = {}
    total = 0
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, d / fname)
        wmap.update(dict.fromkeys(part, fname))
        total += sum(np.asarray(tensors[n]).nbytes for n in part)
    (d / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=1))
