"""Arm Ethos-U55/U65/U85 through Vela: our side of the ethos-u toolchain.

    graph spec, N -> torch.export program, positions = arange(N) folded to constants
    (a vision spec, H x W -> the program of pixels (1, C, H, W): the grid's positions fold)
                  -> (worker, in the toolchain venv) litert-torch float TFLite
                  -> ai-edge-quantizer full int8 (calibrated) -> LiteRT accuracy check
                  -> Vela per accelerator: per-layer cycles, SRAM/DRAM traffic, CPU fallbacks

The worker (vela_worker.py) runs with `bash scripts/npu_toolchain.sh ethos-u`'s python
through npu/toolchain.py's file contract. Vela compiles int8 TFLite only, and only PyTorch
converts to TFLite here (without TensorFlow), so this path needs a graph spec, not an
.onnx file.

Two entry points: `compile_jobs` (many (spec, N) at once: one worker start, used by the
guide) and `build_bundle_files` (one spec for an `--target npu` bundle).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .toolchain import VendorError, run_worker

TOOLCHAIN = "ethos-u"
WORKER = Path(__file__).with_name("vela_worker.py")

#: accelerator (an ethos-u profile's `accelerator`, targets/npu/*.toml) -> Vela's configuration:
#: the MAC count and the system/memory setup from Vela's own Arm/vela.ini that fit each part
#: (U55: SRAM + off-chip flash, U65/U85: SRAM + DRAM)

ACCELERATORS: dict[str, dict] = {
    "ethos-u85": {"name": "ethos-u85-256", "system_config": "Ethos_U85_SYS_DRAM_Mid",
                  "memory_mode": "Dedicated_Sram_384KB"},
    "ethos-u65": {"name": "ethos-u65-256", "system_config": "Ethos_U65_High_End", "memory_mode": "Dedicated_Sram"},
    "ethos-u55": {"name": "ethos-u55-128", "system_config": "Ethos_U55_High_End_Embedded",
                  "memory_mode": "Shared_Sram"},
}


@dataclass(frozen=True)
class VelaJob:
    spec: object        # graphs.GraphSpec
    seq_len: int        # a vision spec's: the tokens its image makes
    image: tuple[int, ...] | None = None  # a vision spec's static size ([F,] H, W)

    @property
    def id(self) -> str:
        return f"{self.spec.name}/{'x'.join(map(str, self.image))}" if self.image else f"{self.spec.name}/T{self.seq_len}"

    @classmethod
    def for_image(cls, spec, image) -> "VelaJob":
        vision = spec.vision
        patches = ([vision.temporal_patch] if vision.video else []) + [vision.patch] * 2
        tokens = vision.prefix + int(np.prod([n // p for n, p in zip(image, patches)]))
        return cls(spec, tokens, tuple(int(n) for n in image))


def calibration_count(seq_len: int) -> int:
    """Calibration inputs: 8 at T=128, fewer for longer ones (each holds more tokens; two
    at T=4096 took 44 s of calibration on a 2-core machine)."""
    return max(1, min(8, 1024 // seq_len))


def refusal(spec, seq_len: int, image=None) -> str | None:
    """Why this encoder cannot be built at a static length N (None when it can); an image
    size was checked against the spec's patch and max size already (npu/image_size.py)."""
    if image is not None:
        return None
    if seq_len < 1:
        return f"sequence length must be positive, got {seq_len}"
    if seq_len > spec.max_length:
        return (f"{spec.name}: positions 0..{seq_len - 1} exceed its {spec.max_length}-position limit "
                f"(learned position table); built at N <= {spec.max_length} only")
    return None


def export_program(spec, seq_len: int, path: Path, image=None) -> dict:
    """A torch.export program x (1, N, D) -> hidden with positions = arange(N) folded in:
    every position computation (sin/cos, RoPE tables, T5 buckets, ALiBi distances) becomes
    a constant, as the NPU graph needs; identical constants (a bias every layer recomputes)
    are kept once. A vision spec's program takes pixels (1, C, *image): its patch grid's
    positions (and what they feed: 2D RoPE's tables, a resized learned table, a relative
    bias) come from the static shape and fold the same way."""
    import warnings
    import torch
    from torch.fx.experimental.const_fold import split_const_subgraphs

    class FixedPositions(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder
            self.register_buffer("positions", torch.arange(seq_len), persistent=False)

        def forward(self, x):
            return self.encoder(x, self.positions)

    start = time.perf_counter()
    if image is not None:
        example = (torch.zeros(1, spec.vision.channels, *image),)
        module = spec.build().eval()
        module.fix_positions(example[0])
    else:
        example = (torch.zeros(1, seq_len, spec.model.d_model),)
        module = FixedPositions(spec.build()).eval()
    with torch.no_grad(), warnings.catch_warnings():
        # const_fold warns about every folded attribute it adds ("no underlying reference")
        warnings.simplefilter("ignore", UserWarning)
        graph = torch.export.export(module, example).module()
        folded = split_const_subgraphs(graph)
        folded.run_folding()
        shared = _share_equal_constants(folded)
        program = torch.export.export(folded, example)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return {"export_s": time.perf_counter() - start, "shared_constants": shared, "program_bytes": path.stat().st_size}


def _share_equal_constants(gm) -> int:
    """Make every use of equal folded tensors read one of them (a bias that each layer
    recomputes folds to one constant per layer); returns how many copies went."""
    import operator
    import torch
    seen: dict[tuple, tuple] = {}
    merged = 0
    for node in list(gm.graph.nodes):
        value = _constant(gm, node, operator)
        if not isinstance(value, torch.Tensor) or value.numel() < 1024:
            continue
        key = (tuple(value.shape), value.dtype, float(value.double().sum()), float(value.double().abs().sum()))
        first = seen.setdefault(key, (node, value))
        if first[0] is not node and torch.equal(first[1], value):
            node.replace_all_uses_with(first[0])
            merged += 1
    if merged:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return merged


def _constant(gm, node, operator):
    """The tensor a node reads: a get_attr, or an item of const_fold's folded ParameterList."""
    if node.op == "get_attr":
        return _get_attr(gm, node.target)
    if node.op == "call_function" and node.target is operator.getitem and node.args[0].op == "get_attr":
        holder = _get_attr(gm, node.args[0].target)
        if isinstance(holder, (list, tuple)) or hasattr(holder, "__getitem__") and not hasattr(holder, "shape"):
            return holder[node.args[1]]
    return None


def _get_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def job_data(spec, seq_len: int, *, seed: int = 0, image=None) -> dict[str, np.ndarray]:
    """Calibration inputs, one check input and PyTorch's fp32 output for it (an image spec's:
    standard-normal pixels, as a normalized image is fed)."""
    import torch
    rng = np.random.default_rng(seed)
    shape = (1, spec.vision.channels, *image) if image is not None else (1, seq_len, spec.model.d_model)
    calibration = rng.standard_normal((calibration_count(seq_len), *shape)).astype(np.float32)
    check = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        model = spec.build()
        reference = (model(torch.from_numpy(check)) if image is not None
                     else model(torch.from_numpy(check), torch.arange(seq_len))).numpy()
    return {"calibration": calibration, "check": check, "reference": reference}


def compile_jobs(jobs: list[VelaJob], *, accelerators: list[str], work_dir: Path, workers: int = 2,
                 log: Callable[[str], None] = print, python: Path | None = None,
                 timeout_s: float = 7200.0) -> list[dict]:
    """Each job through the worker; one result per job, in order. A job refused here, or
    failed in the worker, has ok=False and the reason (the vendor's words for the latter).
    A worker crash fails the jobs it had not finished with the crash report.

    The jobs are shared out among `workers` worker processes (longest first, so the loads
    even out), each with one thread: the conversion is mostly single-threaded, and while
    one worker converts, the programs of the next are exported here."""
    import threading
    unknown = [a for a in accelerators if a not in ACCELERATORS]
    if unknown:
        raise ValueError(f"unknown Ethos-U accelerator(s) {unknown}; valid: {', '.join(ACCELERATORS)}")
    work_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    todo = []
    for job in jobs:
        why = refusal(job.spec, job.seq_len, job.image)
        if why:
            results[job.id] = {"id": job.id, "ok": False, "stage": "export", "error": why}
        else:
            todo.append(job)
    todo.sort(key=lambda j: -j.seq_len)
    groups = [todo[i::max(1, workers)] for i in range(max(1, workers))]
    threads = []
    for index, group in enumerate(g for g in groups if g):
        folder = work_dir / f"worker{index}"
        folder.mkdir(parents=True, exist_ok=True)
        request = {"threads": 1 if workers > 1 else 2, "vela_config": "Arm/vela.ini", "jobs": []}
        for job in group:
            stem = job.id.replace("/", "-")
            log(f"  ethos-u: exporting {job.id} (positions folded)")
            info = export_program(job.spec, job.seq_len, folder / f"{stem}.pt2", image=job.image)
            np.savez(folder / f"{stem}.npz", **job_data(job.spec, job.seq_len, image=job.image))
            results[job.id] = {"id": job.id, "export": info}
            request["jobs"].append({"id": job.id, "program": f"{stem}.pt2", "data": f"{stem}.npz", "out": stem,
                                    "accelerators": [ACCELERATORS[a] for a in accelerators]})
        log(f"  ethos-u: worker {index}: converting, quantizing and compiling {len(group)} model(s) with Vela "
            f"({', '.join(accelerators)})")
        thread = threading.Thread(target=_run_group, args=(request, folder, results, python, timeout_s))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return [results[job.id] for job in jobs]


def _run_group(request: dict, folder: Path, results: dict, python, timeout_s: float) -> None:
    done, crash = _run(request, work_dir=folder, python=python, timeout_s=timeout_s)
    for job in request["jobs"]:
        entry = done.get(job["id"]) or {"id": job["id"], "ok": False, "stage": "worker",
                                        "error": crash or "the worker wrote no result for this job"}
        results[job["id"]].update(_relative(entry, folder))


def _run(request: dict, *, work_dir: Path, python, timeout_s: float) -> tuple[dict[str, dict], str | None]:
    try:
        result, crash = run_worker(TOOLCHAIN, WORKER, request, work_dir=work_dir, stage="vela",
                                   timeout_s=timeout_s, python=python), None
    except VendorError as err:  # keep the jobs the worker finished before it died
        crash = str(err)
        try:
            result = json.loads((work_dir / "result.json").read_text())
        except (OSError, ValueError):
            result = {"jobs": []}
    versions = result.get("versions", {})
    return {j["id"]: {**j, "versions": versions} for j in result.get("jobs", [])}, crash


def _relative(entry: dict, work_dir: Path) -> dict:
    """Worker paths (relative to its cwd, work_dir) made absolute for the caller."""
    if entry.get("int8_tflite"):
        entry["int8_tflite"] = str(work_dir / entry["int8_tflite"])
    for report in (entry.get("vela") or {}).values():
        if report.get("vela_tflite"):
            report["vela_tflite"] = str(work_dir / report["vela_tflite"])
    return entry


def summarize(entry: dict, accelerator: str) -> dict:
    """One job's Vela report for one accelerator, in plain numbers: estimated inference
    time, cycles, SRAM/DRAM traffic, ops on the NPU/CPU with Vela's reasons."""
    report = (entry.get("vela") or {}).get(ACCELERATORS[accelerator]["name"]) or {}
    if not entry.get("ok") or not report.get("ok"):
        return {"ok": False, "error": report.get("error") or entry.get("error")}
    s = report["summary"]
    return {"ok": True, "inference_ms": 1e3 * float(s["inference_time"]), "cycles_total": s["cycles_total"],
            "cycles_npu": s["cycles_npu"], "clock_hz": s["core_clock"],
            "sram_bytes": s["sram_total_bytes"], "dram_bytes": s["dram_total_bytes"],
            "off_chip_flash_bytes": s["off_chip_flash_total_bytes"],
            "sram_used_kib": s["sram_memory_used"], "dram_used_kib": s["dram_memory_used"],
            "off_chip_flash_used_kib": s["off_chip_flash_memory_used"],
            "macs": s["nn_macs"], "npu_ops": report.get("npu_ops"), "cpu_ops": report.get("cpu_ops"),
            "cpu_fallbacks": report.get("cpu_fallbacks", []), "compile_s": report["compile_s"],
            "system_config": s["system_config"], "memory_mode": s["memory_mode"],
            "accelerator_config": s["accelerator_configuration"]}


def placement(entry: dict, accelerator: str) -> dict:
    """Where Vela put each operator of the TFLite model, in agreement.py's form: every CPU
    operator (Vela's warning block: the op, its output tensor's name, Vela's reason)."""
    report = (entry.get("vela") or {}).get(ACCELERATORS[accelerator]["name"]) or {}
    cpu = [{"op": b["op"], "name": b["name"], "target": "CPU", "why": [b["reason"]]}
           for b in report.get("cpu_fallbacks", [])]
    return {"ops_npu": report.get("npu_ops"), "ops_cpu": report.get("cpu_ops"), "cpu_ops": cpu}


def build_bundle_files(*, spec, seq_len: int | None, accelerator: str = "ethos-u85", work_dir: Path,
                       log: Callable[[str], None] = print, python: Path | None = None,
                       image: list[int] | None = None) -> tuple[dict[str, bytes], dict]:
    """The Ethos-U part of an `--target npu --profile ethos-u85` bundle: (files, report).

    files: {"model_int8.tflite": the full-int8 TFLite model, "model_vela.tflite": Vela's
    compiled model for the accelerator (its command stream in an ethos-u custom op), and
    "vela_report.json": the per-layer report}. report: the manifest's summary (Vela's
    estimate, ops on NPU/CPU with reasons, int8 accuracy against PyTorch, versions).
    Raises VendorError (the vendor's words) when the build fails, ValueError when the
    spec cannot be built at seq_len: nothing is written to a bundle then. A vision spec is
    built at `image` ([F,] H, W) instead of a length.
    """
    if spec is None:
        raise ValueError("the Ethos-U build converts the PyTorch model to TFLite: it needs a graph spec, "
                         "not an .onnx file (TFLite conversion of ONNX would need TensorFlow)")
    if accelerator not in ACCELERATORS:
        raise ValueError(f"unknown Ethos-U accelerator {accelerator!r}; valid: {', '.join(ACCELERATORS)}")
    shutil.rmtree(work_dir, ignore_errors=True)
    job = VelaJob.for_image(spec, image) if image is not None else VelaJob(spec, seq_len)
    (entry,) = compile_jobs([job], accelerators=[accelerator], work_dir=work_dir, log=log, python=python)
    if entry.get("stage") == "export":
        raise ValueError(entry["error"])
    if not entry.get("ok"):
        raise VendorError(f"ethos-u build of {job.id} failed in {entry.get('stage')}: "
                          f"{entry.get('error')}")
    vela_report = entry["vela"][ACCELERATORS[accelerator]["name"]]
    if not vela_report.get("ok"):
        raise VendorError(f"vela ({accelerator}): {vela_report.get('error')}")
    summary = summarize(entry, accelerator)
    report = {"toolchain": TOOLCHAIN, "accelerator": accelerator, "seq_len": None if image else seq_len,
              "image": list(image) if image else None, "versions": entry["versions"],
              "vela_command": vela_report["command"], "accuracy_int8": entry["accuracy"],
              "tflite_ops": entry["tflite_ops"], "calibration_samples": entry["calibration_samples"],
              "tflite_operators": entry["tflite_operators"], "placement": placement(entry, accelerator),
              **{k: v for k, v in summary.items() if k != "ok"}}
    files = {"model_int8.tflite": Path(entry["int8_tflite"]).read_bytes(),
             "model_vela.tflite": Path(vela_report["vela_tflite"]).read_bytes(),
             "vela_report.json": json.dumps({"summary": vela_report["summary"], "layers": vela_report["layers"],
                                             "cpu_fallbacks": vela_report["cpu_fallbacks"]}, indent=1).encode()}
    return files, report
