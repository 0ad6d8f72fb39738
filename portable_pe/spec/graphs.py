"""Graph specs: graphs/<name>.toml files, the GRAPHS registry, and loading them.

A spec names the encoder (model dims, encoding and its options, weight seed) and its
export bounds. Weights are a pure function of the spec, so a bundle's manifest can
rebuild the PyTorch reference anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .registry import ROOT, read_toml, toml_registry
from .schema import validate_spec

if TYPE_CHECKING:
    from .model import EncoderConfig
    from .vision import VisionConfig

GRAPHS_DIR = ROOT / "graphs"
DEFAULT_GRAPH = "rope"

@dataclass(frozen=True)
class GraphSpec:
    name: str
    model: EncoderConfig
    encoding: str
    encoding_options: dict = field(default_factory=dict)
    description: str = ""
    seed: int = 0
    example_length: int = 16
    max_length: int = 4096
    max_batch: int = 64
    #: a vision graph: its patch stem, and its pixel sizes ([H, W], video [F, H, W])
    vision: VisionConfig | None = None
    example_size: tuple[int, ...] | None = None
    max_size: tuple[int, ...] | None = None

    def build(self):
        """The PyTorch model: an Encoder of token embeddings, or a VisionEncoder of pixels."""
        if self.vision is not None:  # torch: only when a model is built
            from .vision import build_vision_encoder
            return build_vision_encoder(self.model, self.vision, self.encoding, self.encoding_options, seed=self.seed)
        from .model import build_encoder
        return build_encoder(self.model, self.encoding, self.encoding_options, seed=self.seed)

    def to_dict(self) -> dict:
        export = {"example_length": self.example_length, "max_length": self.max_length, "max_batch": self.max_batch}
        if self.vision is not None:
            export.update(example_size=list(self.example_size), max_size=list(self.max_size))
        return {"name": self.name, "description": self.description, "seed": self.seed,
                "model": asdict(self.model),
                **({"vision": asdict(self.vision)} if self.vision is not None else {}),
                "encoding": {"name": self.encoding, **self.encoding_options}, "export": export}

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "<dict>") -> GraphSpec:
        from .model import EncoderConfig
        data = validate_spec(data, source=source)
        encoding = dict(data["encoding"])
        enc_name = encoding.pop("name")
        export = dict(data.get("export", {}))
        try:
            cfg = EncoderConfig(**data["model"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: [model]: {err}") from None
        vision = None
        if "vision" in data:
            from .vision import VisionConfig
            vision = VisionConfig(**data["vision"])
            export.update(example_size=tuple(export["example_size"]), max_size=tuple(export["max_size"]))
        spec = cls(name=str(data["name"]), model=cfg, encoding=enc_name, encoding_options=encoding,
                   description=data.get("description", ""), seed=int(data.get("seed", 0)), vision=vision, **export)
        try:  # build once so bad encoding options fail here, naming the file
            encoder = spec.build()
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
        if encoder.pe.max_length is not None and spec.max_length > encoder.pe.max_length:
            spec = replace(spec, max_length=encoder.pe.max_length)
        return spec


GRAPHS: dict[str, Path] = toml_registry(GRAPHS_DIR)
#: graphs that exist to be measured against, not deployed (the no-position encoder);
#: loadable by name like a shipped graph, but not in GRAPHS (nor in its tests)
BASELINES: dict[str, Path] = toml_registry(GRAPHS_DIR / "baselines")
#: image and video encoders (a [vision] table: pixel_values in): loadable by name like a
#: shipped graph, kept apart from GRAPHS, whose every entry the NPU, bench and guide take
VISION_GRAPHS: dict[str, Path] = toml_registry(GRAPHS_DIR / "vision")


def load_graph(name_or_path: str | Path) -> GraphSpec:
    """A shipped graph by name, or a TOML spec by path."""
    data, source = read_spec(name_or_path)
    return GraphSpec.from_dict(data, source=source)


def read_spec(name_or_path: str | Path) -> tuple[dict, str]:
    """(the spec's table checked against spec_schema, its path): what load_graph builds
    from, without torch, so the CLI refuses a bad spec in a moment."""
    path = Path(name_or_path)
    if not str(name_or_path).strip():
        raise ValueError(f"the graph argument is empty (an unset shell variable?); expected a shipped graph name "
                         f"({', '.join(GRAPHS)}), a .toml spec or an .onnx file")
    if path.suffix != ".toml":
        if path.is_dir():
            raise ValueError(f"{name_or_path} is a folder; expected a shipped graph name ({', '.join(GRAPHS)}), "
                             "a .toml spec or an .onnx file")
        known = {**BASELINES, **VISION_GRAPHS, **GRAPHS}
        if str(name_or_path) not in known:
            raise ValueError(f"unknown graph {str(name_or_path)!r}; shipped graphs: {', '.join(GRAPHS)}, "
                             f"vision graphs: {', '.join(VISION_GRAPHS)}, baselines: {', '.join(BASELINES)} "
                             "(or give a .toml spec path or an .onnx file)")
        path = known[str(name_or_path)]
    return validate_spec(read_toml(path, what="graph spec"), source=str(path)), str(path)
