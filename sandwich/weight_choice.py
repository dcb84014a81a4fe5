"""`--weights auto`, every command's default: a GGUF file runs in the format most of its GEMM
weights are stored in (a Q4_K_M file as int4-k, a Q5_K_M one as int5-k, a Q8_0 one as
int8-g32), its lm_head
in its own type's where that has more bits (Q4_K_M's Q6_K output.weight as int6-k), so its
blocks load as they are and the model stays about the size it is on disk; anything else runs
in fp32.

Only the header is read (tensor types and shapes), so a command can decide before it loads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sandwich.gguf_blocks import NEAREST, STORED_AS, ggml_type_name, loads_into
from sandwich.gguf_config import gguf_path, is_gguf, open_reader
from sandwich.payload import K_SHARDED
from sandwich.weight_formats import parse_format, parse_weights

# GGUF tensors that are not GEMM weights: the MoE router (always fp32 here), and the token
# embedding where the file has its own output matrix (a row lookup, not a GEMM)
NOT_GEMMS = ("ffn_gate_inp.weight",)
EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"
# a layer's GEMM tensors (inside `blk.{i}.`) -> the op that runs them (sandwich/payload.py)
LAYER_OPS = {"attn_q.weight": "qkv", "attn_k.weight": "qkv", "attn_v.weight": "v",
             "attn_output.weight": "o", "ffn_gate.weight": "gate_up", "ffn_up.weight": "gate_up",
             "ffn_down.weight": "down", "ffn_gate_exps.weight": "expert_gate_up",
             "ffn_up_exps.weight": "expert_gate_up", "ffn_down_exps.weight": "expert_down",
             "ffn_gate_shexp.weight": "shared_gate_up", "ffn_up_shexp.weight": "shared_gate_up",
             "ffn_down_shexp.weight": "shared_down"}
# the format a K-quant tensor runs in where its format cannot group a GEMM's K by its
# super-groups of 256: the nearest that stores any K a multiple of 32 (Q4_K: Q4_1's layout,
# the same nibbles; Q5_K and Q6_K: int8-g32, the nearest above their 5 and 6 bits)
KEEP_K = {"int4-k": "int4-g32-asym", "int5-k": "int8-g32", "int6-k": "int8-g32"}


@dataclass(frozen=True)
class WeightsChoice:
    """The weight spec chosen (a format, the lm_head's where it differs, and an op's in the
    layers whose tensors of it are all stored in another), with what it was chosen from: per
    GGUF type of the layers' GEMM weights the base format runs, (tensors, values); the same
    for each per-layer override (by its spec key, `down@2.3`); the lm_head's type
    (output.weight, or the tied embedding)."""

    weights: str
    types: dict[str, tuple[int, int]] = field(default_factory=dict)
    head_type: str | None = None
    layer_types: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    @property
    def from_file(self) -> bool:
        """True where a GGUF file's tensors decided (False: fp32 for anything else)."""
        return bool(self.types) or self.head_type is not None

    def describe(self) -> str:
        """What becomes of the file's tensors: "int4-k: 24 Q4_K tensors as stored, 2 Q6_K
        re-quantized; down@2.3 int6-k: 2 Q6_K tensors as stored; lm_head int6-k: Q6_K as
        stored"."""
        spec = parse_weights(self.weights)
        text = _what_becomes(spec.base.name, self.types)
        for key, fmt in spec.overrides:
            if key in self.layer_types:
                text += f"; {key} " + _what_becomes(fmt.name, self.layer_types[key])
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
    noun = " tensor" if sum(n for n, _ in types.values()) == 1 else " tensors"
    parts = ([f"{stored}{noun if count else ''} as stored"] if stored else []) + (
        [f"{other} {verb}"] if other else [])
    return f"{fmt}: {', '.join(parts)}" if parts else fmt


def format_for_type(ggml_type: str) -> str:
    """The format a GGUF type's values run in: the one that holds them as stored, else the
    nearest (int4-g32 for the 2- and 3-bit and IQ types, which nothing here holds)."""
    return STORED_AS.get(ggml_type) or NEAREST.get(ggml_type, "int4-g32")


def auto_weights(model: object, tp: int = 1) -> WeightsChoice:
    """The spec `--weights auto` runs `model` in. A GGUF path or installed model's name: the
    spec's base is the format that holds the most values as stored (`_op_formats`: each
    layer's op in its tensors' format); a layer's op whose own format has more bits runs in
    it, a per-layer override (a Q4_K_M file's Q6_K ffn_down in some layers); the lm_head in
    its own type's format where that has more bits (llama.cpp's Q4_K_M keeps output.weight in
    Q6_K, a Q4_1 file may keep its tied embedding in Q8_0), else the layers'. Anything else:
    fp32. `tp`: the tensor-parallel degree the model will run at (it splits some GEMMs' K)."""
    if not isinstance(model, str) or not is_gguf(model):
        return WeightsChoice("fp32")
    tensors = open_reader(gguf_path(model)).tensors
    names = {t.name for t in tensors}
    head_name = OUTPUT if OUTPUT in names else EMBEDDING
    head = next((t for t in tensors if t.name == head_name and len(t.shape) >= 2), None)
    gemms = [t for t in tensors if len(t.shape) >= 2 and t is not head and t.name != EMBEDDING
             and not t.name.endswith(NOT_GEMMS)]
    if not gemms and head is None:  # no GEMM weight at all
        return WeightsChoice("fp32")
    head_type = ggml_type_name(head.tensor_type) if head is not None else None
    by_type: Counter[str] = Counter()
    for t in gemms:
        by_type[format_for_type(ggml_type_name(t.tensor_type))] += int(t.n_elements)
    # a tie goes to the more precise; a file of the lm_head alone runs in its format
    major = _most(by_type) if by_type else format_for_type(head_type)
    ops = _op_formats(gemms, major, tp)
    runs: Counter[str] = Counter()
    for fmt, ts in ops.values():
        runs[fmt] += sum(int(t.n_elements) for t in ts)
    base = _most(runs) if runs else _fitted(major, [head], 1)
    # an op keeps its own format where that has more bits than the base (the base would
    # round its values again), else runs the base, in KEEP_K's where the base cannot group
    # the op's K
    bits = parse_format(base).bits
    ops = {key: (fmt if parse_format(fmt).bits > bits
                 else _fitted(base, ts, _k_split(key[0], tp)), ts)
           for key, (fmt, ts) in ops.items()}
    hfmt = _fitted(format_for_type(head_type), [head], 1) if head is not None else None  # TP splits N
    keep = hfmt is not None and parse_format(hfmt).bits > parse_format(base).bits
    groups: dict[tuple[str, str], list[int]] = {}
    for (op, layer), (fmt, _) in sorted(ops.items()):
        # v runs apart where its format is not its layer's q and k's (WeightSpec.split_v)
        if fmt != (ops.get(("qkv", layer), (base,))[0] if op == "v" else base):
            groups.setdefault((op, fmt), []).append(layer)
    keys = {(op, fmt): f"{op}@{'.'.join(map(str, ls))}" for (op, fmt), ls in groups.items()}
    spec = parse_weights(",".join([base, *(f"{key}={fmt}" for (_, fmt), key in keys.items()),
                                   *([f"lm_head={hfmt}"] if keep else [])])).name
    layer_types = {keys[group]: _counted([t for layer in ls for t in ops[(group[0], layer)][1]])
                   for group, ls in groups.items()}
    grouped = {(op, layer) for (op, _), ls in groups.items() for layer in ls}
    based = [t for key, (fmt, ts) in ops.items() if key not in grouped for t in ts]
    return WeightsChoice(spec, _counted(based), head_type, layer_types)


def _op_formats(gemms, major: str, tp: int) -> dict[tuple[str, int], tuple[str, list]]:
    """(op, layer) -> (the format it runs in, its GGUF tensors): its tensors' stored type's
    format where they share one type, else (Q4_K_M's attn_q and attn_k in Q4_K beside attn_v
    in Q6_K, fused as one GEMM) the file's most common format `major`; where that format
    cannot group their K (a rank's share under `tp`, for the ops that split K) by its
    super-groups, KEEP_K's."""
    by_op: dict[tuple[str, int], list] = {}
    for t in gemms:
        layer, _, rest = t.name.removeprefix("blk.").partition(".")
        if t.name.startswith("blk.") and layer.isdigit() and rest in LAYER_OPS:
            by_op.setdefault((LAYER_OPS[rest], int(layer)), []).append(t)
    for (op, layer), ts in list(by_op.items()):  # v fused with q and k where all share a type
        qk = by_op.get(("qkv", layer), [])
        if op == "v" and len({ggml_type_name(t.tensor_type) for t in qk + ts}) == 1:
            by_op[("qkv", layer)] = qk + ts
            del by_op[(op, layer)]
    out = {}
    for key, ts in by_op.items():
        kinds = {ggml_type_name(t.tensor_type) for t in ts}
        fmt = format_for_type(kinds.pop()) if len(kinds) == 1 else major
        out[key] = (_fitted(fmt, ts, _k_split(key[0], tp)), ts)
    return out


def _k_split(op: str, tp: int) -> int:
    """The ranks op `op`'s K is split over under `tp` (1: TP splits its N, or nothing)."""
    return tp if op in K_SHARDED else 1


def _most(values: Counter[str]) -> str:
    """The format of the most values; a tie goes to the one of more bits."""
    return max(values, key=lambda f: (values[f], parse_format(f).bits))


def _fitted(fmt: str, tensors, tp: int) -> str:
    """`fmt`, or KEEP_K's where it groups K by super-groups that some tensor's K (or a rank's
    share of it) is not whole groups of (llama.cpp's own Q4_K_M keeps such tensors in other
    types)."""
    step = parse_format(fmt).super_group
    return KEEP_K[fmt] if step and any(int(t.shape[0]) % (step * tp) for t in tensors) else fmt


def _counted(tensors) -> dict[str, tuple[int, int]]:
    """GGUF tensors -> type -> (tensors, values), the most values first."""
    out: dict[str, tuple[int, int]] = {}
    for t in tensors:
        name = ggml_type_name(t.tensor_type)
        n, v = out.get(name, (0, 0))
        out[name] = (n + 1, v + int(t.n_elements))
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))
