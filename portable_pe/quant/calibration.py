"""Calibration inputs: seeded, at lengths spread over the graph's range.

Activation ranges depend on the sequence length: attention averages over T values, so
its output is widest at T = 1 (a single value vector) and narrows as T grows. A range
calibrated on long inputs only clips short ones (cosine 0.968 at T = 1 against 0.99985
with T = 1 in the set, rope graph), so the lengths run from 1 to 512 in octaves, and
short lengths come in batches of about 64 tokens (one token alone left the tiny test
graph at cosine 0.9987 for T = 1, 0.99997 with 64).
Seeds start at 1: the parity harness and the bench use seed 0, so the accuracy checks
never see the calibration data.
"""

from __future__ import annotations

import numpy as np

CALIBRATION_LENGTHS = (1, 7, 16, 32, 64, 128, 256, 512)
# A vision graph's image sizes, in patches per axis: 1 to 576 patches, as the lengths
# above span 1 to 512 tokens (14 x 14: 224 x 224 pixels at patch 16)
CALIBRATION_GRIDS = ((1, 1), (2, 3), (4, 4), (8, 8), (14, 14), (24, 24))
TOKENS_PER_SAMPLE = 64
FIRST_SEED = 1


def calibration_lengths(io: dict) -> list[int]:
    """CALIBRATION_LENGTHS within the graph's sequence range (a static graph: its length)."""
    from ..run.parity import usable_lengths
    lengths = usable_lengths(io, CALIBRATION_LENGTHS)
    if not lengths:  # a range that misses every default length: its two ends
        seq = [d for d in io.get("dims", {}).values() if d.get("role") == "seq"]
        lengths = sorted({max(d["min"] for d in seq), min(d["max"] for d in seq)}) if seq else []
    return lengths


def calibration_sizes(io: dict) -> list[dict[str, int]]:
    """A vision graph's calibration image sizes ({role: pixels}): CALIBRATION_GRIDS within
    its bounds; [] for a graph without image dims."""
    from ..run.parity import default_sizes, pixel_roles
    return default_sizes(io, CALIBRATION_GRIDS) if pixel_roles(io) else []


def calibration_feeds(io: dict, *, lengths: list[int], sizes: list[dict[str, int]] = ()) -> list[dict[str, np.ndarray]]:
    """One seeded input set per length, or per image size where `sizes` are given (a
    vision graph), seeds FIRST_SEED, FIRST_SEED + 1, ..."""
    from ..run.parity import dim_roles, make_inputs
    if sizes:
        return [make_inputs(io["inputs"], sizes=size, batch=_batch(io, _patches(io, size)), seed=FIRST_SEED + i,
                            dim_roles=dim_roles(io))
                for i, size in enumerate(sizes)]
    return [make_inputs(io["inputs"], length=n, batch=_batch(io, n), seed=FIRST_SEED + i, dim_roles=dim_roles(io),
                        relations=io.get("dim_relations"))
            for i, n in enumerate(lengths)]


def _patches(io: dict, size: dict[str, int]) -> int:
    """The patches (tokens, less any class token) of an image or clip of `size`."""
    dims = {info["role"]: info for info in io["dims"].values()}
    count = 1
    for role, pixels in size.items():
        count *= max(1, pixels // dims[role].get("multiple", 1))
    return count


def _batch(io: dict, length: int) -> int:
    """Short inputs in batches of about TOKENS_PER_SAMPLE tokens (where the batch is free):
    one T = 1 input is one token, too few to find the range of its activations."""
    batch = [d for d in io.get("dims", {}).values() if d.get("role") == "batch"]
    if not batch:
        return 1
    return max(1, min(TOKENS_PER_SAMPLE // length, min(d["max"] for d in batch)))


class FeedReader:
    """onnxruntime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)
