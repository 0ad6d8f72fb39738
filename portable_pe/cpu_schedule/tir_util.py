"""Target facts and small TIR inspection helpers shared by the CPU schedule rules."""

from __future__ import annotations

from tvm import tirx


# --------------------------------------------------------------------------------------
# Target helpers
# --------------------------------------------------------------------------------------
def _vector_lanes(target, dtype_bits: int = 32) -> int:
    """Number of lanes of the widest SIMD register for the given element width."""
    bits = 128
    try:
        mcpu = str(target.attrs.get("mcpu", "")) if target is not None else ""
        mattr = [str(a) for a in target.attrs.get("mattr", [])] if target is not None else []
        mtriple = str(target.attrs.get("mtriple", "")) if target is not None else ""
    except Exception:  # pragma: no cover - defensive
        mcpu, mattr, mtriple = "", [], ""
    avx512_cpus = (
        "skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake",
        "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5",
        "rocketlake", "cannonlake", "x86-64-v4",
    )
    avx2_cpus = (
        "haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
        "znver1", "znver2", "znver3", "x86-64-v3", "core-avx2",
    )
    if any(a.startswith("+avx512f") for a in mattr) or any(mcpu.startswith(c) for c in avx512_cpus):
        bits = 512
    elif any(a.startswith("+avx2") for a in mattr) or any(mcpu.startswith(c) for c in avx2_cpus):
        bits = 256
    elif "aarch64" in mtriple or "arm" in mtriple:
        bits = 128
    return max(1, bits // max(dtype_bits, 8))


def _simd_registers(target) -> int:
    """Architectural SIMD registers: 32 with AVX-512 or on aarch64 (NEON/SVE), else 16."""
    mtriple = str(target.attrs.get("mtriple", "")) if target is not None else ""
    if _vector_lanes(target) >= 16 or "aarch64" in mtriple:
        return 32
    return 16


def _num_cores(target) -> int:
    try:
        n = int(target.attrs.get("num-cores", 0))
    except Exception:  # pragma: no cover
        n = 0
    return n if n > 0 else 1


# --------------------------------------------------------------------------------------
# Small TIR helpers
# --------------------------------------------------------------------------------------
def _const_int(expr):
    if isinstance(expr, int):
        return expr
    if _node(expr) == "IntImm":
        return int(expr.value)
    return None


def _loop_extent(sch, loop):
    return _const_int(sch.get(loop).extent)


def _root_block(sch):
    func = sch.mod["main"]
    return sch.get_sblock(func.body.block.name_hint)


def _iter_kind(iv) -> str:
    if iv.iter_type == tirx.IterVar.DataPar:
        return "S"
    if iv.iter_type == tirx.IterVar.CommReduce:
        return "R"
    return "O"


def _block_kinds(sch, block) -> str:
    return "".join(_iter_kind(iv) for iv in sch.get(block).iter_vars)


def _is_spatial(sch, block) -> bool:
    return all(k == "S" for k in _block_kinds(sch, block))


def _loops_are_plain(sch, block) -> bool:
    """Loops map 1:1 to block iters (normalized nest), no annotations."""
    loops = sch.get_loops(block)
    return len(loops) == len(sch.get(block).iter_vars)


def _node(expr) -> str:
    # TVM 0.27 moved PrimExpr classes to tvm.ir.prim.expr; tirx.Add etc. are not
    # the classes of the nodes found in PrimFuncs, so compare class names.
    return type(expr).__name__


def _is_load(expr) -> bool:
    # TVM 0.27: tirx.BufferLoad is a factory returning ir.TensorLoad (buffer in
    # ``.source``); older versions have BufferLoad with ``.buffer``.
    return _node(expr) in ("TensorLoad", "BufferLoad") and hasattr(expr, "indices")


def _load_buffer(expr):
    return expr.buffer if hasattr(expr, "buffer") else expr.source


def _is_store(stmt) -> bool:
    return hasattr(stmt, "buffer") and hasattr(stmt, "indices") and hasattr(stmt, "value")


def _region_buffer(region):
    # TVM 0.27: read/write regions are ir.TensorRegion with the buffer in ``.source``.
    return region.buffer if hasattr(region, "buffer") else region.source


def _expr_vars(expr) -> set:
    """Free variables of a TIR expression."""
    try:
        return set(tirx.analysis.undefined_vars(expr, []))
    except Exception:  # pylint: disable=broad-except
        return set()


def _subexprs(expr):
    """`expr` and every expression under it (arithmetic, casts, lets, selects, call
    arguments), parents first; a load's indices are not entered."""
    yield expr
    for child in ("a", "b", "value", "body", "condition", "true_value", "false_value"):
        if hasattr(expr, child):
            yield from _subexprs(getattr(expr, child))
    if _node(expr) == "Call":
        for arg in expr.args:
            yield from _subexprs(arg)


def _loads_of_value(expr):
    """Every load in a stored value (through arithmetic, casts, selects and calls)."""
    return (e for e in _subexprs(expr) if _is_load(e))


def loop_with(loop, *, kind=None, body=None, without: str | None = None):
    """`loop` rebuilt with another kind or body, or without the annotation `without`; its
    var, range, thread binding, other annotations and step kept (TVM 0.27's For has no
    copy-with method)."""
    annotations = {k: v for k, v in loop.annotations.items() if k != without}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind if kind is None else kind,
                    loop.body if body is None else body, loop.thread_binding, annotations, getattr(loop, "step", None))


def _stmt_children(stmt) -> list:
    """The statements directly under a scheduled-TIR statement (loops, sequences, ifs, blocks)."""
    kind = _node(stmt)
    if kind == "For":
        return [stmt.body]
    if kind == "SeqStmt":
        return list(stmt.seq)
    if kind == "IfThenElse":
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    if kind == "SBlockRealize":
        return [stmt.block.body] + ([stmt.block.init] if stmt.block.init is not None else [])
    return []


def _walk(stmt):
    """`stmt` and every statement under it, parents first."""
    yield stmt
    for child in _stmt_children(stmt):
        yield from _walk(child)


def _blocks_under(stmt):
    """Every SBlock under `stmt`."""
    return (s.block for s in _walk(stmt) if _node(s) == "SBlockRealize")


def is_extern_call(stmt, externs: tuple[str, ...]) -> bool:
    """Whether ``stmt`` is one call_extern of a function whose name starts with one of
    ``externs``."""
    value = stmt.value if _node(stmt) == "Evaluate" else None
    return (value is not None and _node(value) == "Call" and getattr(value.op, "name", "") == "tirx.call_extern"
            and str(value.args[0].value).startswith(externs))


def without_extern_zero_fills(func, externs: tuple[str, ...]):
    """``func`` without the init (the zero fill of C) of each block that is one call of a
    micro-kernel named in ``externs`` (a prefix each), which starts from zero itself and
    overwrites its whole C block: tensorize keeps the matmul's init around the call, a
    memset of the block before every call (1.5 KiB for f32_tiles' 12 x 32)."""
    from tvm.s_tir import SBlock
    from tvm_ffi.structural import structural_mutate

    def strip(block, mutator):
        block = mutator.default_mutate(block)
        if block.init is None or not is_extern_call(block.body, externs):
            return block
        return SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body, None,
                      block.alloc_buffers, block.match_buffers, block.annotations)
    return func.with_body(structural_mutate(func.body, [(SBlock, strip)]))


def each_prim_func(mod, rewrite):
    """`mod` with rewrite(func) in place of each of its PrimFuncs (the body of a module
    pass that works one function at a time)."""
    updates = {gv: rewrite(f) for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    for gv, f in updates.items():
        mod[gv] = f
    return mod


def horner_f32(coefficients, s):
    """c0 + c1·s + c2·s² + ... (coefficients lowest first) in Horner's form, a float32 TIR
    expression of s."""
    value = tirx.const(coefficients[-1], "float32")
    for c in coefficients[-2::-1]:
        value = value * s + tirx.const(c, "float32")
    return value
