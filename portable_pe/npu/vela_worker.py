"""Ethos-U worker: PyTorch program -> int8 TFLite -> Vela, inside the ethos-u toolchain venv.

Run by portable_pe/npu/vela.py through npu/toolchain.py's file contract; it imports nothing
of portable-pe (it runs under the toolchain's own python, torch, litert-torch and Vela):

    python vela_worker.py request.json      (cwd: the work folder)

request.json: {"threads": 2, "vela_config": "Arm/vela.ini", "jobs": [{
    "id": "rope/T128",
    "program": "rope-T128.pt2",       torch.export program: x (1, T, D) -> hidden, positions folded
    "data": "rope-T128.npz",          calibration (n, 1, T, D), check (1, T, D), reference (1, T, D)
    "out": "rope-T128",               folder for this job's files
    "accelerators": [{"name": "ethos-u85-256", "system_config": "...", "memory_mode": "..."}]}]}

Per job: litert-torch converts the program to a float TFLite model, ai-edge-quantizer
quantizes it to full int8 (int8 weights per channel, int8 activations, int8 model inputs
and outputs: what Vela compiles) with the calibration inputs, LiteRT runs the int8 model on
the check input (accuracy against the PyTorch reference), and Vela compiles it for each
accelerator. result.json is rewritten after every job, so a crash keeps what finished.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

RESULT = Path("result.json")


def _write_result(result: dict) -> None:
    tmp = RESULT.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, RESULT)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for package in ("ethos-u-vela", "litert-torch", "ai-edge-quantizer", "ai-edge-litert", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None  # the job that needs it fails, in its own words
    return found


def convert_int8(program: Path, data, out: Path, *, threads: int) -> dict:
    """float TFLite by litert-torch, then full-int8 TFLite by ai-edge-quantizer."""
    import litert_torch
    import torch
    from ai_edge_quantizer import quantizer, recipe
    from ai_edge_quantizer.calibrator import CalibrationMode
    start = time.perf_counter()
    module = torch.export.load(str(program)).module()
    example = torch.from_numpy(data["check"])
    edge = litert_torch.convert(module, (example,))
    float_path = out / "model_fp32.tflite"
    edge.export(str(float_path))
    converted = time.perf_counter()
    q = quantizer.Quantizer(str(float_path))
    q.load_quantization_recipe(recipe.static_wi8_ai8())
    signature = next(iter(edge._signature_defs)) if hasattr(edge, "_signature_defs") else "serving_default"
    arg = _input_name(float_path)
    samples = [{arg: x} for x in data["calibration"]]
    # min/max tracked in C++: preserving every tensor took 18 GB and 10 minutes at T=4096
    stats = q.calibrate({signature: samples}, num_threads=threads, mode=CalibrationMode.CALIBRATION_PROFILER_BASED)
    int8_path = out / "model_int8.tflite"
    q.quantize(stats, enable_progress_report=False).export_model(str(int8_path), overwrite=True)
    float_path.unlink()  # the int8 model is the one a deployment uses
    return {"convert_s": converted - start, "quantize_s": time.perf_counter() - converted,
            "int8_tflite": str(int8_path), "int8_bytes": int8_path.stat().st_size,
            "calibration_samples": len(samples)}


def _input_name(path: Path) -> str:
    from ai_edge_litert.interpreter import Interpreter
    sig = Interpreter(model_path=str(path)).get_signature_list()
    return next(iter(sig.values()))["inputs"][0]


def int8_accuracy(path: Path, data, *, threads: int) -> dict:
    """The int8 TFLite model on LiteRT's CPU kernels (the Interpreter's default op resolver,
    its optimized kernels, not the reference ones) against PyTorch fp32: the int8 semantics
    Vela's NPU command stream keeps (bit-exactness with the NPU is not measured here)."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_path=str(path), num_threads=threads)
    interp.allocate_tensors()
    inp, outp = interp.get_input_details()[0], interp.get_output_details()[0]
    scale, zero = inp["quantization"]
    x = np.clip(np.rint(data["check"] / scale) + zero, -128, 127).astype(inp["dtype"])
    interp.set_tensor(inp["index"], x)
    interp.invoke()
    o_scale, o_zero = outp["quantization"]
    got = (interp.get_tensor(outp["index"]).astype(np.float64) - o_zero) * o_scale
    ref = data["reference"].astype(np.float64)
    r, g = ref.ravel(), got.ravel()
    return {"cosine": float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g))),
            "max_abs": float(np.max(np.abs(r - g))), "max_ref": float(np.max(np.abs(r))),
            "source": "LiteRT int8 (default op resolver) vs PyTorch fp32"}


def tflite_operators(path: Path) -> list[dict]:
    """Every operator of the TFLite model Vela is handed, in graph order: its builtin name,
    its output tensor's name (what Vela's report names it by), and the dtypes and largest
    rank of its tensors: what the profile's pre-check judges (npu/tflite_check.py)."""
    from ai_edge_litert import schema_py_generated as schema
    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    dtypes = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    found = []
    for sub in model.subgraphs:
        for op in sub.operators:
            code = model.operatorCodes[op.opcodeIndex]
            tensors = [sub.tensors[i] for i in [*op.inputs, *op.outputs] if i >= 0]
            out = sub.tensors[op.outputs[0]].name if len(op.outputs) else b""
            found.append({"op": names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "CUSTOM"),
                          "name": out.decode() if isinstance(out, bytes) else str(out),
                          "dtypes": sorted({dtypes.get(t.type, str(t.type)) for t in tensors}),
                          "rank": max((len(t.shape) for t in tensors if t.shape is not None), default=0)})
    return found


def op_counts(operators: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for op in operators:
        counts[op["op"]] = counts.get(op["op"], 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def parse_cpu_fallbacks(log: str) -> list[dict]:
    """Vela's `Warning (supported operators) operator: OP, ofm: 'NAME'` blocks: the op, its
    output tensor and Vela's reason (the lines that follow, verbatim)."""
    blocks, current = [], None
    for line in log.splitlines():
        if line.startswith("Warning (supported operators) operator:"):
            op, _, ofm = line.split("operator:", 1)[1].partition(", ofm:")
            current = {"op": op.strip(), "name": ofm.strip().strip("'"), "reason": []}
            blocks.append(current)
        elif current is not None and line.strip():
            current["reason"].append(line.strip())
        elif current is not None:
            current = None
    return [{**b, "reason": " ".join(b["reason"])} for b in blocks]


def _summary_counts(log: str) -> dict:
    counts = {}
    for line in log.splitlines():
        for key in ("CPU operators", "NPU operators"):
            if line.strip().startswith(key + " ="):
                counts[key.split()[0].lower() + "_ops"] = int(line.split("=")[1].split()[0])
    return counts


def run_vela(int8_path: Path, acc: dict, out: Path, *, config: str) -> dict:
    vela = Path(sys.executable).with_name("vela")
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(vela), str(int8_path), "--accelerator-config", acc["name"], "--config", config,
           "--system-config", acc["system_config"], "--memory-mode", acc["memory_mode"],
           "--output-dir", str(out), "--show-cpu-operations", "--verbose-performance"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    (out / "vela.log").write_text(log)
    if proc.returncode != 0:
        tail = "\n".join(log.strip().splitlines()[-8:])
        return {"ok": False, "compile_s": elapsed, "error": f"vela exited {proc.returncode}: {tail}"}
    stem = int8_path.stem
    summary_file = next(out.glob(f"{stem}_summary_*.csv"))
    with open(summary_file) as f:
        header, values = list(csv.reader(f))[:2]
    summary = {k: _number(v) for k, v in zip(header, values)}
    layers = []
    with open(out / f"{stem}_per-layer.csv") as f:
        for row in csv.DictReader(f):
            layers.append({"op": row["Original Operator"], "npu_op": row["NNG Operator"],
                           "target": row["Target"], "cycles": int(float(row["Op Cycles"] or 0)),
                           "macs": int(float(row["MAC Count"] or 0)), "name": row["Name"]})
    return {"ok": True, "compile_s": elapsed, "command": " ".join(cmd[1:]), "summary": summary,
            **_summary_counts(log), "cpu_fallbacks": parse_cpu_fallbacks(log), "layers": layers,
            "vela_tflite": str(out / f"{stem}_vela.tflite")}


def _number(text: str):
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text else value


def run_job(job: dict, *, threads: int, config: str) -> dict:
    import numpy as np
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    entry = {"id": job["id"], "ok": False}
    stage = "convert"
    try:
        with np.load(job["data"]) as npz:
            data = {k: npz[k] for k in npz.files}
        entry.update(convert_int8(Path(job["program"]), data, out, threads=threads))
        stage = "accuracy"
        start = time.perf_counter()
        entry["accuracy"] = int8_accuracy(Path(entry["int8_tflite"]), data, threads=threads)
        entry["accuracy_s"] = time.perf_counter() - start
        entry["tflite_operators"] = tflite_operators(Path(entry["int8_tflite"]))
        entry["tflite_ops"] = op_counts(entry["tflite_operators"])
        stage = "vela"
        entry["vela"] = {acc["name"]: run_vela(Path(entry["int8_tflite"]), acc, out / acc["name"], config=config)
                         for acc in job["accelerators"]}
        entry["ok"] = True
    except Exception as err:  # one job's failure is its own row; the others go on
        entry.update(stage=stage, error=f"{type(err).__name__}: {str(err).strip()[:2000]}",
                     traceback=traceback.format_exc()[-4000:])
        print(f"[vela_worker] {job['id']}: {stage} failed: {err}", flush=True)
    return entry


def main(request_path: str) -> int:
    request = json.loads(Path(request_path).read_text())
    threads = int(request.get("threads", 2))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    torch.set_num_threads(threads)
    result = {"versions": _versions(), "jobs": []}
    _write_result(result)
    for job in request["jobs"]:
        start = time.perf_counter()
        print(f"[vela_worker] {job['id']} ...", flush=True)
        entry = run_job(job, threads=threads, config=request.get("vela_config", "Arm/vela.ini"))
        entry["worker_s"] = time.perf_counter() - start
        result["jobs"].append(entry)
        _write_result(result)
        print(f"[vela_worker] {job['id']}: {'ok' if entry['ok'] else 'failed'} in {entry['worker_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
