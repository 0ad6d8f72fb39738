"""Export: an Encoder to ONNX with dynamic batch and sequence axes and spec metadata."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import warnings
from pathlib import Path

import onnx
import torch

from ..spec.graphs import GraphSpec
from ..spec.io_names import BATCH, DYNAMIC_AXES, INPUT_NAMES, OUTPUT_NAMES, PIXELS, SEQ, vision_axes
from ..bundle.paths import write_file_atomically

#: opset of our own exports: TVM's importer has no RotaryEmbedding-23 converter of its own,
#: and at opset 23 the dynamo exporter fuses RoPE into that op.
EXPORT_OPSET = 20
METADATA_PREFIX = "portable_pe."


def example_inputs(spec: GraphSpec, *, batch: int = 2, length: int | None = None, seed: int = 0):
    """Seeded (x, positions) for the spec, or (pixel_values,) of its example_size for a
    vision spec. Batch 2 keeps torch.export from specializing B=1."""
    gen = torch.Generator().manual_seed(seed)
    if spec.vision is not None:
        return (torch.randn(batch, spec.vision.channels, *spec.example_size, generator=gen),)
    length = spec.example_length if length is None else length
    x = torch.randn(batch, length, spec.model.d_model, generator=gen)
    return x, torch.arange(length, dtype=torch.int64)


def _io(spec: GraphSpec) -> tuple[list[str], dict]:
    """(input names, {input: {axis: dim name}}) of the spec's export."""
    if spec.vision is not None:
        return [PIXELS], vision_axes(spec)
    return list(INPUT_NAMES), DYNAMIC_AXES


#: exporters export_onnx can use. "torchscript" is torch.onnx's tracing exporter:
#: deprecated since torch 2.9 but still in the pinned torch, and 13x faster here
#: (0.5 s against 6.5 s for the rope encoder on 2 cores, most of a first compile). After
#: onnxsim and TVM's fusion both give the same kernels, but for hybrid's RoPE kernels (see
#: README). "dynamo" is torch.export-based.
EXPORTERS = ("torchscript", "dynamo")
DEFAULT_EXPORTER = "torchscript"


def export_onnx(spec: GraphSpec, *, opset: int = EXPORT_OPSET, exporter: str = DEFAULT_EXPORTER,
                verbose: bool = False) -> onnx.ModelProto:
    """The spec's encoder as ONNX: inputs x (batch, seq, D) float32 and positions (seq,) int64,
    with batch and seq dynamic (dim_params "batch" and "seq").

    With exporter="torchscript", a torch that no longer has that exporter (or fails
    in it) falls back to "dynamo", with a warning."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}: expected one of {', '.join(EXPORTERS)}")
    model = spec.build()
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    logging.getLogger("torch.onnx").setLevel(logging.INFO if verbose else logging.ERROR)
    with quiet, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = None
        if exporter == "torchscript":
            try:
                proto = _export_torchscript(spec, model, opset)
            except Exception as err:  # pylint: disable=broad-except  # removed or failing: try dynamo
                logging.getLogger(__name__).warning(
                    "torchscript export of %s failed (%s); using the dynamo exporter",
                    spec.name, str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
        if proto is None:
            proto = _export_dynamo(spec, model, opset)
    if spec.vision is not None:  # (batch, tokens, d_model): the exporters leave the last dim a name too
        dims = proto.graph.output[0].type.tensor_type.shape.dim
        dims[2].Clear()
        dims[2].dim_value = spec.model.d_model
    set_metadata(proto, {"graph": spec.name, "encoding": spec.encoding, "spec": json.dumps(spec.to_dict())})
    return proto


def _export_torchscript(spec: GraphSpec, model, opset: int) -> onnx.ModelProto:
    buffer = io.BytesIO()
    names, axes = _io(spec)
    torch.onnx.export(model, example_inputs(spec), buffer, dynamo=False, opset_version=opset,
                      input_names=names, output_names=list(OUTPUT_NAMES), dynamic_axes=axes)
    return _constants_as_initializers(onnx.load_from_string(buffer.getvalue()))


def _constants_as_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Tensor-valued Constant nodes as initializers, as the dynamo exporter writes them.

    The tracing exporter writes tensors made in forward() (RoPE's inverse frequencies,
    the attention scale) as Constant nodes, and onnxsim keeps them so; but table folding
    for the NPU and int8 tables look for initializers."""
    graph = model.graph
    keep = []
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1 \
                and node.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    return model


def _export_dynamo(spec: GraphSpec, model, opset: int) -> onnx.ModelProto:
    dims = {BATCH: torch.export.Dim(BATCH, min=1, max=spec.max_batch),
            SEQ: torch.export.Dim(SEQ, min=1, max=spec.max_length)}
    if spec.vision is not None:  # each pixel axis a multiple of its patch: patch * (patches along it)
        from ..spec.io_names import pixel_bounds
        for role, info in pixel_bounds(spec).items():
            dims[role] = info["multiple"] * torch.export.Dim(f"{role}_patches", min=1, max=info["max"] // info["multiple"])
    names, io_axes = _io(spec)
    program = torch.onnx.export(
        model, example_inputs(spec), dynamo=True, opset_version=opset,
        input_names=names, output_names=list(OUTPUT_NAMES),
        dynamic_shapes={name: {axis: dims[role] for axis, role in axes.items()} for name, axes in io_axes.items()
                        if name in names},
        verbose=False)
    return program.model_proto


#: where exports are cached; set it empty to turn the cache off
CACHE_ENV = "PORTABLE_PE_CACHE_DIR"
# The modules an encoder's export is a function of, besides the spec and the versions.
_EXPORT_SOURCES = ("spec/model.py", "spec/position.py", "spec/encodings.py", "spec/grid_encodings.py",
                   "spec/vision.py", "spec/windows.py", "compile/export.py", "spec/io_names.py")


def cache_dir() -> Path | None:
    """$PORTABLE_PE_CACHE_DIR, else $XDG_CACHE_HOME/portable-pe (~/.cache/portable-pe);
    None when the variable is set but empty."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "portable-pe"


def export_key(spec: GraphSpec, opset: int = EXPORT_OPSET, exporter: str = DEFAULT_EXPORTER) -> str:
    """A digest of everything the exported ONNX depends on: the spec (its weights are a
    pure function of it), the opset, the exporter, torch / onnx / onnxscript versions
    and the source of the modules that define and export the encoder."""
    from importlib.metadata import version  # importing onnxscript itself takes ~0.5 s
    h = hashlib.sha256()
    h.update(json.dumps({"spec": spec.to_dict(), "opset": opset, "exporter": exporter, "torch": torch.__version__,
                         "onnx": onnx.__version__, "onnxscript": version("onnxscript")},
                        sort_keys=True).encode())
    here = Path(__file__).resolve().parent.parent  # the package
    for name in _EXPORT_SOURCES:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:32]


def cache_entry(spec: GraphSpec, opset: int = EXPORT_OPSET, exporter: str = DEFAULT_EXPORTER) -> Path | None:
    """Where the cache keeps this export; None with the cache off."""
    folder = cache_dir()
    return folder / "onnx" / f"{spec.name}-{exporter}-{export_key(spec, opset, exporter)}.onnx" if folder else None


def export_onnx_cached(spec: GraphSpec, *, opset: int = EXPORT_OPSET,
                       exporter: str = DEFAULT_EXPORTER) -> tuple[onnx.ModelProto, bool]:
    """export_onnx through the on-disk cache: (model, whether it came from the cache).

    The dynamo export takes 7-7.5 s of a 12-13 s compile of the rope encoder on a 2-core
    machine (the torchscript one 0.5 s), and gives the same model every time for the
    same key. A cache entry is written atomically; one that fails to load is exported
    again and replaced."""
    path = cache_entry(spec, opset, exporter)
    if path is not None and path.is_file():
        try:
            return onnx.load(str(path)), True
        except Exception:  # pylint: disable=broad-except  # a damaged entry: export again
            pass
    model = export_onnx(spec, opset=opset, exporter=exporter)
    if path is not None:
        try:  # atomically, and no temporary file left behind by an error or a Ctrl-C
            write_file_atomically(path, model.SerializeToString())
        except OSError as err:  # a read-only home must not fail the compile
            logging.getLogger(__name__).warning("export cache not written (%s): %s", path, err)
    return model, False


def set_metadata(model: onnx.ModelProto, entries: dict[str, str]) -> None:
    keep = [p for p in model.metadata_props if p.key.removeprefix(METADATA_PREFIX) not in entries]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in entries.items():
        model.metadata_props.add(key=METADATA_PREFIX + key, value=value)


def get_metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key.removeprefix(METADATA_PREFIX): p.value for p in model.metadata_props
            if p.key.startswith(METADATA_PREFIX)}
