"""Post-training int8 quantization for CPU targets (``--precision int8``).

    float ONNX graph -> calibrate (seeded inputs, several lengths) -> QDQ ONNX graph
                     -> TVM: dequantize -> matmul -> requantize as integer kernels
                        (cpu_schedule.quant_matmul, cpu_schedule.int8_matmul)

What is int8: every matmul with a constant weight (the q/k/v, output, and feed-forward
projections): weights per output channel (symmetric int8), their input activations per
tensor (int8 with a zero point), calibrated by min/max over seeded inputs.
What stays float32, and why:

* attention's Q·Kᵀ and P·V: both operands are activations whose range moves with the
  input (a static per-tensor scale for the softmax probabilities would cost most of
  their resolution); the fused float attention kernel keeps the scores in cache. The
  compiled kernel may still compute Q·Kᵀ in int8 with scales taken per row at run time
  (x86 without VNNI: cpu_schedule/int8_attention.py), and both products in bf16 on AMX;
* layer norm, softmax, GELU, residual adds and biases: elementwise or row work whose
  cost is memory traffic, not arithmetic (they fuse into the int8 kernels' epilogues);
* position encodings: RoPE cos/sin, T5/ALiBi biases and learned/sinusoidal tables are
  added or multiplied in float, exactly as in the float graph (int8 tables are a
  separate, explicit choice: --pe-tables int8);
* matmul outputs: not re-quantized before the bias and residual (only where the next
  matmul reads them, after the activation).

The QDQ graph is the bundle's model.onnx, so onnxruntime runs the same quantized graph
(same scales) in the parity report and the bench.
"""

from __future__ import annotations

#: --precision choices; a backend lists the ones it builds (backends/*.py PRECISIONS)
PRECISIONS = {
    "fp32": "float32 throughout",
    "int8": "int8 matmuls with constant weights (per-channel weights, per-tensor activations, "
            "calibrated), the rest float32",
    "bf16": "bf16 matmuls with constant weights (weights stored bf16, activations rounded to nearest "
            "even where they are made, float32 accumulation; x86 with AMX-BF16 or AVX512-BF16), the rest float32",
}

__all__ = ["PRECISIONS"]
