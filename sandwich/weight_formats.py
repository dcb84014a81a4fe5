"""Weight formats, defined in one place: their names, quantize and dequantize, and the bytes a
decode step streams; the int formats reproduce llama.cpp's Q8_0, Q4_0 and Q4_1 bit for bit,
and int4-k, int5-k and int6-k hold Q4_K's, Q5_K's and Q6_K's blocks as they are."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sandwich.errors import ConfigError, ShapeError


@dataclass(frozen=True)
class WeightFormat:
    """How a weight's values are stored. `group` is the number of values along K that share a
    scale (None: one scale per output column); `ggml_type` names the GGUF type whose blocks
    hold the same numbers, so a GGUF tensor of that type loads without re-quantizing."""

    name: str
    bits: int  # 32, 16, 8, 6, 5 or 4 per value
    group: int | None = None
    symmetric: bool = True  # False: a scale and a minimum per group (Q4_1, Q4_K)
    scale_dtype: str | None = None  # "float16" where GGUF stores fp16 scales
    ggml_type: str | None = None
    # values per fp16 multiplier of the groups' scale (and minimum) factors (the K-quants'
    # super-block of 256: Q4_K's and Q5_K's d * sc * q - dmin * m, Q6_K's d * sc * q); None: each group's
    # own scale
    super_group: int | None = None

    @property
    def quantized(self) -> bool:
        """True for the int formats (values with scales), False for fp32 and bf16."""
        return self.bits <= 8

    def group_size(self, k: int) -> int:
        """Values per scale along a column of K values."""
        return self.group or k

    def nbytes(self, k: int, n: int) -> int:
        """Bytes of a (K, N) weight in this format: values, scales and minimums."""
        values = k * n * self.bits // 8
        if not self.quantized:
            return values
        arrays = 1 if self.symmetric else 2  # scales, and minimums where asymmetric
        per_group = np.dtype(self.scale_dtype).itemsize * arrays
        # an fp16 d per super-group, and a dmin where the groups have minimums
        supers = n * (k // self.super_group) * 2 * arrays if self.super_group else 0
        return values + n * (k // self.group_size(k)) * per_group + supers


FORMATS: tuple[WeightFormat, ...] = (
    WeightFormat("fp32", 32, ggml_type="F32"),
    WeightFormat("bf16", 16, ggml_type="BF16"),
    WeightFormat("int8", 8, None, True, "float32"),
    WeightFormat("int8-g32", 8, 32, True, "float16", "Q8_0"),
    *(WeightFormat(f"int4-g{g}", 4, g, True, "float16", "Q4_0" if g == 32 else None)
      for g in (32, 64, 128)),
    *(WeightFormat(f"int4-g{g}-asym", 4, g, False, "float16", "Q4_1" if g == 32 else None)
      for g in (32, 64, 128)),
    # Q4_K as stored: 4.625 bits a value (the 6-bit factors kept a byte each), where
    # int4-g32-asym's fp16 scale and minimum per group take 5
    WeightFormat("int4-k", 4, 32, False, "uint8", "Q4_K", super_group=256),
    # Q5_K as stored: int4-k's nibbles, factors and multipliers plus each value's fifth bit
    # (eight a byte), 5.625 bits a value, where int8-g32 takes 8.5
    WeightFormat("int5-k", 5, 32, False, "uint8", "Q5_K", super_group=256),
    # Q6_K as stored: 6.5625 bits a value (4 low bits and 2 high ones apart, a signed byte
    # factor per 16, an fp16 d per 256), where int8-g32 takes 8.5
    WeightFormat("int6-k", 6, 16, True, "int8", "Q6_K", super_group=256),
)
ALIASES = {"int4": "int4-g32", "int4-asym": "int4-g32-asym", "q4_k": "int4-k", "q5_k": "int5-k",
           "q6_k": "int6-k"}
K_FACTOR_MAX = 63  # Q4_K's and Q5_K's scale and minimum factors are 6 bits
Q6_K_FACTOR = -128  # Q6_K's largest group step is d * -128 (its factors are signed bytes)
Q6_K_VALUE = -32  # and a group's value of largest magnitude is its step * -32
_BY_NAME = {f.name: f for f in FORMATS}


def parse_format(name: str | WeightFormat) -> WeightFormat:
    """The format called `name` (one of FORMATS, or an alias such as "int4" for "int4-g32")."""
    if isinstance(name, WeightFormat):
        return name
    key = str(name).strip().lower()
    fmt = _BY_NAME.get(ALIASES.get(key, key))
    if fmt is None:
        valid = ", ".join([*_BY_NAME, *ALIASES])
        raise ConfigError(f"unknown weight format '{name}' (valid: {valid})")
    return fmt


# the GEMM ops a model's weights are stored for (sandwich/payload.py names them)
OP_NAMES = ("qkv", "o", "gate_up", "down", "lm_head", "expert_gate_up", "expert_down",
            "shared_gate_up", "shared_down", "v")  # v: the v projection apart (WeightSpec.split_v)


@dataclass(frozen=True)
class WeightSpec:
    """The formats of a model's GEMM weights: `base` for every op but those `overrides`
    names, e.g. the lm_head kept at 8 bits beside 4-bit layers (llama.cpp's Q4_K_M keeps
    output.weight in Q6_K, SmolLM2's Q4_1 file its tied embedding in Q8_0), or one op in some
    layers only (Q4_K_M keeps ffn_down in Q6_K in some layers), `v` the v projection apart
    from q and k (`split_v`). Written `int4-k,down@2.3=int6-k,v@2.3=int6-k,lm_head=int6-k`; a
    plain format name is a spec without overrides."""

    base: WeightFormat
    overrides: tuple[tuple[str, WeightFormat], ...] = ()  # (op or op@layer.layer..., format)

    @property
    def name(self) -> str:
        return ",".join([self.base.name, *(f"{op}={f.name}" for op, f in self.overrides)])

    @property
    def slug(self) -> str:
        """The name as a file name's part: int4-g32-asym-lm_head-int8-g32."""
        return self.name.replace(",", "-").replace("=", "-")

    def for_op(self, op: str, layer: int | None = None) -> WeightFormat:
        """The format op `op`'s weights are stored in (in layer `layer`, where given)."""
        return self._own(op, layer) or self.base

    def split_v(self, layer: int) -> WeightFormat | None:
        """The format of layer `layer`'s v projection where a `v` override gives it one other
        than its q and k projections' (a Q4_K_M file's Q6_K attn_v beside Q4_K attn_q and
        attn_k): the layer then runs v as a GEMM of its own beside a fused q|k ("qk").
        None: q, k and v fused in one QKV GEMM."""
        fmt = self._own("v", layer)
        return fmt if fmt is not None and fmt != self.for_op("qkv", layer) else None

    def _own(self, op: str, layer: int | None) -> WeightFormat | None:
        """The override naming `op`: layer `layer`'s own, else the whole model's; None."""
        whole = None
        for key, fmt in self.overrides:
            name, _, layers = key.partition("@")
            if name == op and not layers:
                whole = fmt
            elif name == op and layer is not None and layer in _layers(layers):
                return fmt
        return whole

    def layered(self) -> dict[int, dict[str, WeightFormat]]:
        """Layer -> {op: format} of the overrides that name layers."""
        out: dict[int, dict[str, WeightFormat]] = {}
        for key, fmt in self.overrides:
            op, _, layers = key.partition("@")
            for layer in _layers(layers) if layers else ():
                out.setdefault(layer, {})[op] = fmt
        return out


def _layers(text: str) -> tuple[int, ...]:
    """"2.3.27" -> (2, 3, 27)."""
    return tuple(int(x) for x in text.split("."))


def parse_weights(spec: str | WeightFormat | WeightSpec) -> WeightSpec:
    """The spec `spec` names ("int8-g32", "int4-g32-asym,lm_head=int8-g32",
    "int4-k,down@2.3=int6-k"), canonical: its overrides sorted, those equal to what they
    override dropped; a one-line ConfigError otherwise."""
    if isinstance(spec, WeightSpec):
        return spec
    if isinstance(spec, WeightFormat):
        return WeightSpec(spec)
    base, *rest = [part.strip() for part in str(spec).split(",")]
    fmt = parse_format(base)
    overrides = {}
    for part in rest:
        key, eq, name = (x.strip() for x in part.partition("="))
        op, at, layers = key.partition("@")
        if not eq or op not in OP_NAMES or (at and not _layer_list(layers)):
            raise ConfigError(f"weights '{spec}': '{part}' is not OP=FORMAT or "
                              f"OP@LAYER.LAYER...=FORMAT with OP one of {', '.join(OP_NAMES)}")
        if at:
            key = f"{op}@{'.'.join(str(x) for x in sorted(set(_layers(layers))))}"
        overrides[key] = parse_format(name)
    whole = {op: f for op, f in overrides.items() if "@" not in op}
    kept = {op: f for op, f in overrides.items() if op.partition("@")[0] == "v"  # see split_v
            or f != (whole.get(op.partition("@")[0], fmt) if "@" in op else fmt)}
    return WeightSpec(fmt, tuple(sorted(kept.items())))


def _layer_list(text: str) -> bool:
    """Whether `text` is layer numbers joined by dots ("2.3.27")."""
    return all(x.isdigit() for x in text.split("."))


def weights_flag(name: str | WeightFormat | WeightSpec) -> str:
    """What a suggested command line adds for the weights: `` --weights F``, fp32 included
    (the default, `auto`, runs a GGUF file in its own format)."""
    return f" --weights {parse_weights(name).name}"


def layout(fmt: WeightFormat, k: int, n: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of each array of a (K, N) weight in `fmt`: what a kernel allocates, in
    the order it takes them."""
    dtype = {32: np.float32, 16: np.uint16, 8: np.int8}.get(fmt.bits, np.uint8)
    out = {"q": ((n, k // 2 if fmt.bits < 8 else k), np.dtype(dtype))}
    if fmt.bits in HIGH_PER_BYTE:  # the bits above each value's low four
        out["high"] = ((n, k // HIGH_PER_BYTE[fmt.bits]), np.dtype(np.uint8))
    if fmt.quantized:
        groups = (n, k // fmt.group_size(k))
        out["scales"] = (groups, np.dtype(fmt.scale_dtype))
        if not fmt.symmetric:
            out["mins"] = (groups, np.dtype(fmt.scale_dtype))
        if fmt.super_group:
            supers = (n, k // fmt.super_group)
            out["super_scales"] = (supers, np.dtype(np.float16))
            if not fmt.symmetric:
                out["super_mins"] = (supers, np.dtype(np.float16))
    return out


# bits a value -> values whose bits above the low four one byte of `high` holds
HIGH_PER_BYTE = {6: 4, 5: 8}


@dataclass
class QuantizedWeight:
    """A weight W of shape (K, N) (the GEMMs compute A[M, K] @ W[K, N]) in one format, stored
    column by column along K, so a kernel dequantizes a group of one column with vector ops:

    - `q[n]`: column n's K values in order (float32 for fp32, the bf16 bits as uint16, int8),
      or for int4, K/2 bytes: within each group of g values, byte j holds value j in its low
      nibble and value j + g/2 in its high nibble (GGUF's order), each as 0..15;
    - `scales[n, i]` (and `mins[n, i]` when asymmetric): group i of column n is
      `(nibble - 8) * scale` (symmetric int4), `int8 * scale`, or `nibble * scale + min`;
    - int4-k (Q4_K): `scales` and `mins` are 6-bit factors, and `super_scales[n, j]`,
      `super_mins[n, j]` the fp16 d and dmin of super-group j: group i of column n is
      `nibble * d * scale - dmin * min`, d and dmin those of its super-group;
    - int5-k (Q5_K): as int4-k, on values 0..31: `q` their low 4 bits as int4-k's nibbles,
      `high[n]` (K/8 bytes) their fifth, value 8j + i's at bit i of byte j (`pack5`);
    - int6-k (Q6_K): each value is 6 bits, 0..63: `q[n]` (K/2 bytes) holds their low 4 bits,
      value 2j in byte j's low nibble and 2j + 1 in its high one; `high[n]` (K/4 bytes) their
      bits 4 and 5, value 4j + i's in bits 2i and 2i + 1 of byte j (`pack6`). `scales[n, i]`
      is group i's signed int8 factor (16 values), `super_scales[n, j]` the fp16 d of
      super-group j: a value is `(d * scale) * (value - 32)`, in float32 as ggml computes."""

    fmt: WeightFormat
    shape: tuple[int, int]  # (K, N)
    q: np.ndarray
    scales: np.ndarray | None = None
    mins: np.ndarray | None = None
    super_scales: np.ndarray | None = None
    super_mins: np.ndarray | None = None
    high: np.ndarray | None = None  # last: the other fields are also given by position

    def __post_init__(self) -> None:
        k, n = self.shape
        for key, (shape, dtype) in layout(self.fmt, k, n).items():
            a = getattr(self, key)
            if a is None or a.shape != shape or a.dtype != dtype:
                got = None if a is None else f"{a.dtype}{list(a.shape)}"
                raise ShapeError(f"{self.fmt.name} weight of shape (K, N) = {self.shape}: "
                                 f"'{key}' must be {dtype}{list(shape)}, got {got}")
            setattr(self, key, np.ascontiguousarray(a))  # a kernel reads each row as a stream

    @property
    def nbytes(self) -> int:
        """Bytes of the stored arrays: what one decode step streams from memory."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The stored arrays by name (`q`, then `high`, `scales`, `mins`, `super_scales` and
        `super_mins` where the format has them), in the order a kernel takes them."""
        return {key: getattr(self, key) for key in layout(self.fmt, *self.shape)}


def check_shape(fmt: WeightFormat, shape: tuple[int, ...]) -> tuple[int, int]:
    """(K, N) of a weight that `fmt` can store, or a one-line ConfigError."""
    if len(shape) != 2:
        raise ConfigError(f"a weight must be 2-D (K, N), got shape {tuple(shape)}")
    k, n = (int(d) for d in shape)
    step = fmt.super_group or fmt.group
    if step and k % step:
        raise ConfigError(f"{fmt.name} needs K a multiple of {step}, got weight "
                          f"(K, N) = ({k}, {n})")
    return k, n


def round_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's roundf, as ggml's Q8_0 does): float32 `x` plus or minus
    0.5 is exact in float64 (float32's 0.49999997 + 0.5 would round up to 1), then truncated."""
    return np.trunc(x.astype(np.float64) + np.copysign(0.5, x)).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, 0, 1 / d)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even, NaN kept quiet (ggml_compute_fp32_to_bf16)."""
    n = x.view(np.uint32)
    quiet = (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, quiet, n)
    n = (n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> np.uint64(16)
    return n.astype(np.uint16)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 (nearest even), as float32: what a bf16 GEMM multiplies for A."""
    bits = _to_bf16(np.ascontiguousarray(x, dtype=np.float32))
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def pack4(qs: np.ndarray) -> np.ndarray:
    """(N, G, g) values 0..15 -> (N, G*g/2) bytes: j low, j + g/2 high in each group."""
    half = qs.shape[-1] // 2
    return (qs[..., :half] | (qs[..., half:] << np.uint8(4))).reshape(qs.shape[0], -1)


def unpack4(q: np.ndarray, g: int) -> np.ndarray:
    """(N, K/2) int4 bytes -> (N, K/g, g) values 0..15, the inverse of the packing above."""
    b = q.reshape(q.shape[0], -1, g // 2)
    return np.concatenate([b & np.uint8(0x0F), b >> np.uint8(4)], axis=-1)


def pack6(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) values 0..63 -> int6-k's (q, high): (N, K/2) low nibbles, value 2j low and
    2j + 1 high in byte j, and (N, K/4) high bit pairs, value 4j + i's at bits 2i of byte j."""
    v = np.asarray(values, np.uint8)
    low, top = v & np.uint8(0x0F), (v >> np.uint8(4)).reshape(v.shape[0], -1, 4)
    q = low[:, 0::2] | (low[:, 1::2] << np.uint8(4))
    high = top[..., 0] | (top[..., 1] << 2) | (top[..., 2] << 4) | (top[..., 3] << 6)
    return np.ascontiguousarray(q), high.astype(np.uint8)


def unpack6(q: np.ndarray, high: np.ndarray) -> np.ndarray:
    """int6-k's (N, K/2) `q` and (N, K/4) `high` -> (N, K) values 0..63: the inverse of pack6."""
    n = q.shape[0]
    low = np.stack([q & np.uint8(0x0F), q >> np.uint8(4)], axis=-1).reshape(n, -1)
    shifts = np.arange(0, 8, 2, dtype=np.uint8)
    top = ((high[..., None] >> shifts) & np.uint8(3)).reshape(n, -1)
    return low | (top << np.uint8(4))


def pack5(values: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) values 0..31 -> int5-k's (q, high): (N, K/2) low nibbles in pack4's order for
    groups of g, and (N, K/8) fifth bits, value 8j + i's at bit i of byte j."""
    v = np.asarray(values, np.uint8)
    q = pack4((v & np.uint8(0x0F)).reshape(v.shape[0], -1, g))
    return q, np.packbits(v >> np.uint8(4), axis=-1, bitorder="little")


def unpack5(q: np.ndarray, high: np.ndarray, g: int) -> np.ndarray:
    """int5-k's (N, K/2) `q` and (N, K/8) `high` -> (N, K) values 0..31: the inverse of pack5."""
    fifth = np.unpackbits(high, axis=-1, bitorder="little")
    return unpack4(q, g).reshape(q.shape[0], -1) | (fifth << np.uint8(4))


def _scales(fmt: WeightFormat, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`x` in the format's scale dtype, or a ConfigError when a scale does not fit it."""
    with np.errstate(over="ignore"):
        out = x.astype(fmt.scale_dtype)
    if not np.isfinite(out).all():
        raise ConfigError(f"weight values up to |w| = {float(np.abs(w).max()):.4g} do not fit "
                          f"{fmt.name}'s {fmt.scale_dtype} scales; use int8 or bf16")
    return out


# values a piece of a large weight quantizes at once: its temporaries stay in the caches, and
# the pieces run on one thread per CPU (a 2048 x 30000 weight to int8-g32, Zen 4, 2 CPUs:
# 0.6 s against 3.1 s whole, with round_away's float64 add; bf16 0.24 s against 3.5 s)
PIECE_VALUES = 1 << 20


def quantize(w: np.ndarray, fmt: WeightFormat | str) -> QuantizedWeight:
    """A float32 (K, N) weight in `fmt`; the int formats round as ggml's reference quantizers.
    Every format quantizes each column on its own, so a large weight goes in pieces of
    columns, in parallel (numpy releases the GIL)."""
    fmt = parse_format(fmt)
    k, n = check_shape(fmt, np.shape(w))
    step = max(1, PIECE_VALUES // max(k, 1))
    if n <= 4 * step or fmt.bits == 32:  # fp32 only transposes
        return _quantize(w, fmt, k, n)
    import os
    from concurrent.futures import ThreadPoolExecutor

    starts = range(0, n, step)
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        parts = pool.map(lambda a: _quantize(w[:, a:a + step], fmt, k, min(step, n - a)), starts)
        return concat_columns(list(parts))


def _quantize(w: np.ndarray, fmt: WeightFormat, k: int, n: int) -> QuantizedWeight:
    cols = np.ascontiguousarray(np.asarray(w, np.float32).T)  # (N, K): one column per row
    if fmt.bits == 32:
        return QuantizedWeight(fmt, (k, n), cols)
    if fmt.bits == 16:
        return QuantizedWeight(fmt, (k, n), _to_bf16(cols))
    if not np.isfinite(cols).all():
        raise ConfigError(f"weight has NaN or infinite values; {fmt.name} cannot store them")
    b = cols.reshape(n, k // fmt.group_size(k), fmt.group_size(k))
    if fmt.bits == 8:  # Q8_0: d = max|x| / 127, q = round(x / d)
        d = np.abs(b).max(axis=-1, keepdims=True) / 127
        q = round_away(b * _inverse(d)).astype(np.int8).reshape(n, k)
        return QuantizedWeight(fmt, (k, n), q, _scales(fmt, d[..., 0], cols))
    if fmt.bits == 6:
        return _quantize_6(b, fmt, k, n)
    if fmt.symmetric:  # Q4_0: d = (the value of largest magnitude) / -8, q = x / d + 8
        big = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[..., None], axis=-1)
        d = big / -8
        qs = np.trunc(b * _inverse(d) + np.float32(8.5), dtype=np.float32)
        q = pack4(qs.astype(np.uint8).clip(0, 15))
        return QuantizedWeight(fmt, (k, n), q, _scales(fmt, d[..., 0], cols))
    if fmt.super_group:
        return _quantize_k(b, fmt, k, n)
    lo, hi = b.min(axis=-1, keepdims=True), b.max(axis=-1, keepdims=True)  # Q4_1
    d = (hi - lo) / 15
    qs = np.trunc((b - lo) * _inverse(d) + np.float32(0.5), dtype=np.float32)
    q = pack4(qs.astype(np.uint8).clip(0, 15))
    return QuantizedWeight(fmt, (k, n), q, _scales(fmt, d[..., 0], cols),
                           _scales(fmt, lo[..., 0], cols))


def _quantize_k(b: np.ndarray, fmt: WeightFormat, k: int, n: int) -> QuantizedWeight:
    """(N, K/32, 32) float32 groups -> int4-k (int5-k): each group's scale (max - min) / 15
    (31) and minimum min(x, 0) as 6-bit factors of its super-group's largest over 63 (fp16),
    then the values rounded against the factors as stored. Simpler than llama.cpp's search
    for the best factors (a Q4_K or Q5_K file's own blocks load as they are, gguf_blocks.py)."""
    per, top = fmt.super_group // fmt.group, (1 << fmt.bits) - 1
    lo = np.minimum(b.min(axis=-1), 0)  # (N, K/32)
    step = (b.max(axis=-1) - lo) / top
    step, neg = step.reshape(n, -1, per), (-lo).reshape(n, -1, per)
    d = _scales(replace(fmt, scale_dtype="float16"), step.max(axis=-1, keepdims=True) / K_FACTOR_MAX, b)
    dmin = _scales(replace(fmt, scale_dtype="float16"), neg.max(axis=-1, keepdims=True) / K_FACTOR_MAX, b)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = round_away(step * _inverse(d32)).clip(0, K_FACTOR_MAX)
    mn = round_away(neg * _inverse(dmin32)).clip(0, K_FACTOR_MAX)
    scale = (d32 * sc).reshape(n, -1, 1)
    low = (dmin32 * mn).reshape(n, -1, 1)
    qs = round_away((b + low) * _inverse(scale)).clip(0, top).astype(np.uint8)
    q, high = pack5(qs.reshape(n, k), fmt.group) if fmt.bits == 5 else (pack4(qs), None)
    return QuantizedWeight(fmt, (k, n), q, sc.astype(np.uint8).reshape(n, -1),
                           mn.astype(np.uint8).reshape(n, -1), d[..., 0], dmin[..., 0], high)


def _quantize_6(b: np.ndarray, fmt: WeightFormat, k: int, n: int) -> QuantizedWeight:
    """(N, K/16, 16) float32 groups -> int6-k, shaped as ggml's quantize_row_q6_K_ref without
    its search for each group's best step: a group's step is its value of largest magnitude
    over -32, d the super-group's step of largest magnitude over -128 (fp16), each step a
    signed byte factor of d, then the values rounded against the factors as stored. Used only
    for tensors a file does not hold as Q6_K (those load as they are, gguf_blocks.py)."""
    per = fmt.super_group // fmt.group
    big = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    step = (big / np.float32(Q6_K_VALUE)).reshape(n, -1, per)  # (N, K/256, 16)
    top = np.take_along_axis(step, np.abs(step).argmax(axis=-1)[..., None], axis=-1)
    d = _scales(replace(fmt, scale_dtype="float16"), top / np.float32(Q6_K_FACTOR), b)
    sc = round_away(step * _inverse(d.astype(np.float32))).clip(-128, 127)
    scale = (d.astype(np.float32) * sc).reshape(n, -1, 1)
    qs = round_away(b * _inverse(scale)).clip(-32, 31) + 32
    q, high = pack6(qs.astype(np.uint8).reshape(n, k))
    return QuantizedWeight(fmt, (k, n), q, sc.astype(np.int8).reshape(n, -1),
                           super_scales=d[..., 0], high=high)


def dequantize(qw: QuantizedWeight) -> np.ndarray:
    """The float32 (K, N) weight `qw` stands for (as ggml dequantizes Q8_0, Q4_0, Q4_1,
    Q4_K, Q5_K and Q6_K)."""
    fmt, (k, n) = qw.fmt, qw.shape
    if fmt.bits == 32:
        cols = qw.q
    elif fmt.bits == 16:
        cols = (qw.q.astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        g = fmt.group_size(k)
        d = qw.scales.astype(np.float32)[..., None]
        if fmt.bits == 8:
            cols = qw.q.reshape(n, k // g, g).astype(np.float32) * d
        elif fmt.bits == 6:  # (d * sc) * (value - 32), Q6_K's float32 products
            values = unpack6(qw.q, qw.high).reshape(n, k // g, g).astype(np.float32) - 32
            cols = six_group_scales(qw)[..., None] * values
        elif fmt.symmetric:
            cols = d * (unpack4(qw.q, g).astype(np.int8) - np.int8(8)).astype(np.float32)
        else:  # value * scale + minimum (Q4_1; Q4_K, Q5_K: d * sc * q - dmin * m)
            scale, low = asym_group_scales(qw)
            cols = scale[..., None] * asym_values(qw).astype(np.float32) + low[..., None]
    return np.ascontiguousarray(cols.reshape(n, k).T)


def six_group_scales(qw: QuantizedWeight) -> np.ndarray:
    """Each group's scale, (N, K / 16) float32, of an int6-k weight: d * sc, the float32
    product ggml makes (exact: 11 and 8 significant bits)."""
    per = qw.fmt.super_group // qw.fmt.group_size(qw.shape[0])
    return np.repeat(qw.super_scales.astype(np.float32), per, axis=1) * qw.scales.astype(np.float32)


def asym_values(qw: QuantizedWeight) -> np.ndarray:
    """The values of an asymmetric int4 weight (int5-k's), 0..15 (0..31), per group along K:
    (N, K / g, g) uint8."""
    k, n = qw.shape
    g = qw.fmt.group_size(k)
    return unpack5(qw.q, qw.high, g).reshape(n, k // g, g) if qw.fmt.bits == 5 else unpack4(qw.q, g)


def asym_group_scales(qw: QuantizedWeight) -> tuple[np.ndarray, np.ndarray]:
    """Each group's scale and minimum, (N, K / g) float32, of an asymmetric int4 weight: the
    stored ones, or int4-k's (int5-k's) d * sc and -(dmin * m), the float32 products ggml makes."""
    scale, low = qw.scales.astype(np.float32), qw.mins.astype(np.float32)
    if qw.fmt.super_group:
        per = qw.fmt.super_group // qw.fmt.group_size(qw.shape[0])
        d, dmin = (np.repeat(a.astype(np.float32), per, axis=1) for a in (qw.super_scales, qw.super_mins))
        scale, low = d * scale, -(dmin * low)
    return scale, low


def take_columns(qw: QuantizedWeight, index: np.ndarray) -> QuantizedWeight:
    """The weight of columns `index` of `qw` (a permutation, e.g. GGUF's RoPE rows back to HF
    order, or a tensor-parallel shard of N), still in its format: no re-quantizing."""
    index = np.asarray(index)
    pick = {key: np.ascontiguousarray(a[index]) for key, a in qw.arrays().items()}
    return QuantizedWeight(qw.fmt, (qw.shape[0], len(index)), **pick)


def take_rows(qw: QuantizedWeight, rows: slice) -> QuantizedWeight:
    """The weight of K rows `rows` of `qw` (a tensor-parallel shard of K), still in its format
    with the scales the whole K was quantized with, so every rank computes with the values of
    one process; the rows must begin and end on a group boundary."""
    k, n = qw.shape
    lo, hi, step = rows.indices(k)
    g = qw.fmt.group_size(k) if qw.fmt.quantized else 1
    whole = qw.fmt.super_group or g
    if step != 1 or hi <= lo or (qw.fmt.group and (lo % whole or hi % whole)):
        raise ShapeError(f"rows {lo}:{hi} of a {qw.fmt.name} weight with K={k}: a shard of K "
                         f"must be whole groups of {whole}")
    per = 2 if qw.fmt.bits < 8 else 1  # int4, int5-k's and int6-k's low bits: two values a byte
    pick = {"q": qw.q[:, lo // per: hi // per]}
    if qw.high is not None:  # the bits above the low four: four or eight values a byte
        per = HIGH_PER_BYTE[qw.fmt.bits]
        pick["high"] = qw.high[:, lo // per: hi // per]
    for key in ("scales", "mins"):
        a = getattr(qw, key)
        if a is not None:
            pick[key] = a if qw.fmt.group is None else a[:, lo // g: hi // g]
    for key in ("super_scales", "super_mins"):
        a = getattr(qw, key)
        if a is not None:
            pick[key] = a[:, lo // whole: hi // whole]
    return QuantizedWeight(qw.fmt, (hi - lo, n), **pick)


def pad_columns(qw: QuantizedWeight, n: int) -> QuantizedWeight:
    """`qw` with zero columns appended up to N = n (a kernel's padded N): zero values with
    zero scales (and minimums) dequantize to 0 in every format."""
    k, n_in = qw.shape
    if n < n_in:
        raise ShapeError(f"cannot pad a weight of N={n_in} down to N={n}")
    pad = {key: np.concatenate([a, np.zeros((n - n_in, *a.shape[1:]), a.dtype)])
           for key, a in qw.arrays().items()}
    return QuantizedWeight(qw.fmt, (k, n), **pad)


def gemm_dtype(name: str | WeightFormat) -> str:
    """The dtype a GEMM op, schedule and tuning record carry for a weight format: "float32"
    for fp32 (the name records had before formats existed), else the format's name."""
    fmt = parse_format(name)
    return "float32" if fmt.bits == 32 else fmt.name


def format_of(dtype: str) -> WeightFormat:
    """The format a GEMM dtype names: the inverse of `gemm_dtype`."""
    return parse_format("fp32" if dtype == "float32" else dtype)


def concat_columns(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Weights of one format and K side by side along N (a fused QKV or gate/up), as stored."""
    fmt, k = parts[0].fmt, parts[0].shape[0]
    if any(p.fmt != fmt or p.shape[0] != k for p in parts):
        raise ShapeError("fused weights must share a format and K: got "
                         + ", ".join(f"{p.fmt.name} K={p.shape[0]}" for p in parts))
    arrays = {key: np.concatenate([p.arrays()[key] for p in parts]) for key in parts[0].arrays()}
    return QuantizedWeight(fmt, (k, sum(p.shape[1] for p in parts)), **arrays)
