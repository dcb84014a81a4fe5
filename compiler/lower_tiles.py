"""The DSL's AMX tile statements (dsl/ast.py, Tile) as TIR calls of LLVM's x86 AMX intrinsics.

TVM 0.27 has no AMX schedule primitives for CPU kernels written by hand, but its LLVM
codegen passes `T.call_llvm_intrin` through, and the intrinsics that name their tile by an
immediate (llvm.x86.tileloadd64, tdpbf16ps, ...) need no shape inference: the kernel's own
tile_config says every tile's rows. The configuration is a 64-byte block on the stack:
palette 1, each used tile's row bytes (16 + 2 t: 64 unless the configuration gives them),
its rows (byte 48 + t).
A process must also ask Linux for the tile state before it runs one (compiler/amx.py).
"""

from __future__ import annotations

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLError

_INTRINSICS = {"tile_zero": "llvm.x86.tilezero", "tile_load": "llvm.x86.tileloadd64",
               "tile_store": "llvm.x86.tilestored64", "tile_dpbf16": "llvm.x86.tdpbf16ps",
               "tile_dpbsud": "llvm.x86.tdpbsud", "tile_release": "llvm.x86.tilerelease"}
_ITEM_BYTES = {"f32": 4, "i32": 4}  # what dsl/check.py lets a tile load or store
_CONFIG_BYTES, _PALETTE, _COLSB, _ROWS = 64, 0, 16, 48  # the ldtilecfg block's layout


class TileStatements:
    """Mixed into the TIR emitter (compiler/lower_tir.py): `amx` says the target has AMX-BF16,
    `amx_int8` AMX-INT8 (tile_dpbsud)."""

    amx = False
    amx_int8 = False

    def tile(self, s: A.Tile, depth: int) -> None:
        if not self.amx:
            raise DSLError(f"{s.op}: the kernel uses AMX tiles, and this target has no "
                           "AMX-BF16 (amx_bf16 in /proc/cpuinfo)")
        if s.op == "tile_dpbsud" and not self.amx_int8:
            raise DSLError("tile_dpbsud: the kernel multiplies bytes on AMX tiles, and this "
                           "target has no AMX-INT8 (amx_int8 in /proc/cpuinfo)")
        if s.op == "tile_config":
            self.tile_config(s, depth)
            return
        args = [f"T.uint8({t.value})" for t in s.args[:A.TILE_NUMBERS[s.op]]]
        if s.op in ("tile_load", "tile_store"):
            ref, stride = s.args[1], s.args[2]
            item = _ITEM_BYTES[self.types[ref.array]]
            split = self.splits.get(self.names[ref.array])
            if split is not None:  # a tile moves rows at a stride: the array stays one buffer
                split.whole = True
            args = [args[0], f"T.address_of({self.expr(ref)})",
                    f'T.Cast("int64", {self.expr(stride)}) * T.int64({item})']
        call = ", ".join(['"void"', f'"{_INTRINSICS[s.op]}"', *args])
        self.line(depth, f"T.evaluate(T.call_llvm_intrin({call}))")

    def tile_config(self, s: A.Tile, depth: int) -> None:
        cfg = self.bind("tilecfg")
        self.line(depth, f'{cfg} = T.alloc_buffer(({_CONFIG_BYTES},), "uint8", scope="global")')
        self.fresh += 1
        self.line(depth, f"for z{self.fresh} in range({_CONFIG_BYTES}):")
        self.line(depth + 1, f"{cfg}[z{self.fresh}] = T.uint8(0)")
        self.line(depth, f"{cfg}[{_PALETTE}] = T.uint8(1)")
        widths = s.args[A.TILES:] or [A.IntLit(A.TILE_ROW_BYTES)] * A.TILES
        for t, (rows, bytes_) in enumerate(zip(s.args[:A.TILES], widths, strict=True)):
            value = self.const(rows)
            if value == 0:
                continue
            if value is not None and not 0 < value <= A.TILE_ROWS:
                raise DSLError(f"tile_config: a tile has 0 to {A.TILE_ROWS} rows, got {value}")
            if value is None:  # the CPU faults on more
                self.line(depth, f'assert 0 <= {self.expr(rows)} <= {A.TILE_ROWS}, '
                                 f'"tile_config: a tile has 0 to {A.TILE_ROWS} rows"')
            wide = self.const(bytes_)
            if wide is None or not (0 < wide <= A.TILE_ROW_BYTES and wide % 4 == 0):
                got = "an expression" if wide is None else wide
                raise DSLError(f"tile_config: a tile row holds 4 to {A.TILE_ROW_BYTES} bytes, a "
                               f"multiple of 4, as a constant; got {got}")
            r = str(value) if value is not None else self.expr(rows)
            width = (f"T.uint8({wide})" if value is not None else
                     f"T.Select({r} > 0, T.uint8({wide}), T.uint8(0))")
            self.line(depth, f"{cfg}[{_COLSB + 2 * t}] = {width}")
            self.line(depth, f'{cfg}[{_ROWS + t}] = T.Cast("uint8", {r})')
        self.line(depth, 'T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", '
                         f"T.address_of({cfg}[0])))")
