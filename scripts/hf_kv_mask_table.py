"""KV-cache exports with an attention mask over past + T (issue 26's table), from one run.

For each decoder and exporter: transformers' own class (tiny config of portable_pe.hf.zoo)
exported with ``export_hf(kv_cache=True, attention_mask=True)`` (the mask's dim under a
name of its own), compiled by ``portable-pe compile --target llvm`` with no hints, then a
prefill of 7 tokens and 5 one-token steps through KVCacheSession, each step's hidden
state and present K/V against transformers' DynamicCache run (max abs error per step).

    python scripts/hf_kv_mask_table.py             # 6 decoders x 2 exporters (about 6 min on 2 cores)
Writes OUT/hf_kv_mask.md (default scripts/results/hf).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ARCHS = ("llama", "qwen2", "gpt_neox", "phi3", "gemma", "mistral")
EXPORTS = (("dynamo", 18), ("torchscript", 17))


def row(arch: str, exporter: str, opset: int) -> str:
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.hf.check import generation_error
    from portable_pe.hf.export import export_hf
    from portable_pe.hf.zoo import build
    from portable_pe.run.kv_cache import KVCacheSession
    head = f"| {arch} | {exporter} {opset} |"
    with tempfile.TemporaryDirectory() as tmp:
        model, start = build(arch), time.perf_counter()
        try:
            path = export_hf(model, Path(tmp) / "m.onnx", exporter=exporter, opset=opset, kv_cache=True,
                             attention_mask=True)
        except Exception as err:  # pylint: disable=broad-except  # the exporter's failure, said as it is
            return f"{head} export fails: {str(err).strip().splitlines()[-1][:120]} | | |"
        logs: list[str] = []
        try:
            bundle = compile_graph(str(path), target="llvm", out=Path(tmp) / "b", log=logs.append)
        except Exception as err:  # pylint: disable=broad-except
            return f"{head} compile fails: {' '.join(str(err).split())[:200]} | | |"
        errors = generation_error(KVCacheSession(bundle), model, prefill=7, steps=5)
        learned = "; ".join(r["dim"] + " = " + " + ".join(r["terms"]) for r in bundle.manifest.get("dim_relations", []))
        return f"{head} {learned} | {' '.join(f'{e:.1e}' for e in errors)} | {time.perf_counter() - start:.0f} s |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--out", default="scripts/results/hf")
    args = parser.parse_args(argv)
    lines = ["| decoder | exporter | relation learned | max abs per step (prefill 7, then 5 steps) | export + compile + run |",
             "|---|---|---|---|---|"]
    for arch in args.archs.split(","):
        for exporter, opset in EXPORTS:
            lines.append(row(arch, exporter, opset))
            print(lines[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_kv_mask.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
