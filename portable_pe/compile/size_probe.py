"""Image sizes a foreign vision graph really runs at, tried with onnxruntime before the compile.

A "dynamic" export is not always dynamic. torch.onnx can keep the pixel dims symbolic and
still fix what depends on them to the traced size: ViT's and SigLIP's position tables stay
at the traced grid (onnxruntime at another size: "Attempting to broadcast an axis by a
dimension other than 1. 17 by 37"), and torch.export's Swin drops the window padding it
traced as zero, so only sizes whose every stage divides into whole windows run. Nothing in
the file says so; the graph has to be run. The original graph runs here at two sizes in
whole patches, then at coarser multiples (2, 4, ... times the patch): the first multiple at
which both sizes run is what the bundle declares, and a graph that runs at none of them is
refused with the fix, instead of a bundle that is wrong at every size but one.

A graph without an image input gets the same question at the sizes the simplify check
feeds it (`refuse_if_unrunnable`): Whisper's encoder adds its whole max_source_positions
table to the frames, so its export runs at the traced frame count only ("Attempting to
broadcast an axis by a dimension other than 1. 4 by 16"), and TorchScript's Qwen2.5-VL
vision tower indexes its traced grid. Where the original graph runs at none of them, the
compile refuses with the fix, not with onnxruntime's words from inside the simplify stage.
"""

from __future__ import annotations

import copy

from ..run.parity import default_sizes, make_inputs, pixel_roles, size_label
from ..spec.io_names import dim_roles

#: coarser multiples of the patch tried, as factors
_FACTORS = (1, 2, 4, 8)


class SpecializedExportError(ValueError):
    """The graph's pixel dims are symbolic, but it runs at no size the probe tried."""


def probe_pixel_sizes(model, io: dict, *, log=print) -> dict:
    """`io` (describe_io's) with each pixel dim's `multiple` (and `min`) raised to the
    coarsest step the original graph needs; `io` itself when it runs at whole patches.
    Raises SpecializedExportError when it runs at none of the multiples tried."""
    if not pixel_roles(io):
        return io
    from .simplify import ort_session
    session = ort_session(model, spin=False, quiet=True)
    first_failure = None
    for factor in _FACTORS:
        scaled = _scaled(io, factor)
        sizes = default_sizes(scaled)[:2]
        if len(sizes) < 2:
            break
        failure = _failure(session, scaled, sizes)
        if failure is None:
            if factor > 1:
                log(f"  sizes: the graph runs only at multiples of {_steps(scaled)} pixels (at {_steps(io)} "
                    f"onnxruntime fails: {first_failure}); the bundle takes those multiples")
            return scaled
        first_failure = first_failure or failure
    raise SpecializedExportError(_refusal(io, first_failure))


def _scaled(io: dict, factor: int) -> dict:
    scaled = copy.deepcopy(io)
    for info in scaled["dims"].values():
        if "multiple" in info and factor > 1:
            info["multiple"] *= factor
            info["min"] = max(info["min"], info["multiple"])
    return scaled


def _failure(session, io: dict, sizes: list[dict]) -> str | None:
    """onnxruntime's words at the first of `sizes` where the graph fails, or None."""
    from .simplify import run_failure
    for sizes_at in sizes:
        words = run_failure(session, make_inputs(io["inputs"], sizes=sizes_at, dim_roles=dim_roles(io)))
        if words is not None:
            return f"at {size_label(sizes_at)}: {words}"
    return None


def _steps(io: dict) -> str:
    return " x ".join(str(info["multiple"]) for info in io["dims"].values() if "multiple" in info)


_LETTER = {"batch": "1", "frames": "T", "height": "H", "width": "W"}


def _refusal(io: dict, failure: str | None) -> str:
    pixels = next(i for i in io["inputs"]
                  if any(isinstance(d, str) and "multiple" in io["dims"].get(d, {}) for d in i["dims"]))
    pinned = "x".join(str(d) if isinstance(d, int) else _LETTER.get(io["dims"].get(d, {}).get("role"), "N")
                      for d in pixels["dims"])
    top = max(_FACTORS) * max(info["multiple"] for info in io["dims"].values() if "multiple" in info)
    return (f"input {pixels['name']!r} has symbolic image dims, but onnxruntime cannot run the graph at two sizes in "
            f"whole patches, nor at any coarser multiple up to {top} pixels (first failure {failure}). "
            "PyTorch's export specialized it to the size it traced (a position table or a reshape fixed to one "
            "grid); a bundle from it would be wrong at every other size. Export once per image size, keep the "
            "size dynamic in the model (transformers' interpolate_pos_encoding=True for ViT, DINOv2 and SigLIP), "
            f"or pin the traced size: --shape {pixels['name']}={pinned}")


def refuse_if_unrunnable(model, io: dict, checks: list[dict]) -> None:
    """Raise SpecializedExportError when the graph has symbolic dims but onnxruntime runs
    the original at none of `checks` (the simplify check's inputs, {name: array})."""
    if not io["dims"] or not checks:
        return
    from .simplify import ort_session, run_failure
    session = ort_session(model, spin=False, quiet=True)
    failures = []
    for feeds in checks:
        words = run_failure(session, feeds)
        if words is None:
            return
        failures.append(f"{_shapes(feeds)}: {words}")
    dynamic = [i for i in io["inputs"] if any(isinstance(d, str) for d in i["dims"])]
    pins = " ".join(f"--shape {i['name']}=" + "x".join(str(d) if isinstance(d, int) else f"<{d}>" for d in i["dims"])
                    for i in dynamic)
    raise SpecializedExportError(
        f"the graph's inputs have symbolic dims ({', '.join(io['dims'])}), but onnxruntime cannot run it at any size "
        f"tried (first failure at {failures[0]}). PyTorch's export specialized it to the size it traced (a position "
        "table, a reshape or an index fixed to one size, as Whisper's encoder adds its whole max_source_positions "
        "table); a bundle from it would be wrong at every other size. Export once per size, or pin the traced "
        f"size, each <dim> at its traced value: {pins}")


def _shapes(feeds: dict) -> str:
    return ", ".join(f"{name} {'x'.join(map(str, a.shape))}" for name, a in feeds.items())
