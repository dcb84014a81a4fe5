"""Our safetensors reader/writer: round trips, compatibility with the reference library,
sharded checkpoints, and a one-line error for every kind of broken file (issue 6)."""

import json
import struct

import numpy as np
import pytest

from sandwich.errors import SandwichError
from sandwich.runtime.safetensors_io import (
    INDEX_NAME,
    Checkpoint,
    CheckpointError,
    SafeTensorsFile,
    bf16_bits,
    save_file,
    save_sharded,
)


def _tensors():
    rng = np.random.default_rng(0)
    return {
        "a.f32": rng.standard_normal((3, 5), dtype=np.float32),
        "b.f16": rng.standard_normal((4,)).astype(np.float16),
        "c.i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "d.scalar": np.array(2.5, np.float32),
        "e.empty": np.zeros((0, 4), np.float32),
        "f.bf16": rng.standard_normal((2, 8), dtype=np.float32),
    }


def test_round_trip_all_dtypes(tmp_path):
    t = _tensors()
    p = tmp_path / "x.safetensors"
    save_file(t, p, metadata={"format": "pt"}, bf16=frozenset({"f.bf16"}))
    f = SafeTensorsFile(p)
    assert f.keys() == list(t) and f.metadata == {"format": "pt"}
    for name in ("a.f32", "b.f16", "c.i64", "d.scalar", "e.empty"):
        got = f.get(name)
        assert got.array.dtype == t[name].dtype and got.shape == t[name].shape
        np.testing.assert_array_equal(got.array, t[name])
    bf = f.get("f.bf16")
    assert bf.dtype == "BF16"
    np.testing.assert_allclose(bf.to_f32(), t["f.bf16"], rtol=2 ** -8)
    assert not f.get("a.f32").array.flags.writeable  # a read-only view of the mapped file
    assert (8 + struct.unpack("<Q", p.read_bytes()[:8])[0]) % 8 == 0  # data section aligned


def test_a_written_file_is_on_disk_before_save_returns(tmp_path, monkeypatch):
    """save_file flushes what it wrote (fsync): a benchmark that loads a checkpoint it has
    just written does not share the machine with its writeback."""
    import os

    from sandwich.runtime import safetensors_io

    synced = []

    def fsync(fd):
        synced.append(os.fstat(fd).st_size)

    monkeypatch.setattr(safetensors_io.os, "fsync", fsync)
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), path)
    assert synced == [path.stat().st_size]  # once, after the last byte

def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.0], np.float32)
    assert bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC000]


def test_reference_library_reads_ours_and_we_read_its(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    t = {k: v for k, v in _tensors().items() if k != "f.bf16"}
    save_file(t, tmp_path / "ours.safetensors")
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    for k in t:
        np.testing.assert_array_equal(theirs[k], t[k])
    st.save_file(t, str(tmp_path / "theirs.safetensors"))
    f = SafeTensorsFile(tmp_path / "theirs.safetensors")
    for k in t:
        np.testing.assert_array_equal(f.get(k).array, t[k])


def test_sharded_checkpoint(tmp_path):
    t = {k: v for k, v in _tensors().items() if k != "f.bf16"}
    save_sharded(t, tmp_path, shards=2)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) == 2
    ck = Checkpoint(tmp_path)
    assert sorted(ck.keys()) == sorted(t)
    for k in t:
        np.testing.assert_array_equal(ck.get(k).array, t[k])
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        ck.get("nope")


def test_sharded_index_errors(tmp_path):
    save_sharded({"a": np.ones(2, np.float32), "b": np.ones(3, np.float32)}, tmp_path, shards=2)
    idx = tmp_path / INDEX_NAME
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: no such"):
        Checkpoint(tmp_path)
    idx.write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid index"):
        Checkpoint(tmp_path)
    idx.write_text(json.dumps({"weight_map": {"zz": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="'zz' is mapped to"):
        Checkpoint(tmp_path)


def test_directory_without_weights(tmp_path):
    with pytest.raises(CheckpointError, match="no \\*.safetensors file"):
        Checkpoint(tmp_path)


def _write_raw(p, header: bytes, data: bytes = b"", hlen: int | None = None):
    p.write_bytes(struct.pack("<Q", len(header) if hlen is None else hlen) + header + data)


def _header(**info):
    return json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16], **info}}).encode()


@pytest.mark.parametrize("case, pattern", [
    ("missing", "no such safetensors file"),
    ("short_length", "shorter than the 8-byte header length"),
    ("short_header", "truncated: header declares"),
    ("short_data", "truncated: tensor 'w' ends at byte 16"),
    ("bad_json", "header is not valid JSON"),
    ("not_object", "header must be a JSON object"),
    ("unknown_dtype", "unknown dtype 'Q7'"),
    ("bad_offsets", "data_offsets \\[0, 12\\] do not match"),
    ("malformed", "malformed shape or data_offsets"),
    ("no_fields", "lacks dtype/shape/data_offsets"),
    ("huge_header", "implausible"),
])
def test_broken_files_give_one_line_errors(tmp_path, case, pattern):
    p = tmp_path / "m.safetensors"
    data = np.ones(4, np.float32).tobytes()
    if case == "short_length":
        p.write_bytes(b"\x01\x02\x03")
    elif case == "short_header":
        _write_raw(p, _header(), hlen=1000)
    elif case == "short_data":
        _write_raw(p, _header(), data[:10])
    elif case == "bad_json":
        _write_raw(p, b"{\"w\": [", data)
    elif case == "not_object":
        _write_raw(p, b"[1, 2]", data)
    elif case == "unknown_dtype":
        _write_raw(p, _header(dtype="Q7"), data)
    elif case == "bad_offsets":
        _write_raw(p, _header(data_offsets=[0, 12]), data)
    elif case == "malformed":
        _write_raw(p, _header(shape="two"), data)
    elif case == "no_fields":
        _write_raw(p, json.dumps({"w": {"dtype": "F32"}}).encode(), data)
    elif case == "huge_header":
        _write_raw(p, b"{}", hlen=1 << 40)
    with pytest.raises(CheckpointError, match=pattern) as e:
        SafeTensorsFile(p)
    assert isinstance(e.value, SandwichError) and "\n" not in str(e.value)
    assert str(p) in str(e.value)


def test_truncating_a_real_file_is_detected(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file(_tensors(), p)
    raw = p.read_bytes()
    p.write_bytes(raw[:-7])
    with pytest.raises(CheckpointError, match="truncated"):
        Checkpoint(tmp_path)
