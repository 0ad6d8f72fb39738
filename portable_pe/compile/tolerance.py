"""The tolerance a bundle is judged by, decided here from what the stages did.

The reference is always the float32 model (PyTorch, or onnxruntime on the float graph),
so a bundle whose float32 outputs went through lower precision is judged by that
precision's row of parity.TOLERANCES, the one with the largest error wins:

    npu (report "npu")              its NPU dtype's row: "int8", or "float16"
    --precision int8 ("quantization")  "int8_linear": the constant-weight matmuls in int8
    --precision bf16 ("bf16")       "bf16_linear": the constant-weight matmuls in bf16
    --pe-tables int8 ("pe_tables")  "int8_tables", when the encoding stores tables
    otherwise                       "float32"

and otherwise the target's own overrides (targets/<name>.toml [tolerance]) on top.
"""

from __future__ import annotations

from ..run.parity import TOLERANCES, tolerance_for


def float32_row(report: dict) -> str:
    """The TOLERANCES row float32 outputs are judged by, from the manifest sections."""
    if "npu" in report:
        return "int8" if report["npu"]["dtype"] == "int8" else "float16"
    if "quantization" in report:
        return "int8_linear"
    if "bf16" in report:
        return "bf16_linear"
    if report.get("pe_tables", {}).get("tables"):
        return "int8_tables"
    return "float32"


def bundle_tolerance(report: dict, output_dtypes, target_overrides: dict) -> dict[str, dict]:
    """{dtype: tolerance} for the bundle's outputs, resolved so its runner needs no table."""
    overrides = dict(target_overrides)
    row = float32_row(report)
    if row != "float32":  # the precision's row replaces the float32 one as a whole
        overrides["float32"] = dict(TOLERANCES[row])
    return {dtype: tolerance_for(dtype, overrides) for dtype in output_dtypes}
