"""Hugging Face vision (and audio) encoders at several sizes, from one run on the current code.

For each tiny vision model of portable_pe.hf.vision and each exporter: the export (H and
W dynamic), onnxruntime on the file at the traced size and at a second size against
PyTorch (an export that fails there was specialized by PyTorch), then
``portable-pe compile --target llvm`` with no --shape, and the one bundle run at three
sizes against PyTorch. A refusal is shown with its first words.

The models of portable_pe.hf.per_size hold one size per export (Qwen2.5-VL's vision tower:
a grid; Llama-4's vision model: an image side; Whisper's encoder: a frame count). Each
gets a "dynamic" row (the size axes symbolic, as a user would export it first: the
compile must refuse it with the fix) and a "per size" row (one static export per size,
each compiled and run against PyTorch at its size).

The last column is TVM's own importer on the same file (for a per-size row, the traced
size's), as a user would run it by hand: onnxsim with dynamic shapes kept, then
``tvm.relax.frontend.onnx.from_onnx``, ``tvm.compile(target="llvm")`` and one run against
PyTorch (at the second size for a dynamic row, at the traced size for a per-size one).

    python scripts/hf_vision_table.py                     # every model, both exporters (about 25 min)
    python scripts/hf_vision_table.py --archs vit,whisper --exporters dynamo
Writes OUT/hf_vision.md and OUT/hf_vision.json (default scripts/results/hf).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from portable_pe.hf.per_size import PER_SIZE_ARCHITECTURES  # noqa: E402
from portable_pe.hf.vision import EXPORTERS, IMAGE, VISION_ARCHITECTURES  # noqa: E402

SECOND = (48, 64)
SIZES = ((32, 48), (48, 64), (64, 64))


def _words(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:200].replace("|", "/")


def _refusal(err: BaseException) -> str:
    """A refusal's first words and its fix (from "Export once" on)."""
    text = " ".join(str(err).split()).replace("|", "/")
    fix = text.find("Export once")
    return _words(err) if fix < 0 else f"{text[:110]} ... {text[fix:]}"


def _torch(module, pixels):
    import torch
    with torch.no_grad():
        return module(torch.from_numpy(pixels)).numpy()


def _pixels(h, w, seed):
    return np.random.default_rng(seed).standard_normal((1, 3, h, w)).astype(np.float32)


def onnxruntime_row(module, path) -> str:
    from portable_pe.compile.simplify import onnxruntime_words, ort_session
    session = ort_session(str(path), quiet=True)
    out = []
    for h, w in ((IMAGE, IMAGE), SECOND):
        x = _pixels(h, w, h * w)
        try:
            got = session.run(None, {"pixel_values": x})[0]
            out.append(f"{h}x{w}: {np.abs(got - _torch(module, x)).max():.1e}")
        except Exception as err:  # pylint: disable=broad-except
            out.append(f"{h}x{w}: fails ({onnxruntime_words(err)[:90]})")
    return "; ".join(out)


def portable_pe_row(module, path, folder) -> tuple[str, str]:
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.local import LocalRunner
    try:
        bundle = compile_graph(str(path), target="llvm", out=folder / "bundle", log=lambda m: None)
    except Exception as err:  # pylint: disable=broad-except
        return "refused", _refusal(err)
    runner, errors = LocalRunner(bundle), []
    for h, w in SIZES:
        x = _pixels(h, w, h + w)
        try:
            got = next(iter(runner.run({"pixel_values": x}).values()))
            errors.append(f"{h}x{w}: {np.abs(got - _torch(module, x)).max():.1e}")
        except Exception as err:  # pylint: disable=broad-except
            errors.append(f"{h}x{w}: {_words(err)[:80]}")
    return "compiled", "; ".join(errors)


def raw_tvm(path, feeds: dict, want: np.ndarray, label: str) -> str:
    """TVM's own ONNX import of `path` as a user would run it: onnxsim (dynamic shapes
    kept), from_onnx, build for llvm, one run at `feeds` against `want`."""
    import onnx
    import onnxsim
    import tvm
    from tvm import relax
    from tvm.relax.frontend import onnx as relax_onnx
    model = onnx.load(str(path))
    try:
        model, _ = onnxsim.simplify(model)
    except Exception as err:  # pylint: disable=broad-except
        return f"onnxsim fails: {_words(err)[:120]}"
    try:
        mod = relax_onnx.from_onnx(model, keep_params_in_input=False)
    except Exception as err:  # pylint: disable=broad-except
        return f"import fails: {_last_words(err)}"
    try:
        ex = tvm.compile(mod, target="llvm")
    except Exception as err:  # pylint: disable=broad-except
        return f"imports; build fails: {_last_words(err)}"
    names = [i.name for i in model.graph.input]
    try:
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(feeds[n]) for n in names))
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        return f"builds; {label}: {np.abs(got - want).max():.1e}" if got.shape == want.shape else \
            f"builds; {label}: shape {got.shape}, PyTorch {want.shape}"
    except Exception as err:  # pylint: disable=broad-except
        return f"builds; {label}: run fails: {_last_words(err)}"


def _last_words(err: BaseException) -> str:
    if err.__cause__ is not None:  # torch.onnx's TorchExportError: torch.export's own error, first line
        lines = [f"{type(err.__cause__).__name__}: {str(err.__cause__).strip().splitlines()[0]}"]
        return _words(Exception(lines[0]))[:160]
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return _words(Exception(lines[-1] if lines else type(err).__name__))[:160]


def vision_row(arch: str, exporter: str, folder: Path) -> dict:
    from portable_pe.hf.vision import export_vision
    row = {"arch": arch, "exporter": exporter}
    try:
        module, path = export_vision(arch, folder / "model.onnx", exporter=exporter)
    except Exception as err:  # pylint: disable=broad-except
        return {**row, "mode": "dynamic", "onnxruntime": f"export fails: {_words(err)}", "portable_pe": "-",
                "detail": "", "raw_tvm": "-"}
    ort_text = onnxruntime_row(module, path)
    result, detail = portable_pe_row(module, path, folder)
    x = _pixels(*SECOND, 7)
    raw = raw_tvm(path, {"pixel_values": x}, _torch(module, x), "x".join(map(str, SECOND)))
    mode = "dynamic" if result == "compiled" else "dynamic export specialized by PyTorch: refused"
    return {**row, "mode": mode, "onnxruntime": ort_text, "portable_pe": result, "detail": detail, "raw_tvm": raw}


def per_size_rows(arch_name: str, exporter: str, folder: Path) -> list[dict]:
    """The dynamic export (which the compile must refuse), then one static export per size."""
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.compile.simplify import onnxruntime_words, ort_session
    from portable_pe.hf.per_size import export_per_size, torch_output
    from portable_pe.run.local import LocalRunner
    arch = PER_SIZE_ARCHITECTURES[arch_name]
    traced, second = arch.sizes[0], arch.sizes[1]
    row = {"arch": arch_name, "exporter": exporter}

    def ort_error(session, size):
        feeds = arch.inputs(size, 1)
        names = [i.name for i in session.get_inputs()]
        try:
            got = session.run(None, {n: feeds[n] for n in names})[0]
        except Exception as err:  # pylint: disable=broad-except
            return f"{arch.label(size)}: fails ({onnxruntime_words(err)[:90]})"
        return f"{arch.label(size)}: {np.abs(got - torch_output(module, feeds)).max():.1e}"

    rows = []
    try:  # the dynamic export
        module, path = export_per_size(arch_name, traced, folder / "dynamic.onnx", exporter=exporter, dynamic=True)
    except Exception as err:  # pylint: disable=broad-except
        rows.append({**row, "mode": "dynamic", "onnxruntime": f"export fails: {_last_words(err)}",
                     "portable_pe": "-", "detail": "", "raw_tvm": "-"})
    else:
        session = ort_session(str(path), quiet=True)
        ort_text = f"{ort_error(session, traced)}; {ort_error(session, second)}"
        try:
            compile_graph(str(path), target="llvm", out=folder / "dynamic", log=lambda m: None)
            result, detail = "compiled", "(a bundle from a specialized export: wrong)"
        except Exception as err:  # pylint: disable=broad-except
            result, detail = "refused", _refusal(err)
        feeds = arch.inputs(second, 7)
        raw = raw_tvm(path, feeds, torch_output(arch.build(second), feeds), arch.label(second))
        rows.append({**row, "mode": "dynamic", "onnxruntime": ort_text, "portable_pe": result, "detail": detail,
                     "raw_tvm": raw})
    errors, ort_text, raw, result = [], [], "-", "compiled"
    for size in arch.sizes:  # one export per size
        try:
            module, path = export_per_size(arch_name, size, folder / f"{size}.onnx", exporter=exporter)
        except Exception as err:  # pylint: disable=broad-except
            errors.append(f"{arch.label(size)}: export fails: {_last_words(err)}")
            result = "-"
            break
        ort_text.append(ort_error(ort_session(str(path), quiet=True), size))
        try:
            bundle = compile_graph(str(path), target="llvm", out=folder / f"b{len(errors)}", log=lambda m: None)
            feeds = arch.inputs(size, 3)
            got = next(iter(LocalRunner(bundle).run({i["name"]: feeds[i["name"]]
                                                     for i in bundle.manifest["inputs"]}).values()))
            errors.append(f"{arch.label(size)}: {np.abs(got - torch_output(module, feeds)).max():.1e}")
        except Exception as err:  # pylint: disable=broad-except
            errors.append(f"{arch.label(size)}: {_words(err)[:120]}")
            result = "refused"
        if size == traced:
            feeds = arch.inputs(size, 7)
            raw = raw_tvm(path, feeds, torch_output(module, feeds), arch.label(size))
    rows.append({**row, "mode": f"per size: {arch.why}", "onnxruntime": "; ".join(ort_text), "portable_pe": result,
                 "detail": "; ".join(errors), "raw_tvm": raw})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join([*VISION_ARCHITECTURES, *PER_SIZE_ARCHITECTURES]))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--out", default="scripts/results/hf")
    args = parser.parse_args(argv)
    rows = []
    for arch in args.archs.split(","):
        for exporter in args.exporters.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                new = (per_size_rows(arch, exporter, Path(tmp)) if arch in PER_SIZE_ARCHITECTURES
                       else [vision_row(arch, exporter, Path(tmp))])
            for r in new:
                print(f"{arch:10s} {exporter:11s} {r['mode'][:30]:30s} | ort {r['onnxruntime']} | "
                      f"{r['portable_pe']}: {r['detail']} | raw TVM: {r['raw_tvm']}", flush=True)
            rows += new
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| model | exporter | dynamic, or per size and why | onnxruntime vs PyTorch (traced size, second size) "
             "| portable-pe llvm | bundle vs PyTorch, or the refusal | raw TVM: onnxsim + from_onnx + build, one run |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['arch']} | {r['exporter']} | {r['mode']} | {r['onnxruntime']} | {r['portable_pe']} | "
              f"{r['detail']} | {r['raw_tvm']} |" for r in rows]
    (out / "hf_vision.md").write_text("\n".join(lines) + "\n")
    (out / "hf_vision.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
