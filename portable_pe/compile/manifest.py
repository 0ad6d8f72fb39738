"""The bundle stage: what the compile made, written as a bundle (bundle/artifact.py) with
its manifest, reference cases and the board's self-check."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import onnx

from .. import __version__
from ..backends import get_backend
from ..backends.arm import cpu_features
from ..backends.targets import target_arch, target_json
from ..bundle.artifact import Bundle, BundleWriter
from ..bundle.reference import write_cases
from .export import get_metadata
from .state import CompileState
from .tolerance import bundle_tolerance

#: shipped in every bundle as run_on_board.py: the bundle checks itself on a board
BOARD_RUNNER = Path(__file__).resolve().parent.parent / "bundle" / "run_on_board.py"


def manifest_of(st: CompileState) -> dict:
    """Everything the manifest says about the compile (write_bundle adds the checksums)."""
    import torch
    import tvm
    request = st.request
    return {
        "graph": {"name": st.name, "source": "spec" if st.spec else "onnx",
                  "spec": st.spec.to_dict() if st.spec else None},
        "encoding": st.spec.encoding if st.spec else get_metadata(st.model).get("encoding", "unknown"),
        "target": {"name": st.target.name, "device": st.target.device, "options": st.target_options,
                   "tvm": target_json(st.tvm_target), "host_arch": target_arch(st.tvm_target),
                   **({"cpu_features": cpu_features(st.tvm_target)} if target_arch(st.tvm_target) == "aarch64" else {})},
        **st.io,
        "reference": {"source": "torch" if st.spec else "onnxruntime",
                      **({"model": "reference.onnx"} if st.reference_model is not None else {}),
                      "lengths": sorted(case.length for case in st.reference if case.sizes is None),
                      **({"sizes": [case.sizes for case in st.reference if case.sizes]}
                         if any(case.sizes for case in st.reference) else {})},
        # resolved per output dtype, so the bundle's runner can check itself without us
        "tolerance": bundle_tolerance(st.report, {o["dtype"] for o in st.io["outputs"]}, st.target.tolerance),
        "versions": {"portable_pe": __version__, "torch": torch.__version__.split("+")[0],
                     "onnx": onnx.__version__, "tvm": tvm.__version__},
        "precision": request.precision,
        "tuning": st.tuning or {"database": None},
        "timings_s": {k: round(v, 3) for k, v in st.timings.items()},
        **st.report,
    }


def write_compiled_bundle(st: CompileState, writer: BundleWriter) -> Bundle:
    """The bundle, through the writer whose lock the compile holds (artifact.bundle_writer)."""
    npz, cases = write_cases(st.reference)
    manifest = manifest_of(st)
    manifest["reference"]["cases"] = cases
    with tempfile.TemporaryDirectory() as tmp:
        so = st.files.get("model.so") or Path(tmp) / "model.so"  # a backend may have exported it already
        if not isinstance(so, bytes):
            get_backend(st.target.backend).export_library(st.executable, so, target_options=st.target_options)
        extra = {**st.files, **({"reference.onnx": st.reference_model.SerializeToString()}
                                if st.reference_model is not None else {})}
        return writer.write({**extra, "model.so": so, "model.onnx": st.model.SerializeToString(),
                             "reference.npz": npz, "run_on_board.py": BOARD_RUNNER},
                            json.loads(json.dumps(manifest, default=list)))
