"""Rockchip RKNPU2 through RKNN-Toolkit2: the vendor build, placement and simulator.

RKNN-Toolkit2 never enters this process (its pins clash with ours and it can segfault):
`bash scripts/npu_toolchain.sh rknn` makes its virtualenv and workers/rknn_worker.py runs
there through toolchain.py's file contract. What it is handed (the bundle keeps all of it
under rknn/, so the build can be redone and checked):

    rknn/model.onnx        the float graph: positions folded, rewritten for the rknpu2
                           profile (Gelu in a form the NPU runs), opset lowered to 19 (the
                           toolkit refuses 20: "Unsupport onnx opset 20, need <= 19!")
    rknn/calibration/*.npy our calibration inputs (seeds 1.., as quantize.py's), and
    rknn/dataset.txt       their list in RKNN's format (int8 only)
    rknn/model.rknn        what RKNN built; rknn/build.log its verbose log, whose layer
                           table says where each op runs

The float graph plus our calibration set, not our QDQ graph, by measurement (rope, T=128,
int8, rk3588; scripts/npu_rknn_table.py --compare-qdq): our QDQ graph crashes RKNN's
compiler at its default optimization level 3 (SIGSEGV in build); at level 2 it builds,
with 189 ops and simulator cosine 0.99938 against 165 ops and 0.99945 for the float graph
that RKNN quantizes itself on the same calibration inputs.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from .rknn_log import placement, vendor_messages
from .toolchain import VendorError, run_worker

TOOLCHAIN = "rknn"
SOCS = ("rk3588", "rk3576", "rk3568")
DTYPES = ("int8", "fp16")
MAX_OPSET = 19
WORKER = Path(__file__).resolve().parent / "workers" / "rknn_worker.py"
PREFIX = "rknn/"
RUNTIME_NOTE = ("on the board: rknn-toolkit-lite2 (Python, RKNNLite: load_rknn('model.rknn'), init_runtime(), "
                "inference(inputs=[x])) or librknnrt's C API (rknn_init, rknn_inputs_set, rknn_run, rknn_outputs_get)")


def vendor_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph RKNN is handed: attention's head merges written as concatenations
    (head_merge.py: RKNN computed a transposed one wrong), the default opset lowered to
    MAX_OPSET (19)."""
    from onnx import version_converter
    from .head_merge import concat_head_merges
    model = onnx.ModelProto.FromString(model.SerializeToString())  # the host graph stays as it is
    concat_head_merges(model)
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), MAX_OPSET)
    if version <= MAX_OPSET:
        return model
    new_ops = _ops_newer_than(model, MAX_OPSET)
    if new_ops:
        raise ValueError(f"RKNN-Toolkit2 takes ONNX opset <= {MAX_OPSET}; these ops exist only in later "
                         f"opsets: {', '.join(new_ops)} (rewrite them first; the rknpu2 profile does for Gelu)")
    lowered = version_converter.convert_version(model, MAX_OPSET)
    onnx.checker.check_model(lowered)
    return lowered


def _ops_newer_than(model: onnx.ModelProto, opset: int) -> list[str]:
    newer = set()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            onnx.defs.get_schema(n.op_type, opset)
        except onnx.defs.SchemaError:
            newer.add(n.op_type)
    return sorted(newer)


@dataclass
class VendorBuild:
    """What one RKNN run produced: bundle files (paths under rknn/), the manifest's report,
    and the simulator's outputs, one dict per simulated input set."""
    files: dict[str, bytes] = field(default_factory=dict)
    report: dict = field(default_factory=dict)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)


def _npy(array: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _input_names(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def calibration_files(model: onnx.ModelProto, calibration: list[dict[str, np.ndarray]]) -> dict[str, bytes]:
    """rknn/calibration/<i>_<input>.npy and rknn/dataset.txt (one line per sample, the
    inputs' files in model input order, space separated: RKNN's dataset format)."""
    names, files, lines = _input_names(model), {}, []
    for i, sample in enumerate(calibration):
        paths = [f"calibration/{i:03d}_{k}.npy" for k in range(len(names))]
        for path, name in zip(paths, names):
            files[PREFIX + path] = _npy(sample[name])
        lines.append(" ".join(paths))
    files[PREFIX + "dataset.txt"] = ("\n".join(lines) + "\n").encode()
    return files


def _write(work: Path, files: dict[str, bytes]) -> None:
    for path, content in files.items():
        dest = work / path.removeprefix(PREFIX)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)


def _outputs(work: Path, model: onnx.ModelProto, names: list[str]) -> list[dict[str, np.ndarray]]:
    """Simulator outputs by output name, in the graph's own shapes (RKNN may hand back a
    4-D view of a 3-D output; a different element count is kept as is and fails parity)."""
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    result = []
    for name in names:
        with np.load(work / name) as sim:
            outs = {}
            for k, out in enumerate(model.graph.output):
                got = sim[f"output_{k}"]
                want = shapes[out.name]
                outs[out.name] = got.reshape(want) if want and 0 not in want and got.size == np.prod(want) else got
            result.append(outs)
    return result


def _input_dims(model: onnx.ModelProto, name: str) -> list:
    return list(next(vi for vi in model.graph.input if vi.name == name).type.tensor_type.shape.dim)


def build(model: onnx.ModelProto, *, soc: str, dtype: str, calibration: list[dict[str, np.ndarray]],
          simulate: list[dict[str, np.ndarray]] = (), config: dict | None = None, python: Path | None = None,
          log: Callable[[str], None] = print) -> VendorBuild:
    """Build `model` (already vendor_graph()) with RKNN-Toolkit2 for `soc` as int8 (RKNN
    quantizes on `calibration`) or fp16, then run the simulator on each `simulate` input set.
    `config` adds RKNN.config() keywords (e.g. {"optimization_level": 2}).
    Raises VendorError naming the stage (build, export, simulator) and the vendor's words."""
    if soc not in SOCS:
        raise ValueError(f"--soc {soc!r} is not an RKNPU2 SoC; valid: {', '.join(SOCS)}")
    if dtype not in DTYPES:
        raise ValueError(f"--npu-dtype {dtype!r}: RKNN builds {', '.join(DTYPES)}")
    onnx_bytes = model.SerializeToString()
    files = {PREFIX + "model.onnx": onnx_bytes}
    if dtype == "int8":
        files.update(calibration_files(model, calibration))
    names = _input_names(model)
    work = Path(tempfile.mkdtemp(prefix="portable-pe-rknn-"))  # kept when RKNN fails: its log is the evidence
    _write(work, files)
    sets = []
    for i, inputs in enumerate(simulate):
        sets.append([f"simulate/{i:03d}_{k}.npy" for k in range(len(names))])
        for path, name in zip(sets[-1], names):
            _write(work, {path: _npy(inputs[name])})
    request = {"model": "model.onnx", "soc": soc, "dtype": dtype, "rknn": "model.rknn",
               "dataset": "dataset.txt" if dtype == "int8" else None, "simulate": sets, "config": config or {}}
    if any(len(_input_dims(model, name)) == 4 for name in names):
        # the simulator takes a 4-D input as NHWC unless told ("The input(ndarray) shape
        # (1, 3, 32, 32) is wrong, expect 'nhwc' like (1, 32, 32, 3)!"); ours are NCHW, as exported
        request["data_format"] = ["nchw"] * len(names)
    t = time.perf_counter()
    try:
        result = run_worker(TOOLCHAIN, WORKER, request, work_dir=work, python=python, stage=TOOLCHAIN)
    except VendorError as err:
        raise VendorError(_stage_error(err, work, soc=soc, dtype=dtype)) from None
    wall = time.perf_counter() - t
    build_log = (work / "worker.log").read_text(errors="replace")
    rknn_bytes = (work / "model.rknn").read_bytes()
    outputs = _outputs(work, model, result["simulated"])
    shutil.rmtree(work, ignore_errors=True)
    files[PREFIX + "model.rknn"] = rknn_bytes
    files[PREFIX + "build.log"] = build_log.encode()
    report = {"name": TOOLCHAIN, "toolkit": f"{result['toolkit']} {result['version']}", "built": True,
              "soc": soc, "dtype": dtype, "opset": _opset(model),
              "input": "float graph + our calibration set" if dtype == "int8" else "float graph (fp16)",
              "calibration_samples": len(calibration) if dtype == "int8" else 0,
              "rknn_bytes": len(rknn_bytes), "rknn_sha256": hashlib.sha256(rknn_bytes).hexdigest(),
              "timings_s": {**{k: round(v, 2) for k, v in result["timings"].items()}, "wall_s": round(wall, 2)},
              "placement": placement(build_log), "runtime": RUNTIME_NOTE}
    log(f"  rknn: built {PREFIX}model.rknn for {soc} ({dtype}, {len(rknn_bytes) / 1e6:.1f} MB) in "
        f"{result['timings'].get('build_s', 0):.1f} s; {report['placement']['ops_npu']} op(s) on the NPU, "
        f"{report['placement']['ops_cpu']} on the CPU")
    for op in report["placement"]["cpu_ops"]:
        log(f"    on the CPU: {op['op']} {op['name']} {op['input_shape']}: {op['why'][0]}")
    return VendorBuild(files=files, report=report, outputs=outputs)


def _stage_error(err: VendorError, work: Path, *, soc: str, dtype: str) -> str:
    """VendorError's message with the step the worker was in (progress.json: load, build,
    export, simulator) and the toolkit's own error lines first."""
    try:
        step = json.loads((work / "progress.json").read_text())["stage"]
    except (OSError, ValueError, KeyError):
        step = "start"
    step = {"simulator": "simulator", "import": "toolkit import"}.get(step, step)
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).removeprefix(f"{TOOLCHAIN}: ")
    log = work / "worker.log"
    said = vendor_messages(log.read_text(errors="replace"), levels="E") if log.is_file() else []
    words = "".join(f"\n  RKNN said: {line}" for line in said[-3:])
    return f"rknn {step} ({soc}, {dtype}): {text}{words}"


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def rebuild_and_simulate(bundle, inputs: list[dict[str, np.ndarray]], *, python: Path | None = None,
                         log: Callable[[str], None] = print) -> list[dict[str, np.ndarray]]:
    """Run the simulator on a bundle's RKNN model. The toolkit simulates only a model it
    built in the same session ("RKNN model that loaded by 'load_rknn' not support inference
    on the simulator"), so the bundle's rknn/ inputs (graph, SoC, dtype, calibration set)
    are built again. RKNN's output is not byte-reproducible
    (two builds of one graph differ in a small block), so the log says how close it is."""
    vendor = bundle.manifest["vendor"]
    model = onnx.load(str(bundle.file(PREFIX + "model.onnx")))
    calibration = []
    if vendor["dtype"] == "int8":
        names = _input_names(model)
        lines = bundle.file(PREFIX + "dataset.txt").read_text().split("\n")
        calibration = [{n: np.load(bundle.file(PREFIX + p)) for n, p in zip(names, line.split())}
                       for line in lines if line.strip()]
    log(f"  {TOOLCHAIN} simulator: rebuilding {PREFIX}model.onnx for {vendor['soc']} ({vendor['dtype']})")
    again = build(model, soc=vendor["soc"], dtype=vendor["dtype"], calibration=calibration, simulate=inputs,
                  python=python, log=lambda m: None)
    old, new = bundle.file(PREFIX + "model.rknn").read_bytes(), again.files[PREFIX + "model.rknn"]
    size = min(len(old), len(new))
    differ = int(np.count_nonzero(np.frombuffer(old[:size], np.uint8) != np.frombuffer(new[:size], np.uint8)))
    log(f"  {TOOLCHAIN} simulator: the rebuilt model.rknn has {len(new)} bytes ({len(old)} in the bundle), "
        f"{differ + abs(len(old) - len(new))} of them differ")
    return again.outputs
