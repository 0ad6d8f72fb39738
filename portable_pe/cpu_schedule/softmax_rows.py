"""Per-row softmax steps the fused attention kernels share (attention.py, bf16_attention.py)."""

from __future__ import annotations

#: the widest lane vector the halving reductions below take
_MAX_LANES = 64


def _softmax_row_macros():
    """The two steps both fused attention kernels (this one and bf16_attention's) take per
    score row from a vector of per-lane partial results, as TVMScript macros (inlined
    where they are called, so each kernel's TIR is what it would be written out):

    row_max_of_lanes: row_max[r] = the max of lane[first:first + lanes]; those lanes zeroed
        for the sums; with zero_dead_rows the max is at least -FLT_MAX (-inf - -inf would be
        NaN: every p of a fully masked row becomes 0);
    inverse_row_sum_of_lanes: row_inv[r] = 1 / the sum of lane[first:first + lanes] (0 for
        a dead row).

    Both reduce the lanes by halving (lanes a power of two): the upper half into the lower,
    as one vector operation, then the upper quarter, and so on, log2(lanes) dependent
    steps, where a scalar loop over the lanes was a chain of `lanes` dependent maxima or
    additions (32 of 4 cycles each at the float32 kernel's 32 lanes, twice per score
    row). The float32 kernel alone, B = 8, 2 threads, paired runs: 0.87 of its time at
    T = 128 (4 heads), 0.90 at T = 201 (6 heads), 0.95 at T = 512. The sum's order
    changes with it (results within 2e-7 relative of the scalar loop's)."""
    from tvm.script import tirx as T

    @T.macro
    def halve(lane, first, width, add):
        """lane[first + l] (+ or max)= lane[first + width + l] for l < width."""
        for l in T.vectorized(width):
            if add:
                lane[first + l] = lane[first + l] + lane[first + width + l]
            else:
                lane[first + l] = T.max(lane[first + l], lane[first + width + l])

    @T.macro
    def reduce_lanes(lane, first, lanes, add):
        """lane[first] and lane[first + 1] hold the whole vector's max (or sum) as a pair."""
        if lanes >= 64:
            halve(lane, first, 32, add)
        if lanes >= 32:
            halve(lane, first, 16, add)
        if lanes >= 16:
            halve(lane, first, 8, add)
        if lanes >= 8:
            halve(lane, first, 4, add)
        if lanes >= 4:
            halve(lane, first, 2, add)

    @T.macro
    def row_max_of_lanes(row_max, lane, r, lanes, zero_dead_rows, first):
        reduce_lanes(lane, first, _halving_lanes(lanes), False)
        row_max[r] = T.max(lane[first], lane[first + 1])
        for l in T.vectorized(lanes):
            lane[first + l] = T.float32(0)
        if zero_dead_rows:
            row_max[r] = T.max(row_max[r], T.float32(-3.4028234663852886e38))

    @T.macro
    def inverse_row_sum_of_lanes(row_inv, lane, r, lanes, zero_dead_rows, first):
        reduce_lanes(lane, first, _halving_lanes(lanes), True)
        row_inv[r] = lane[first] + lane[first + 1]
        if zero_dead_rows:
            row_inv[r] = T.if_then_else(row_inv[r] > T.float32(0), T.float32(1) / row_inv[r], T.float32(0))
        else:
            row_inv[r] = T.float32(1) / row_inv[r]

    return row_max_of_lanes, inverse_row_sum_of_lanes


def _halving_lanes(lanes: int) -> int:
    """`lanes`, checked: the halving reductions take a power of two from 2 to _MAX_LANES."""
    if lanes < 2 or lanes > _MAX_LANES or lanes & (lanes - 1):
        raise ValueError(f"softmax_rows: {lanes} lanes; the row reductions take a power of two from 2 to {_MAX_LANES}")
    return lanes


row_max_of_lanes, inverse_row_sum_of_lanes = _softmax_row_macros()
