"""Arm Ethos-U55/U65/U85 through Vela: our side of the ethos-u toolchain.

    graph spec, N -> torch.export program, positions = arange(N) folded to constants
    (a vision spec, H x W -> the program of pixels (1, C, H, W): the grid's positions fold)
                  -> (worker, in the toolchain venv) litert-torch float TFLite
                  -> ai-edge-quantizer full int8 (calibrated) -> LiteRT accuracy check
                  -> Vela per accelerator: per-layer cycles, SRAM/DRAM traffic, CPU fallbacks

The worker (vela_worker.py) runs with `bash scripts/npu_toolchain.sh ethos-u`'s python
through npu/toolchain.py's file contract. Vela compiles int8 TFLite only, and only PyTorch
converts to TFLite here (without TensorFlow), so this path needs a PyTorch model (a graph
spec, or a transformers vision class as a ModelJob), not an .onnx file.

Two entry points: `compile_jobs` (many jobs at once, a worker process each, used by the
guide and scripts/npu_vela_table.py) and `build_bundle_files` (one spec for an `--target
npu` bundle).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .fx_constants import folded_constant
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
    """A zoo encoder (a graph spec) at one static length N, or a vision spec at one image size."""
    spec: object        # graphs.GraphSpec
    seq_len: int        # a vision spec's: the tokens its image makes
    image: tuple[int, ...] | None = None  # a vision spec's static size ([F,] H, W)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def id(self) -> str:
        return f"{self.spec.name}/{'x'.join(map(str, self.image))}" if self.image else f"{self.spec.name}/T{self.seq_len}"

    @classmethod
    def for_image(cls, spec, image) -> "VelaJob":
        vision = spec.vision
        patches = ([vision.temporal_patch] if vision.video else []) + [vision.patch] * 2
        tokens = vision.prefix + int(np.prod([n // p for n, p in zip(image, patches)]))
        return cls(spec, tokens, tuple(int(n) for n in image))

    @property
    def input_shape(self) -> tuple[int, ...]:
        """x (1, N, D), or a vision spec's pixels (1, C, [F,] H, W)."""
        if self.image is not None:
            return (1, self.spec.vision.channels, *self.image)
        return (1, self.seq_len, self.spec.model.d_model)

    def refusal(self) -> str | None:
        return refusal(self.spec, self.seq_len, self.image)

    def program_module(self):
        """The module to export, of one input: positions = arange(N) held as a buffer (they
        fold), or a vision encoder fixed to this image size (PatchStem.fix_positions)."""
        import torch
        if self.image is not None:
            module = self.spec.build().eval()
            module.fix_positions(torch.zeros(self.input_shape))
            return module
        return _fixed_positions(self.spec.build(), self.seq_len).eval()

    def reference(self, x: np.ndarray) -> np.ndarray:
        """PyTorch's fp32 output of the spec's own model (positions as an input, the grid
        computed from the pixels), built apart from the exported one."""
        import torch
        with torch.no_grad():
            model = self.spec.build()
            out = model(torch.from_numpy(x)) if self.image is not None else model(torch.from_numpy(x),
                                                                                 torch.arange(self.seq_len))
        return out.numpy()


@dataclass(frozen=True)
class ModelJob:
    """A PyTorch model from outside the zoo (transformers' own vision classes): one input
    of a static shape -> hidden states. Its positions fold like a spec's when they follow
    from the static shape (a resized table, RoPE's grid, a relative bias)."""
    name: str
    build: Callable[[], object]       # a fresh torch.nn.Module in eval mode, same weights each call
    input_shape: tuple[int, ...]
    seq_len: int                      # the tokens it makes: sets the calibration count and the work order

    @property
    def id(self) -> str:
        return f"{self.name}/{'x'.join(map(str, self.input_shape[2:]))}"

    def refusal(self) -> str | None:
        return None

    def program_module(self):
        return self.build()

    def reference(self, x: np.ndarray) -> np.ndarray:
        import torch
        with torch.no_grad():
            return self.build()(torch.from_numpy(x)).numpy()


def _fixed_positions(encoder, seq_len: int):
    """encoder(x, positions) as a module of x alone, positions = arange(N) held as a buffer
    (defined here, not at module level, so that this module imports without torch)."""
    import torch

    class FixedPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder
            self.register_buffer("positions", torch.arange(seq_len), persistent=False)

        def forward(self, x):
            return self.encoder(x, self.positions)

    return FixedPositions()


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


def export_program(job, path: Path) -> dict:
    """A torch.export program of the job's module at its static input shape with every
    constant computation folded: positions = arange(N) or a fixed image grid make every
    position computation (sin/cos, RoPE tables, T5 buckets, ALiBi distances, a resized
    learned table, a relative bias) a constant, as the NPU graph needs. Identical constants
    (a bias every layer recomputes) are kept once, and a concatenation with a constant part
    becomes padded parts that are added (npu/constant_concat.py: the int8 quantizer's
    need)."""
    import warnings
    import torch
    from torch.fx.experimental.const_fold import split_const_subgraphs
    from .constant_concat import pad_constant_concats

    start = time.perf_counter()
    example = (torch.zeros(job.input_shape),)
    module = job.program_module()
    with torch.no_grad(), warnings.catch_warnings():
        # const_fold warns about every folded attribute it adds ("no underlying reference")
        warnings.simplefilter("ignore", UserWarning)
        graph = torch.export.export(module, example).module()
        folded = split_const_subgraphs(graph)
        folded.run_folding()
        shared = _share_equal_constants(folded)
        padded = pad_constant_concats(folded)
        program = torch.export.export(folded, example)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return {"export_s": time.perf_counter() - start, "shared_constants": shared, "padded_concats": padded,
            "program_bytes": path.stat().st_size}


def _share_equal_constants(gm) -> int:
    """Make every use of equal folded tensors read one of them (a bias that each layer
    recomputes folds to one constant per layer); returns how many copies went."""
    import torch
    seen: dict[tuple, tuple] = {}
    merged = 0
    for node in list(gm.graph.nodes):
        value = folded_constant(gm, node)
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


def job_data(job, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Calibration inputs, one check input and PyTorch's fp32 output for it, all
    standard-normal (for pixels: as a normalized image is fed)."""
    rng = np.random.default_rng(seed)
    calibration = rng.standard_normal((calibration_count(job.seq_len), *job.input_shape)).astype(np.float32)
    check = rng.standard_normal(job.input_shape).astype(np.float32)
    return {"calibration": calibration, "check": check, "reference": job.reference(check)}


def compile_jobs(jobs: list, *, accelerators: list[str], work_dir: Path, workers: int = 2,
                 log: Callable[[str], None] = print, python: Path | None = None,
                 timeout_s: float = 7200.0) -> list[dict]:
    """Each job (VelaJob, ModelJob) through the worker; one result per job, in order. A job
    refused here, or failed in the worker, has ok=False and the reason (the vendor's words
    for the latter); a worker crash fails its job with the crash report.

    Each job gets a worker process of its own, as a bundle's build does, `workers` at a
    time (longest first, so the loads even out), each with one thread when several run.
    While workers convert, the programs of the next jobs are exported here. (The int8
    conversion of some models is not the same from run to run even so: README, Ethos-U.)"""
    from concurrent.futures import ThreadPoolExecutor
    unknown = [a for a in accelerators if a not in ACCELERATORS]
    if unknown:
        raise ValueError(f"unknown Ethos-U accelerator(s) {unknown}; valid: {', '.join(ACCELERATORS)}")
    work_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    todo = []
    for job in jobs:
        why = job.refusal()
        if why:
            results[job.id] = {"id": job.id, "ok": False, "stage": "export", "error": why}
        else:
            todo.append(job)
    todo.sort(key=lambda j: -j.seq_len)
    threads = 1 if workers > 1 else 2
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        running = []
        for job in todo:
            stem = job.id.replace("/", "-")
            folder = work_dir / stem
            folder.mkdir(parents=True, exist_ok=True)
            log(f"  ethos-u: exporting {job.id} (positions folded)")
            info = export_program(job, folder / f"{stem}.pt2")
            np.savez(folder / f"{stem}.npz", **job_data(job))
            results[job.id] = {"id": job.id, "export": info}
            request = {"threads": threads, "vela_config": "Arm/vela.ini",
                       "jobs": [{"id": job.id, "program": f"{stem}.pt2", "data": f"{stem}.npz", "out": stem,
                                 "accelerators": [ACCELERATORS[a] for a in accelerators]}]}
            log(f"  ethos-u: {job.id}: converting, quantizing and compiling with Vela ({', '.join(accelerators)})")
            running.append(pool.submit(_run_job, request, folder, results, python, timeout_s))
        for future in running:
            future.result()  # an error of our own here is raised, not lost in its thread
    return [results[job.id] for job in jobs]


def _run_job(request: dict, folder: Path, results: dict, python, timeout_s: float) -> None:
    done, crash = _run(request, work_dir=folder, python=python, timeout_s=timeout_s)
    (job,) = request["jobs"]
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
