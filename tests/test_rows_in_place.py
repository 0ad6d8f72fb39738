"""rows_in_place on small hand-written functions: the shape f32_dense's schedule leaves (a
marked zero-padded copy of x's rows, each 12-row tile matched by one micro-kernel call),
and the cases the rewrite must leave alone or refuse. The end-to-end checks (the real
schedule, numerics at ragged row counts) are in test_f32_dense.py."""

from __future__ import annotations

import pytest
from tvm.script import tirx as T
from tvm.sym import Analyzer
from tvm_ffi.structural import structural_equal

from portable_pe.cpu_schedule.rows_in_place import ROWS_IN_PLACE, read_rows_in_place
from portable_pe.cpu_schedule.tir_util import _blocks_under, _walk, is_extern_call

KERNEL = "portable_pe_f32_"


def _tiles(*, mark: bool = True, extra_reader: bool = False, kernel: str = "portable_pe_f32_12x32"):
    """x [13, 8] padded to two 12-row tiles; `extra_reader`: a block that also loads the copy."""
    copy_attrs = {ROWS_IN_PLACE: 1} if mark else {}

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((13, 8), "float32"), other: T.Buffer((24, 8), "float32")):
        x_pad = T.sblock_alloc_buffer((24, 8))
        for i, k in T.grid(24, 8):
            with T.sblock("x_pad"):
                vi, vk = T.axis.remap("SS", [i, k])
                T.sblock_attr(copy_attrs)
                x_pad[vi, vk] = T.if_then_else(vi < 13, x[vi, vk], T.float32(0))
        for io in range(2):
            with T.sblock("tile_o"):
                v = T.axis.spatial(2, io)
                A = T.match_buffer(x_pad[v * 12:v * 12 + 12, 0:8], (12, 8), strides=("sa", 1), offset_factor=1)
                T.evaluate(T.call_extern("int32", kernel, A.access_ptr("r"), A.strides[0], T.int32(12)))
        if extra_reader:
            for i, k in T.grid(24, 8):
                with T.sblock("other"):
                    vi, vk = T.axis.remap("SS", [i, k])
                    other[vi, vk] = x_pad[vi, vk]
    return func


def test_a_marked_copy_read_only_by_the_kernel_is_dropped_and_the_tile_read_in_place():
    out = read_rows_in_place(_tiles(), KERNEL)
    names = [blk.name_hint for blk in _blocks_under(out.body)]
    assert "x_pad" not in names and "tile_o" in names, out.script()
    (tile,) = [blk for blk in _blocks_under(out.body) if blk.name_hint == "tile_o"]
    assert [mb.source.source.name for mb in tile.match_buffers] == ["x"], out.script()
    assert [r.source.name for r in tile.reads] == ["x"], out.script()
    (call,) = [s.value for s in _walk(out.body) if is_extern_call(s, (KERNEL,))]
    # the rows x has from each tile on: 13 from the first, 1 from the second
    assert str(call.args[-1].ty) == "int32", call.args[-1]
    (v,) = [iv.var for iv in tile.iter_vars]
    for tile_index, rows_left in ((0, 13), (1, 1)):
        analyzer = Analyzer()
        analyzer.bind(v, tile_index)
        assert int(analyzer.simplify(call.args[-1])) == rows_left, (tile_index, call.args[-1])


@pytest.mark.parametrize("case", ["read elsewhere", "not marked"])
def test_a_copy_something_else_reads_or_unmarked_is_left_alone(case):
    func = _tiles(extra_reader=True) if case == "read elsewhere" else _tiles(mark=False)
    assert structural_equal(read_rows_in_place(func, KERNEL), func)


def test_a_marked_copy_matched_by_another_call_is_refused():
    with pytest.raises(ValueError, match="tile_o reads a row copy but is not one portable_pe_f32_ call"):
        read_rows_in_place(_tiles(kernel="some_other_kernel"), KERNEL)
