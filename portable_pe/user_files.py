"""Files a user names on the command line, read one way everywhere.

    require_file(path, what=)   a missing path, a folder or an empty name, each said as such
    load_onnx_file(path)        what compile and inspect both accept (parsed and checked)
    load_npz_inputs(path)       named arrays from numpy.savez output
"""

from __future__ import annotations

import zipfile
from pathlib import Path


def require_file(path: str | Path, *, what: str) -> Path:
    """`path` if it is a file; otherwise an error that says what it is instead."""
    path = Path(path)
    if not str(path).strip():
        raise ValueError(f"the {what} path is empty; expected a file")
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; expected a file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    return path


def load_onnx_file(path: str | Path):
    """The parsed and checked model; an empty, truncated or invalid file is a ValueError."""
    import onnx
    path = require_file(path, what="ONNX file")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is not a valid ONNX model: the file is empty")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:  # onnx raises DecodeError, ValidationError, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} is not a valid ONNX model: {first}") from None
    if not model.graph.node or not model.graph.output:
        raise ValueError(f"{path} is not a valid ONNX model: its graph has no nodes or no outputs")
    initializers = {init.name for init in model.graph.initializer}  # listed as inputs before IR 4
    if not [vi for vi in model.graph.input if vi.name not in initializers]:
        raise ValueError(f"{path} has no inputs; portable-pe compiles only graphs with at least one input")
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for vi in values:
            what = _non_numeric(vi)
            if what and vi.name not in initializers:
                raise ValueError(f"{path}: {kind} {vi.name!r} is {what}; portable-pe compiles only graphs whose inputs "
                                 "and outputs are numeric tensors (float, integer or bool)")
    return model


def _non_numeric(vi) -> str:
    """'a string tensor', 'a sequence', ...: what a graph input or output is when it is no
    numeric tensor; "" for a numeric tensor (or one whose element type is left open)."""
    import onnx
    kind = vi.type.WhichOneof("value")
    if kind not in (None, "tensor_type"):
        return {"sequence_type": "a sequence", "map_type": "a map", "optional_type": "an optional",
                "sparse_tensor_type": "a sparse tensor"}.get(kind, f"of type {kind}")
    elem = vi.type.tensor_type.elem_type
    if elem in (onnx.TensorProto.STRING, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        return f"a {onnx.TensorProto.DataType.Name(elem).lower()} tensor"
    return ""


def load_npz_inputs(path: str | Path, *, option: str = "--inputs") -> dict:
    """{name: array} from an .npz written by numpy.savez / savez_compressed."""
    import numpy as np
    path = require_file(path, what=f"{option} file")
    expected = "an .npz written by numpy.savez, one array per model input"
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{option} {path} is not an .npz file ({'empty' if path.stat().st_size == 0 else 'not a zip archive'}); "
                         f"expected {expected}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as err:
        raise ValueError(f"{option} {path} cannot be read as .npz ({err}); expected {expected}") from None
    if not arrays:
        raise ValueError(f"{option} {path} holds no arrays; expected {expected}")
    return arrays
