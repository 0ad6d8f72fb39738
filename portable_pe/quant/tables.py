"""int8 position tables with per-row scales (`--pe-tables int8`), and what they cost.

A row r of a table T is stored as q[r] = round(T[r] / s[r]) in int8 with s[r] = max|T[r]| / 127,
so each row keeps its own range (a T5 bucket row or a sin/cos row at one position).
Memory: 1 byte per entry + 4 bytes per row instead of 4 bytes per entry. Error: at most
s[r] / 2 per entry.

`measure` materializes each encoding's tables at a length and reports memory saved and
error added. `quantize_onnx_tables` stores the tables a dynamic CPU graph actually keeps
(learned absolute, T5 bucket table) as int8 + DequantizeLinear(axis=0); encodings computed
from positions at run time (sinusoidal, RoPE, ALiBi) keep no table there to quantize.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..spec.io_names import POSITIONS


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 table, float32 per-row scales) for a 2-D float table."""
    if table.ndim != 2:
        raise ValueError(f"per-row quantization needs a 2-D table, got shape {list(table.shape)}")
    peak = np.abs(table).max(axis=1).astype(np.float32)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(table / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * scale[:, None]


def position_tables(spec, length: int) -> dict[str, np.ndarray]:
    """Each position table of the spec's encoding at `length`, as 2-D float32 arrays."""
    import torch
    from ..spec.encodings import ALiBi, LearnedAbsolute, RelativeBias, Rotary, Sinusoidal
    pe, pos, tables = spec.build().pe, torch.arange(length), {}
    parts = dict(pe.parts) if hasattr(pe, "parts") else {spec.encoding: pe}
    with torch.no_grad():
        for name, part in parts.items():
            if isinstance(part, Sinusoidal):
                tables[f"{name}/table"] = part.embed(torch.zeros(length, spec.model.d_model), pos)
            elif isinstance(part, LearnedAbsolute):
                tables[f"{name}/table"] = part.table.weight
            elif isinstance(part, Rotary):
                angles = pos.float()[:, None] * part.theta
                tables[f"{name}/cos"], tables[f"{name}/sin"] = angles.cos(), angles.sin()
            elif isinstance(part, RelativeBias):
                tables[f"{name}/bucket_table"] = part.table.weight
                tables[f"{name}/bias"] = part.bias(pos).flatten(0, 1)  # (H*T, T)
            elif isinstance(part, ALiBi):
                tables[f"{name}/bias"] = part.bias(pos).flatten(0, 1)  # (H*T, T)
    return {k: v.detach().numpy().astype(np.float32) for k, v in tables.items()}


def measure(spec, length: int) -> list[dict]:
    """Memory saved and error added by int8 per-row tables, per table of the encoding."""
    rows = []
    for name, table in position_tables(spec, length).items():
        q, scale = quantize_rows(table)
        err = np.abs(dequantize_rows(q, scale) - table)
        fp32, int8 = table.nbytes, q.nbytes + scale.nbytes
        rows.append({"graph": spec.name, "table": name, "shape": list(table.shape), "bytes_fp32": fp32,
                     "bytes_int8": int8, "saved": 1 - int8 / fp32, "max_abs_err": float(err.max()),
                     "max_rel_err": float(err.max() / max(np.abs(table).max(), 1e-30))})
    return rows


def _depends_on(model: onnx.ModelProto, source: str) -> set[str]:
    reached = {source}
    for node in model.graph.node:  # graph order is topological
        if any(i in reached for i in node.input):
            reached.update(node.output)
    return reached


def quantize_onnx_tables(model: onnx.ModelProto, *, positions: str = POSITIONS) -> tuple[onnx.ModelProto, list[dict]]:
    """Store every float table that is gathered by position-derived indices as int8 rows."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name: i for i in model.graph.initializer}
    from_positions = _depends_on(model, positions)
    report, new_nodes = [], []
    for node in model.graph.node:
        data = node.input[0] if node.op_type == "Gather" else None
        if (data in inits and node.input[1] in from_positions and
                inits[data].data_type == onnx.TensorProto.FLOAT and len(inits[data].dims) == 2):
            table = numpy_helper.to_array(inits[data])
            q, scale = quantize_rows(table)
            model.graph.initializer.remove(inits.pop(data))
            model.graph.initializer.extend([numpy_helper.from_array(q, data + "_int8"),
                                            numpy_helper.from_array(scale, data + "_scale"),
                                            numpy_helper.from_array(np.zeros(len(scale), np.int8), data + "_zp")])
            new_nodes.append(helper.make_node("DequantizeLinear", [data + "_int8", data + "_scale", data + "_zp"],
                                              [data], name=data + "_dequantize", axis=0))
            report.append({"table": data, "shape": list(table.shape), "bytes_fp32": table.nbytes,
                           "bytes_int8": q.nbytes + scale.nbytes,
                           "max_abs_err": float(np.abs(dequantize_rows(q, scale) - table).max())})
    nodes = new_nodes + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, report
