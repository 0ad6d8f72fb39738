"""Per-row softmax steps the fused attention kernels share (attention.py, bf16_attention.py)."""

from __future__ import annotations

import math


def _softmax_row_macros():
    """The two steps both fused attention kernels (this one and bf16_attention's) take per
    score row from a vector of per-lane partial results, as TVMScript macros (inlined
    where they are called, so each kernel's TIR is what it would be written out):

    row_max_of_lanes: row_max[r] = the max of lane[first:first + lanes]; those lanes zeroed
        for the sums; with zero_dead_rows the max is at least -FLT_MAX (-inf - -inf would be
        NaN: every p of a fully masked row becomes 0);
    inverse_row_sum_of_lanes: row_inv[r] = 1 / the sum of lane[first:first + lanes] (0 for
        a dead row)."""
    from tvm.script import tirx as T

    @T.macro
    def row_max_of_lanes(row_max, lane, r, lanes, zero_dead_rows, first):
        row_max[r] = T.float32(-math.inf)
        for l in range(lanes):
            row_max[r] = T.max(row_max[r], lane[first + l])
        for l in T.vectorized(lanes):
            lane[first + l] = T.float32(0)
        if zero_dead_rows:
            row_max[r] = T.max(row_max[r], T.float32(-3.4028234663852886e38))

    @T.macro
    def inverse_row_sum_of_lanes(row_inv, lane, r, lanes, zero_dead_rows, first):
        row_inv[r] = T.float32(0)
        for l in range(lanes):
            row_inv[r] = row_inv[r] + lane[first + l]
        if zero_dead_rows:
            row_inv[r] = T.if_then_else(row_inv[r] > T.float32(0), T.float32(1) / row_inv[r], T.float32(0))
        else:
            row_inv[r] = T.float32(1) / row_inv[r]

    return row_max_of_lanes, inverse_row_sum_of_lanes


row_max_of_lanes, inverse_row_sum_of_lanes = _softmax_row_macros()
