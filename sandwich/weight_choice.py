"""`--weights auto`, every command's default: a GGUF file runs in the format most of its GEMM
weights are stored in (a Q4_K_M file as int4-k, a Q8_0 one as int8-g32), its lm_head
in its own type's where that has more bits (Q4_K_M's Q6_K output.weight as int6-k), so its
blocks load as they are and the model stays about the size it is on disk; anything else runs
in fp32.

Only the header is read (tensor types and shapes), so a command can decide before it loads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sandwich.gguf_blocks import NEAREST, STORED_AS, ggml_type_name, loads_into
from sandwich.gguf_config import gguf_path, is_gguf, open_reader
from sandwich.weight_formats import parse_format, parse_weights

# GGUF tensors that are not GEMM weights: the MoE router (always fp32 here), and the token
# embedding where the file has its own output matrix (a row lookup, not a GEMM)
NOT_GEMMS = ("ffn_gate_inp.weight",)
EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"
# the format a K-quant tensor runs in where its format cannot group a GEMM's K by its
# super-groups of 256: the nearest that stores any K a multiple of 32 (Q4_K: Q4_1's layout,
# the same nibbles; Q6_K: int8-g32, the nearest above its 6 bits)
KEEP_K = {"int4-k": "int4-g32-asym", "int6-k": "int8-g32"}


@dataclass(frozen=True)
class WeightsChoice:
    """The weight spec chosen (a format, and the lm_head's where it differs), with what it
    was chosen from: per GGUF type of the layers' GEMM weights, (tensors, values), and the
    lm_head's type (output.weight, or the tied embedding)."""

    weights: str
    types: dict[str, tuple[int, int]] = field(default_factory=dict)
    head_type: str | None = None

    @property
    def from_file(self) -> bool:
        """True where a GGUF file's tensors decided (False: fp32 for anything else)."""
        return bool(self.types) or self.head_type is not None

    def describe(self) -> str:
        """What becomes of the file's tensors: "int4-g32-asym: 210 Q4_1 tensors as stored;
        lm_head int8-g32: Q8_0 as stored"."""
        spec = parse_weights(self.weights)
        text = _what_becomes(spec.base.name, self.types)
        if self.head_type is not None:
            head = spec.for_op("lm_head").name
            text += "; lm_head " + _what_becomes(head, {self.head_type: (1, 0)}, count=False)
        return text


def _what_becomes(fmt: str, types: dict[str, tuple[int, int]], *, count: bool = True) -> str:
    """"int8-g32: 3 Q8_0 tensors as stored, 2 F16 re-quantized" (`count`: with the counts)."""
    def listed(pick: bool) -> str:
        return ", ".join(f"{n} {t}" if count else t for t, (n, _) in types.items()
                         if (fmt in loads_into(t)) == pick)

    stored, other = listed(True), listed(False)
    verb = "re-quantized" if parse_format(fmt).quantized else "converted"
    parts = ([f"{stored}{' tensors' if count else ''} as stored"] if stored else []) + (
        [f"{other} {verb}"] if other else [])
    return f"{fmt}: {', '.join(parts)}" if parts else fmt


def format_for_type(ggml_type: str) -> str:
    """The format a GGUF type's values run in: the one that holds them as stored, else the
    nearest (int4-g32 for the 2- and 3-bit and IQ types, which nothing here holds)."""
    return STORED_AS.get(ggml_type) or NEAREST.get(ggml_type, "int4-g32")


def auto_weights(model: object, tp: int = 1) -> WeightsChoice:
    """The spec `--weights auto` runs `model` in. A GGUF path or installed model's name: the
    layers in the format most of their GEMM weights' values are stored in (the more precise
    one on a tie); the lm_head in its own type's format where that has more bits (llama.cpp's
    Q4_K_M keeps output.weight in Q6_K, a Q4_1 file may keep its tied embedding in Q8_0),
    else the layers'. Anything else: fp32. `tp`: the tensor-parallel degree the model will
    run at (it splits some GEMMs' K)."""
    if not isinstance(model, str) or not is_gguf(model):
        return WeightsChoice("fp32")
    tensors = open_reader(gguf_path(model)).tensors
    names = {t.name for t in tensors}
    head_name = OUTPUT if OUTPUT in names else EMBEDDING
    types: Counter[str] = Counter()
    values: Counter[str] = Counter()
    head_type = None
    for t in tensors:
        if len(t.shape) < 2 or t.name.endswith(NOT_GEMMS) or (t.name == EMBEDDING != head_name):
            continue
        if t.name == head_name:
            head_type = ggml_type_name(t.tensor_type)
            continue
        name = ggml_type_name(t.tensor_type)
        types[name] += 1
        values[name] += int(t.n_elements)
    if not values and head_type is None:  # no GEMM weight at all
        return WeightsChoice("fp32")
    by_format: Counter[str] = Counter()
    for name, v in values.items():
        by_format[format_for_type(name)] += v
    head = format_for_type(head_type) if head_type is not None else None
    base = max(by_format, key=lambda f: (by_format[f], parse_format(f).bits)) if by_format else head
    # a format grouping K in super-groups (int4-k: 256) gives way to KEEP_K's where a GEMM's K,
    # or a rank's share of it, is not whole super-groups (llama.cpp's own Q4_K_M keeps such
    # tensors in other types)
    ks = {int(t.shape[0]) for t in tensors if len(t.shape) >= 2 and not t.name.endswith(NOT_GEMMS)}

    def fitted(fmt: str | None) -> str | None:
        step = parse_format(fmt).super_group if fmt is not None else None
        return KEEP_K[fmt] if step and any(k % (step * tp) for k in ks) else fmt

    base, head = fitted(base), fitted(head)
    keep = head is not None and parse_format(head).bits > parse_format(base).bits
    spec = f"{base},lm_head={head}" if keep else base
    ordered = sorted(types, key=values.get, reverse=True)
    return WeightsChoice(spec, {t: (types[t], values[t]) for t in ordered}, head_type)
