"""Static int8 quantization with onnxruntime's tools: QDQ format, per-channel int8
weights, per-tensor int8 activations calibrated on seeded inputs.

Calibration uses seeds 1.. so the accuracy check (seed 0, the parity harness's seed)
never sees the calibration data.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx

_SKIP = {"QuantizeLinear", "DequantizeLinear", "Constant"}
#: onnxruntime.quantization logs these on the root logger for every graph we hand it; they
#: are advice (run its shape pre-processing: our graph is already simplified with static
#: shapes) and notes (a 1-D LayerNorm weight falls back from per-channel to per-tensor),
#: never failures, and only these exact messages are dropped
_ORT_ADVICE = ("Please consider to run pre-processing before quantization",
               "Please consider pre-processing before quantization", "Axis 1 is out-of-range for weight")


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ORT_ADVICE)


class SeededReader:
    """onnxruntime CalibrationDataReader over `samples` seeded standard-normal inputs."""

    def __init__(self, model: onnx.ModelProto, *, samples: int, first_seed: int = 1):
        inits = {i.name for i in model.graph.initializer}
        specs = [(vi.name, [d.dim_value for d in vi.type.tensor_type.shape.dim],
                  onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
                 for vi in model.graph.input if vi.name not in inits]
        for name, shape, dtype in specs:
            if dtype.kind != "f" or 0 in shape:
                raise ValueError(f"calibration needs static float inputs; input {name!r} is {dtype}{shape}")
        self._feeds = iter([{name: np.random.default_rng(first_seed + i).standard_normal(shape).astype(dtype)
                             for name, shape, dtype in specs} for i in range(samples)])

    def get_next(self):
        return next(self._feeds, None)


def quantize_int8(model: onnx.ModelProto, profile) -> onnx.ModelProto:
    scheme = profile.quantization
    if scheme.get("format", "QDQ") != "QDQ" or scheme.get("weights", "int8") != "int8" \
            or scheme.get("activations", "int8") != "int8":
        raise ValueError(f"profile {profile.name}: only QDQ with int8 weights and activations is implemented, "
                         f"got {scheme}")
    op_types = sorted({n.op_type for n in model.graph.node} - _SKIP)
    advice = _DropAdvice()
    logging.getLogger().addFilter(advice)
    try:
        return _quantize(model, scheme, op_types)
    finally:
        logging.getLogger().removeFilter(advice)


def _quantize(model: onnx.ModelProto, scheme: dict, op_types: list[str]) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, src)
        quantize_static(
            str(src), str(dst), SeededReader(model, samples=int(scheme.get("calibration_samples", 8))),
            quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            per_channel=bool(scheme.get("per_channel", True)), op_types_to_quantize=op_types,
            calibrate_method=CalibrationMethod.MinMax,
            # every op, not only those with a QDQ rule: an NPU runs the whole graph in int8
            extra_options={"ForceQuantizeNoInputCheck": True, "WeightSymmetric": True,
                           "ActivationSymmetric": False})
        return onnx.load(str(dst))
