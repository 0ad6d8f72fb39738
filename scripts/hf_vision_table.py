"""Hugging Face vision encoders at dynamic image sizes, from one run on the current code.

For each tiny vision model of portable_pe.hf.vision and each exporter: the export (H and
W dynamic), onnxruntime on the file at the traced size and at a second size against
PyTorch (an export that fails there was specialized by PyTorch), then
``portable-pe compile --target llvm`` with no --shape, and the one bundle run at three
sizes against PyTorch. A refusal is shown with its first words.

    python scripts/hf_vision_table.py                     # every model, both exporters (about 10 min)
    python scripts/hf_vision_table.py --archs vit,dinov3 --exporters dynamo
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
from portable_pe.hf.vision import EXPORTERS, IMAGE, VISION_ARCHITECTURES  # noqa: E402

SECOND = (48, 64)
SIZES = ((32, 48), (48, 64), (64, 64))


def _words(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:200].replace("|", "/")


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
        return "refused", _words(err)
    runner, errors = LocalRunner(bundle), []
    for h, w in SIZES:
        x = _pixels(h, w, h + w)
        try:
            got = next(iter(runner.run({"pixel_values": x}).values()))
            errors.append(f"{h}x{w}: {np.abs(got - _torch(module, x)).max():.1e}")
        except Exception as err:  # pylint: disable=broad-except
            errors.append(f"{h}x{w}: {_words(err)[:80]}")
    return "compiled", "; ".join(errors)


def main(argv=None) -> int:
    from portable_pe.hf.vision import export_vision
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(VISION_ARCHITECTURES))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--out", default="scripts/results/hf")
    args = parser.parse_args(argv)
    rows = []
    for arch in args.archs.split(","):
        for exporter in args.exporters.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                try:
                    module, path = export_vision(arch, folder / "model.onnx", exporter=exporter)
                except Exception as err:  # pylint: disable=broad-except
                    rows.append({"arch": arch, "exporter": exporter, "onnxruntime": f"export fails: {_words(err)}",
                                 "portable_pe": "-", "detail": ""})
                    continue
                ort_text = onnxruntime_row(module, path)
                result, detail = portable_pe_row(module, path, folder)
            rows.append({"arch": arch, "exporter": exporter, "onnxruntime": ort_text,
                         "portable_pe": result, "detail": detail})
            print(f"{arch:8s} {exporter:11s} | ort {ort_text} | {result}: {detail}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| model | exporter | onnxruntime vs PyTorch (traced 32x32, second size) | portable-pe llvm | "
             "bundle vs PyTorch, or the refusal |", "|---|---|---|---|---|"]
    lines += [f"| {r['arch']} | {r['exporter']} | {r['onnxruntime']} | {r['portable_pe']} | {r['detail']} |" for r in rows]
    (out / "hf_vision.md").write_text("\n".join(lines) + "\n")
    (out / "hf_vision.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
