"""Foreign ONNX encoders through the whole compile flow: legalize, import, build, bundle, parity.

The graphs are test_legalize's PyTorch modules in other projects' styles, exported with the
dynamo exporter (opsets 18, 23) and the TorchScript exporter (opset 17). With no PyTorch
model at hand, the reference is onnxruntime on the file, and the bundle says so.
"""

from __future__ import annotations

import pytest

from portable_pe.compile.pipeline import compile_graph
from portable_pe.run.parity import check_bundle
from test_legalize import CASES, export

LENGTHS = (3, 16, 77)  # 16 is the export length; 3 and 77 were never seen
DEFAULT_CASES = {("hf_rope", "dynamo", 23), ("t5_bias", "torchscript", 17), ("sdpa_alibi", "dynamo", 23)}
PARAMS = [pytest.param(*case, id="-".join(map(str, case)),
                       marks=() if case in DEFAULT_CASES else pytest.mark.slow) for case in CASES]


@pytest.mark.parametrize("name,exporter,opset", PARAMS)
def test_foreign_graph_compiles_and_matches(name, exporter, opset, tmp_path):
    path = tmp_path / f"{name}.onnx"
    export(name, exporter, opset, path)
    bundle = compile_graph(str(path), out=tmp_path / "bundle", log=lambda m: None)
    assert bundle.manifest["reference"]["source"] == "onnxruntime"
    assert bundle.manifest["graph"]["source"] == "onnx"
    roles = sorted(info["role"] for info in bundle.manifest["dims"].values())
    assert roles == ["batch", "seq"], bundle.manifest["dims"]  # both axes stayed dynamic
    report = check_bundle(bundle, lengths=LENGTHS)
    assert [r.length for r in report.rows] == list(LENGTHS)
    assert report.ok, report.to_markdown()


def test_inspect_lists_blocking_nodes_before_compiling(tmp_path):
    import subprocess
    import sys
    from test_cli import write_graph
    path = write_graph(tmp_path / "celu.onnx", "Celu")
    proc = subprocess.run([sys.executable, "-m", "portable_pe", "inspect", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "1 node(s) would block compilation" in proc.stdout and "my_celu: Celu (ai.onnx opset 17)" in proc.stdout
    export("hf_rope", "dynamo", 23, tmp_path / "rope.onnx")
    proc = subprocess.run([sys.executable, "-m", "portable_pe", "inspect", str(tmp_path / "rope.onnx")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "RotaryEmbedding x4" in proc.stdout and "every node has a converter" in proc.stdout
