"""Graph specs: graphs/<name>.toml files, the GRAPHS registry, and loading them.

A spec names the encoder (model dims, encoding and its options, weight seed) and its
export bounds. Weights are a pure function of the spec, so a bundle's manifest can
rebuild the PyTorch reference anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .encodings import ENCODINGS
from .model import EncoderConfig, Encoder, build_encoder
from .registry import read_toml, toml_registry

ROOT = Path(__file__).resolve().parent.parent
GRAPHS_DIR = ROOT / "graphs"
DEFAULT_GRAPH = "rope"

_MODEL_KEYS = set(EncoderConfig.__dataclass_fields__)
_TOP_KEYS = {"name", "description", "seed", "model", "encoding", "export"}
_EXPORT_KEYS = {"example_length", "max_length", "max_batch"}


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

    def build(self) -> Encoder:
        return build_encoder(self.model, self.encoding, self.encoding_options, seed=self.seed)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "seed": self.seed,
                "model": asdict(self.model),
                "encoding": {"name": self.encoding, **self.encoding_options},
                "export": {"example_length": self.example_length, "max_length": self.max_length,
                           "max_batch": self.max_batch}}

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "<dict>") -> GraphSpec:
        def fail(msg):
            raise ValueError(f"{source}: {msg}")
        unknown = set(data) - _TOP_KEYS
        if unknown:
            fail(f"unknown key(s) {sorted(unknown)}; valid top-level keys: {sorted(_TOP_KEYS)}")
        for key in ("name", "model", "encoding"):
            if key not in data:
                fail(f"missing required key `{key}`")
        model = data["model"]
        if not isinstance(model, dict) or set(model) - _MODEL_KEYS:
            fail(f"[model] keys must be among {sorted(_MODEL_KEYS)}, got {sorted(model) if isinstance(model, dict) else model!r}")
        encoding = dict(data["encoding"]) if isinstance(data["encoding"], dict) else {"name": data["encoding"]}
        enc_name = encoding.pop("name", None)
        if enc_name not in ENCODINGS:
            fail(f"[encoding] name {enc_name!r} is unknown; valid: {', '.join(ENCODINGS)}")
        export = data.get("export", {})
        if set(export) - _EXPORT_KEYS:
            fail(f"[export] keys must be among {sorted(_EXPORT_KEYS)}, got {sorted(export)}")
        try:
            cfg = EncoderConfig(**model)
        except (TypeError, ValueError) as err:
            fail(f"[model]: {err}")
        spec = cls(name=str(data["name"]), model=cfg, encoding=enc_name, encoding_options=encoding,
                   description=data.get("description", ""), seed=int(data.get("seed", 0)), **export)
        try:  # build once so bad encoding options fail here, naming the file
            encoder = spec.build()
        except ValueError as err:
            fail(str(err))
        if encoder.pe.max_length is not None and spec.max_length > encoder.pe.max_length:
            spec = replace(spec, max_length=encoder.pe.max_length)
        return spec


GRAPHS: dict[str, Path] = toml_registry(GRAPHS_DIR)
#: graphs that exist to be measured against, not deployed (the no-position encoder);
#: loadable by name like a shipped graph, but not in GRAPHS (nor in its tests)
BASELINES: dict[str, Path] = toml_registry(GRAPHS_DIR / "baselines")


def load_graph(name_or_path: str | Path) -> GraphSpec:
    """A shipped graph by name, or a TOML spec by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        known = {**BASELINES, **GRAPHS}
        if str(name_or_path) not in known:
            raise ValueError(f"unknown graph {str(name_or_path)!r}; shipped graphs: {', '.join(GRAPHS)}, "
                             f"baselines: {', '.join(BASELINES)} (or give a .toml spec path or an .onnx file)")
        path = known[str(name_or_path)]
    return GraphSpec.from_dict(read_toml(path, what="graph spec"), source=str(path))
