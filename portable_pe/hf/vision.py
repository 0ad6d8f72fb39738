"""Tiny vision encoders of transformers' own classes, exported with a dynamic image size.

Each entry names the config and model classes and the few fields that make it tiny (2
layers, width 32, patch 8 on 32 x 32 images) while keeping its position scheme: ViT's and
SigLIP's learned table (resized to the grid with ``interpolate_pos_encoding``), DINOv2's
resized table, BEiT's 2D relative bias, DINOv3's and Pixtral's 2D RoPE, Swin's windowed
relative bias. ``export_vision`` writes ``pixel_values [1, 3, H, W] -> last_hidden_state``
with H and W dynamic, as a user would hand it to ``portable-pe compile``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

D, HEADS, LAYERS, FF, PATCH, IMAGE = 32, 4, 2, 64, 8, 32
EXPORTERS = ("torchscript", "dynamo")


@dataclass(frozen=True)
class VisionArch:
    config: str
    model: str
    positions: str  # learned_2d | rel_bias_2d | rope_2d | window_bias
    options: dict = field(default_factory=dict)
    #: the forward takes interpolate_pos_encoding (a learned table resized to the grid)
    interpolates: bool = False
    patch: int = PATCH

    def build(self, overrides: dict | None = None):
        """The model with random weights (seed 0): the tiny config, or the class's own
        defaults updated by `overrides` where given (a full-size model to time)."""
        import torch  # pylint: disable=import-outside-toplevel
        import transformers  # pylint: disable=import-outside-toplevel
        config = getattr(transformers, self.config)(**(self.options if overrides is None else overrides))
        torch.manual_seed(0)
        cls = getattr(transformers, self.model)
        kwargs = {"add_pooling_layer": False} if self.model in ("ViTModel", "BeitModel", "SwinModel") else {}
        return cls(config, **kwargs).eval()


def _vit_like(**extra):
    return {**dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
                   image_size=IMAGE, patch_size=PATCH), **extra}


VISION_ARCHITECTURES = {
    "vit": VisionArch("ViTConfig", "ViTModel", "learned_2d", _vit_like(), interpolates=True),
    "siglip": VisionArch("SiglipVisionConfig", "SiglipVisionModel", "learned_2d", _vit_like(), interpolates=True),
    "dinov2": VisionArch("Dinov2Config", "Dinov2Model", "learned_2d",
                         {k: v for k, v in _vit_like(mlp_ratio=2).items() if k != "intermediate_size"}),
    "beit": VisionArch("BeitConfig", "BeitModel", "rel_bias_2d", _vit_like(use_relative_position_bias=True)),
    "dinov3": VisionArch("DINOv3ViTConfig", "DINOv3ViTModel", "rope_2d", _vit_like()),
    "pixtral": VisionArch("PixtralVisionConfig", "PixtralVisionModel", "rope_2d", _vit_like(image_size=64, head_dim=8)),
    "swin": VisionArch("SwinConfig", "SwinModel", "window_bias",
                       dict(embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=2, image_size=IMAGE,
                            patch_size=4), patch=4),
}


def build_vision(name: str, overrides: dict | None = None):
    if name not in VISION_ARCHITECTURES:
        raise ValueError(f"unknown vision architecture {name!r}; known: {', '.join(VISION_ARCHITECTURES)}")
    return VISION_ARCHITECTURES[name].build(overrides)


class LastHiddenState:
    """pixel_values -> last_hidden_state (a torch.nn.Module made on first use, so that this
    module imports without torch)."""

    def __new__(cls, model, *, interpolate: bool):
        import torch  # pylint: disable=import-outside-toplevel

        class _Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, pixel_values):
                extra = {"interpolate_pos_encoding": True} if interpolate else {}
                return self.model(pixel_values=pixel_values, **extra).last_hidden_state

        return _Wrapped().eval()


def last_hidden_state_model(name: str, overrides: dict | None = None):
    """``name``'s model (build_vision) wrapped as pixel_values -> last_hidden_state, the
    learned table resized to the grid where the class can."""
    return LastHiddenState(build_vision(name, overrides), interpolate=VISION_ARCHITECTURES[name].interpolates)


def export_vision(name: str, path: str | Path, *, exporter: str = "torchscript", overrides: dict | None = None,
                  batch: bool = False) -> tuple[object, Path]:
    """(the wrapped model, the written path): ``name``'s tiny model (or its class's defaults
    with `overrides`, see VisionArch.build) exported with H and W dynamic (TorchScript:
    named H and W; dynamo: multiples of the patch, ``8*h``), and the batch with `batch`
    (TorchScript only)."""
    import torch  # pylint: disable=import-outside-toplevel
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if batch and exporter != "torchscript":
        raise ValueError(f"a dynamic batch is written by the TorchScript exporter here; got exporter {exporter!r}")
    arch = VISION_ARCHITECTURES[name]
    module = last_hidden_state_model(name, overrides)
    image = IMAGE if overrides is None else overrides.get("image_size", IMAGE)
    example = torch.randn(1, 3, image, image, generator=torch.Generator().manual_seed(0))
    path = Path(path)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            side = {2: arch.patch * torch.export.Dim("h", min=1, max=64),
                    3: arch.patch * torch.export.Dim("w", min=1, max=64)}
            torch.onnx.export(module, (example,), str(path), dynamo=True, opset_version=18, dynamic_shapes=(side,),
                              input_names=["pixel_values"], output_names=["last_hidden_state"],
                              external_data=False, verbose=False)
        else:
            torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=17,
                              input_names=["pixel_values"], output_names=["last_hidden_state"],
                              dynamic_axes={"pixel_values": {**({0: "batch"} if batch else {}), 2: "H", 3: "W"},
                                            "last_hidden_state": {**({0: "batch"} if batch else {}), 1: "tokens"}})
    return module, path
