"""Export: an Encoder to ONNX with dynamic batch and sequence axes and spec metadata."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings

import onnx
import torch

from .graphs import GraphSpec

#: opset of our own exports: TVM's importer has no RotaryEmbedding-23 converter of its own,
#: and at opset 23 the dynamo exporter fuses RoPE into that op.
EXPORT_OPSET = 20
METADATA_PREFIX = "portable_pe."


def example_inputs(spec: GraphSpec, *, batch: int = 2, length: int | None = None, seed: int = 0):
    """Seeded (x, positions) for the spec. Batch 2 keeps torch.export from specializing B=1."""
    length = spec.example_length if length is None else length
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, spec.model.d_model, generator=gen)
    return x, torch.arange(length, dtype=torch.int64)


def export_onnx(spec: GraphSpec, *, opset: int = EXPORT_OPSET, verbose: bool = False) -> onnx.ModelProto:
    """The spec's encoder as ONNX: inputs x (batch, seq, D) float32 and positions (seq,) int64.

    The Dim names become the ONNX dim_params, so the graph reads (batch, seq, D)."""
    model = spec.build()
    batch = torch.export.Dim("batch", min=1, max=spec.max_batch)
    seq = torch.export.Dim("seq", min=1, max=spec.max_length)
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    logging.getLogger("torch.onnx").setLevel(logging.INFO if verbose else logging.ERROR)
    with quiet, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, example_inputs(spec), dynamo=True, opset_version=opset,
            input_names=["x", "positions"], output_names=["hidden"],
            dynamic_shapes={"x": {0: batch, 1: seq}, "positions": {0: seq}}, verbose=False)
    proto = program.model_proto
    set_metadata(proto, {"graph": spec.name, "encoding": spec.encoding, "spec": json.dumps(spec.to_dict())})
    return proto


def set_metadata(model: onnx.ModelProto, entries: dict[str, str]) -> None:
    keep = [p for p in model.metadata_props if p.key.removeprefix(METADATA_PREFIX) not in entries]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in entries.items():
        model.metadata_props.add(key=METADATA_PREFIX + key, value=value)


def get_metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key.removeprefix(METADATA_PREFIX): p.value for p in model.metadata_props
            if p.key.startswith(METADATA_PREFIX)}
