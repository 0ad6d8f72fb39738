"""Exports whose dims are symbolic but fixed to the traced size, refused with the fix.

Small ONNX graphs written by hand in the shapes transformers' exports take (no PyTorch):
an image whose stem is no Conv (Llama-4's vision model unfolds its patches) and a
sequence input added to a table of one length (Whisper's encoder adds its whole
max_source_positions table to the frames).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from portable_pe.compile.pipeline import prepare
from portable_pe.compile.size_probe import SpecializedExportError
from portable_pe.spec.io_names import describe_io
from portable_pe.spec.pixel_inputs import named_multiple


def _graph(name: str, dims: list, table_shape: tuple) -> onnx.ModelProto:
    """input `name` of `dims` + a constant table of `table_shape` -> out."""
    table = numpy_helper.from_array(np.ones(table_shape, np.float32), "table")
    graph = helper.make_graph([helper.make_node("Add", [name, "table"], ["out"])], "fixed",
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None] * len(dims))], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def test_the_step_torch_export_named_a_dim_is_read():
    assert [named_multiple(d) for d in ("8*h", "h_x8", "14 * w", "H", "s53", "dim_x")] == [8, 8, 14, 1, 1, 1]


def test_an_image_with_no_conv_stem_has_image_dims():
    """(1, 3, 8*h, 8*w) into no Conv: height and width in steps of 8, not two sequence lengths."""
    model = _graph("pixel_values", [1, 3, "8*h", "8*w"], (1, 3, 1, 1))
    dims = describe_io(model, None)["dims"]
    assert {d: (i["role"], i["multiple"]) for d, i in dims.items()} == {"8*h": ("height", 8), "8*w": ("width", 8)}


def test_an_image_fixed_to_the_traced_size_is_refused(tmp_path):
    """A table of the traced 16 x 16 image: onnxruntime runs no other size."""
    path = _save(_graph("pixel_values", [1, 3, "8*h", "8*w"], (1, 3, 16, 16)), tmp_path / "m.onnx")
    with pytest.raises(SpecializedExportError, match=r"--shape pixel_values=1x3xHxW"):
        prepare(path, through="simplify", log=lambda m: None)


def test_a_sequence_fixed_to_the_traced_length_is_refused_with_the_fix(tmp_path):
    path = _save(_graph("input_features", [1, 4, "frames"], (4, 16)), tmp_path / "m.onnx")
    with pytest.raises(SpecializedExportError) as err:
        prepare(path, through="simplify", log=lambda m: None)
    text = str(err.value)
    assert "Attempting to broadcast" in text and "--shape input_features=1x4x<frames>" in text
    # pinned at the traced length, the same file goes through
    st = prepare(path, through="simplify", shapes={"input_features": [1, 4, 16]}, log=lambda m: None)
    assert not st.io["dims"]


def test_a_graph_that_runs_at_some_length_is_not_refused(tmp_path):
    path = _save(_graph("x", [1, "T", 4], (1, 1, 4)), tmp_path / "m.onnx")
    st = prepare(path, through="simplify", log=lambda m: None)
    assert [i["role"] for i in st.io["dims"].values()] == ["seq"]
