"""The float graph's constant-weight matmuls quantized by onnxruntime's static quantizer
(QDQ format), the way an onnxruntime user quantizes for CPU, with per-channel weights.

Settings, each for a reason:
* QDQ, int8 activations and weights: onnxruntime's defaults (its recommended S8S8 QDQ);
* per_channel=True: one scale per output channel of each weight;
* MinMax calibration: the widest range seen (clipping costs more than resolution here);
* ``reduce_range`` where the target's int8 kernel needs it (x86 without VNNI: weights
  within +-64, int8_isa.reduces_weight_range): onnxruntime's option for those CPUs, which
  keeps its own U8S8 kernels exact on the same graph;
* matmul outputs not quantized (OpTypesToExcludeOutputQuantization): by default the
  quantizer adds a Q/DQ pair on every matmul output, which rounds the float result to
  int8 before the bias and residual for no kernel's benefit;
* only MatMul nodes whose second input is a constant: activation x activation matmuls
  (attention) stay float (see quant/__init__.py).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx

from .calibration import FeedReader


def weight_matmuls(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(names of MatMul nodes with a constant weight, names of the other MatMul nodes)."""
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    with_weight, other = [], []
    for node in model.graph.node:
        if node.op_type == "MatMul":
            (with_weight if node.input[1] in constants else other).append(node.name)
    return with_weight, other


def quantize_linears(model: onnx.ModelProto, feeds: list[dict], *,
                     reduce_range: bool = False) -> tuple[onnx.ModelProto, dict]:
    """The QDQ int8 graph and a report (which matmuls, calibration, settings);
    ``reduce_range``: weights quantized to 7 bits (within +-64), not 8."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    model = _named(model)
    nodes, kept = weight_matmuls(model)
    if not nodes:
        raise ValueError("--precision int8: the graph has no MatMul with a constant weight to quantize")
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer warns about pre-processing on every call
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
            onnx.save(model, src)
            quantize_static(str(src), str(dst), FeedReader(feeds), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                            nodes_to_quantize=nodes, op_types_to_quantize=["MatMul"],
                            calibrate_method=CalibrationMethod.MinMax, reduce_range=reduce_range,
                            extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"]})
            quantized = onnx.load(str(dst))
    finally:
        logging.getLogger().setLevel(quiet)
    weights = ("int8 within +-64 (7 bits: reduce_range), symmetric, per output channel" if reduce_range
               else "int8, symmetric, per output channel")
    report = {"format": "QDQ", "weights": weights, "activations": "int8, per tensor",
              "calibration": "MinMax", "matmuls_int8": len(nodes), "matmuls_float": len(kept),
              "float_matmuls": kept}
    return quantized, report


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes all have names (nodes_to_quantize selects by name)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    seen = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return model
