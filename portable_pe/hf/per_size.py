"""Tiny encoders of transformers' own classes whose export holds one size: exported per size.

Each entry keeps the part that fixes the size (random weights, no download):

- Qwen2.5-VL's vision tower (``Qwen2_5_VisionTransformerPretrainedModel``) takes
  flattened patches ``[t*h*w, 3*2*p*p]`` and ``grid_thw`` ``[[t, h, w]]``; its size is
  the grid. Its windows, rotary positions and attention segments are computed from
  ``grid_thw``'s values (``.tolist()``, and the eager attention splits the sequence with
  ``torch.split(lengths.tolist())``), so one graph holds one grid: TorchScript bakes the
  traced grid and drops ``grid_thw`` from the graph's inputs; torch.export stops
  (GuardOnDataDependentSymNode). Output: the merged tokens (``pooler_output``).
- Llama-4's vision model (``Llama4VisionModel``) adds a learned position table of
  ``(image_size / patch) ** 2 + 1`` rows and a rotary table of the same grid, without
  resizing; its size is the image side, one model (config) per side. torch.export keeps
  the sides symbolic and the tables fixed; TorchScript cannot export its complex RoPE.
- Whisper's encoder (``WhisperEncoder``) adds its whole ``max_source_positions`` table to
  the frames and transformers checks ``frames == 2 * max_source_positions``; its size is
  the frame count, one model (config) per count.

``export_per_size`` writes one size's graph (every dim static: what the compile takes as
it is), or with ``dynamic=True`` the export a user would try first (the size axes
symbolic), which the compile refuses (compile/size_probe.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

D, HEADS, LAYERS = 32, 4, 2
EXPORTERS = ("torchscript", "dynamo")


@dataclass(frozen=True)
class PerSizeArch:
    #: the sizes run: the traced one (of the dynamic export) first
    sizes: tuple
    #: why one export holds one size
    why: str
    #: size -> the torch module (inputs -> the output), built on first use
    build: Callable
    #: (size, seed) -> {input name: array}
    inputs: Callable
    #: input name -> {axis: dim name}: the size axes a dynamic export leaves symbolic
    dynamic_axes: dict
    #: what a size is: "grid" (t, h, w), "image" (a side in pixels), "frames"
    unit: str
    #: torch.export's size dims are multiples of it (the stem's stride)
    step: int = 1
    output: str = "last_hidden_state"

    def label(self, size) -> str:
        """grid 1x8x12, 48x48, 32 frames"""
        if self.unit == "grid":
            return "grid " + "x".join(map(str, size))
        return f"{size}x{size}" if self.unit == "image" else f"{size} frames"


def _qwen_build(grid):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    config = transformers.Qwen2_5_VLVisionConfig(
        depth=LAYERS, hidden_size=D, num_heads=HEADS, intermediate_size=64, out_hidden_size=D, patch_size=4,
        spatial_merge_size=2, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1])
    torch.manual_seed(0)
    tower = transformers.Qwen2_5_VisionTransformerPretrainedModel(config).eval()

    class MergedTokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tower = tower

        def forward(self, hidden_states, grid_thw):
            return self.tower(hidden_states, grid_thw).pooler_output  # (t*h*w/4, D)

    return MergedTokens().eval()


def _qwen_inputs(grid, seed):
    t, h, w = grid
    rng = np.random.default_rng(seed)
    return {"hidden_states": rng.standard_normal((t * h * w, 3 * 2 * 4 * 4)).astype(np.float32),
            "grid_thw": np.array([grid], np.int64)}


def _llama4_build(side):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    config = transformers.Llama4VisionConfig(
        hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=4 * D,
        vision_output_dim=D, image_size=side, patch_size=8, projector_input_dim=D, projector_output_dim=D,
        initializer_range=0.1)  # outputs of order 1 (0.03 at the default 0.02)
    torch.manual_seed(0)
    return _LastHidden(transformers.Llama4VisionModel(config).eval(), "pixel_values")


def _pixels(side, seed):
    return {"pixel_values": np.random.default_rng(seed).standard_normal((1, 3, side, side)).astype(np.float32)}


_MELS = 16


def _whisper_build(frames):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from transformers.models.whisper.modeling_whisper import WhisperEncoder  # pylint: disable=import-outside-toplevel
    config = transformers.WhisperConfig(d_model=D, encoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                        encoder_ffn_dim=64, num_mel_bins=_MELS, max_source_positions=frames // 2)
    torch.manual_seed(0)
    return _LastHidden(WhisperEncoder(config).eval(), "input_features")


def _features(frames, seed):
    return {"input_features": np.random.default_rng(seed).standard_normal((1, _MELS, frames)).astype(np.float32)}


def _LastHidden(model, name: str):  # pylint: disable=invalid-name
    """input `name` -> last_hidden_state (a torch.nn.Module made on use: this module imports without torch)."""
    import torch  # pylint: disable=import-outside-toplevel

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(**{name: x}).last_hidden_state

    return LastHidden().eval()


PER_SIZE_ARCHITECTURES = {
    "qwen2_5_vl": PerSizeArch(
        sizes=((1, 8, 8), (1, 6, 10), (1, 12, 16)), build=_qwen_build, inputs=_qwen_inputs,
        dynamic_axes={"hidden_states": {0: "patches"}}, unit="grid", step=4, output="image_embeds",
        why="windows, rotary positions and attention segments are computed from grid_thw's values "
            "(.tolist(), torch.split by value)"),
    "llama4": PerSizeArch(
        sizes=(32, 48, 64), build=_llama4_build, inputs=_pixels,
        dynamic_axes={"pixel_values": {2: "H", 3: "W"}}, unit="image", step=8,
        why="learned position table and RoPE table of config.image_size, added without resizing"),
    "whisper": PerSizeArch(
        sizes=(32, 24, 48), build=_whisper_build, inputs=_features,
        dynamic_axes={"input_features": {2: "frames"}}, unit="frames", step=2,
        why="adds its whole max_source_positions table; transformers checks frames == 2 * max_source_positions"),
}


def torch_output(module, feeds: dict) -> np.ndarray:
    import torch  # pylint: disable=import-outside-toplevel
    with torch.no_grad():
        return module(*(torch.from_numpy(a) for a in feeds.values())).numpy()


def export_per_size(name: str, size, path: str | Path, *, exporter: str = "torchscript",
                    dynamic: bool = False) -> tuple[object, Path]:
    """(the torch module at `size`, the written path): `name`'s tiny model exported at
    `size` with every dim static, or with its size axes symbolic (``dynamic=True``)."""
    import torch  # pylint: disable=import-outside-toplevel
    if name not in PER_SIZE_ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(PER_SIZE_ARCHITECTURES)}")
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    arch = PER_SIZE_ARCHITECTURES[name]
    module = arch.build(size)
    feeds = arch.inputs(size, 0)
    example = tuple(torch.from_numpy(a) for a in feeds.values())
    path = Path(path)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            shapes = tuple({axis: arch.step * torch.export.Dim(dim, min=1, max=256) for axis, dim in arch.dynamic_axes[n].items()}
                           if dynamic and n in arch.dynamic_axes else None for n in feeds)
            torch.onnx.export(module, example, str(path), dynamo=True, opset_version=18,
                              dynamic_shapes=shapes if dynamic else None, input_names=list(feeds),
                              output_names=[arch.output], external_data=False, verbose=False)
        else:
            torch.onnx.export(module, example, str(path), dynamo=False, opset_version=17, input_names=list(feeds),
                              output_names=[arch.output], dynamic_axes=arch.dynamic_axes if dynamic else None)
    return module, path
