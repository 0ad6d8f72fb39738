"""The Hugging Face tables of issue 13, from one run on the current code.

1. architecture x exporter x opset: transformers' own classes (tiny configs from
   portable_pe.hf.zoo, random weights, exported here with a dynamic length), each file
   through raw TVM (``relax_onnx.from_onnx`` + ``tvm.compile``, no legalize, no
   portable-pe converters) and through ``portable-pe compile --target llvm``; both run
   at three lengths the export never saw, max abs error against PyTorch.
2. KV cache: every decoder's cache export, prefill of 7 tokens then 5 one-token steps
   (each step's present K/V fed back), max abs error per step against transformers'
   own generation-time run.
3. bench: a Llama-style export (width 256, 4 layers, GQA) at B=1, T=128, compiled by
   portable-pe (float32, and --precision bf16 on a CPU with bf16 instructions), against
   onnxruntime (default settings) and OpenVINO (default, and f32) on the same file, timed
   in alternating blocks.

    python scripts/hf_table.py                       # everything (about an hour on 2 cores)
    python scripts/hf_table.py --archs llama,bert --no-bench
Writes OUT/hf_table.md and OUT/hf_table.json (default scripts/results/hf), row by row.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from portable_pe.hf.zoo import ARCHITECTURES  # noqa: E402
from portable_pe.host_cpu import cpu_summary  # noqa: E402

EXPORTS = {"dynamo18": ("dynamo", 18), "dynamo23": ("dynamo", 23), "torchscript17": ("torchscript", 17)}
LENGTHS = (5, 37, 100)
TOL = 1e-4


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(err).__name__
    return f"{type(err).__name__}: {text}"[:160].replace("|", "/")


class VMRunner:
    """A compiled Relax module on named inputs, like runtime.LocalRunner."""

    def __init__(self, executable, input_names, output_names):
        import tvm
        from tvm import relax
        self.vm = relax.VirtualMachine(executable, tvm.cpu())
        self.inputs, self.outputs = input_names, output_names

    def run(self, inputs):
        import tvm
        out = self.vm["main"](*[tvm.runtime.tensor(inputs[n]) for n in self.inputs])
        values = [out] if hasattr(out, "numpy") else list(out)
        return {n: v.numpy() for n, v in zip(self.outputs, values)}


def raw_tvm(path: Path, model) -> str:
    """Plain relax_onnx.from_onnx + tvm.compile on the exported file, then parity."""
    import onnx
    import tvm
    from tvm.relax.frontend import onnx as relax_onnx
    from portable_pe.hf.check import lengths_error
    graph = onnx.load(str(path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = relax_onnx.from_onnx(graph, keep_params_in_input=False)
    except Exception as err:  # pylint: disable=broad-except
        return f"import fails: {_first_line(err)}"
    try:
        ex = tvm.compile(mod, target="llvm")
    except Exception as err:  # pylint: disable=broad-except
        return f"build fails: {_first_line(err)}"
    try:
        runner = VMRunner(ex, [i.name for i in graph.graph.input], [o.name for o in graph.graph.output])
        err = max(lengths_error(runner, model, LENGTHS).values())
    except Exception as err:  # pylint: disable=broad-except
        return f"run fails: {_first_line(err)}"
    return f"{'ok' if err <= TOL else 'WRONG'} {err:.1e}"


def ours(path: Path, model, out: Path) -> tuple[str, float | None]:
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.hf.check import lengths_error
    from portable_pe.run.local import LocalRunner
    try:
        bundle = compile_graph(str(path), target="llvm", out=out, log=lambda m: None)
    except Exception as err:  # pylint: disable=broad-except
        return f"compile fails: {_first_line(err)}", None
    err = max(lengths_error(LocalRunner(bundle), model, LENGTHS).values())
    return f"{'ok' if err <= TOL else 'WRONG'} {err:.1e}", err


def table_row(arch: str, key: str, work: Path) -> dict:
    from portable_pe.hf.export import export_hf
    from portable_pe.hf.zoo import build
    exporter, opset = EXPORTS[key]
    model = build(arch)
    row = {"arch": arch, "positions": ARCHITECTURES[arch].positions, "export": key}
    start = time.perf_counter()
    try:
        path = export_hf(model, work / f"{arch}-{key}.onnx", exporter=exporter, opset=opset)
    except Exception as err:  # pylint: disable=broad-except
        row.update(export_s=round(time.perf_counter() - start, 1), raw="-", ours=f"export fails: {_first_line(err)}")
        return row
    row["export_s"] = round(time.perf_counter() - start, 1)
    row["raw"] = raw_tvm(path, model)
    start = time.perf_counter()
    row["ours"], row["max_abs"] = ours(path, model, work / f"{arch}-{key}-bundle")
    row["compile_s"] = round(time.perf_counter() - start, 1)
    return row


def kv_row(arch: str, key: str, work: Path) -> dict:
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.hf.check import generation_error
    from portable_pe.hf.export import export_hf
    from portable_pe.hf.zoo import build
    from portable_pe.run.kv_cache import KVCacheSession
    exporter, opset = EXPORTS[key]
    model = build(arch)
    row = {"arch": arch, "export": key}
    try:
        path = export_hf(model, work / f"{arch}-{key}-kv.onnx", exporter=exporter, opset=opset, kv_cache=True)
    except Exception as err:  # pylint: disable=broad-except
        return {**row, "result": f"export fails: {_first_line(err)}"}
    try:
        bundle = compile_graph(str(path), target="llvm", out=work / f"{arch}-{key}-kv-bundle", log=lambda m: None)
    except Exception as err:  # pylint: disable=broad-except
        return {**row, "result": f"compile fails: {_first_line(err)}"}
    try:
        steps = generation_error(KVCacheSession(bundle), model, prefill=7, steps=5)
    except Exception as err:  # pylint: disable=broad-except
        return {**row, "result": f"run fails: {_first_line(err)}"}
    return {**row, "steps": steps, "result": f"{'ok' if max(steps) <= TOL else 'WRONG'} {max(steps):.1e}"}


def bench_row(work: Path, *, blocks: int, runs: int) -> dict:
    """Llama-style export at B=1, T=128: portable-pe's float32 build, and its --precision bf16
    build where this CPU has bf16 instructions, against onnxruntime (defaults) and OpenVINO
    (its default, bf16 compute on bf16 CPUs, and asked for f32) on the same file,
    alternating blocks of `runs` calls each, medians of the per-call times."""
    import onnxruntime as ort
    import openvino as ov
    import torch
    import transformers
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.hf.check import token_ids, torch_hidden
    from portable_pe.hf.export import export_hf
    from portable_pe.run.local import LocalRunner
    from portable_pe.threads import physical_cores
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    path = export_hf(model, work / "llama-bench.onnx", exporter="dynamo", opset=18)
    bundles = {"tvm": compile_graph(str(path), target="llvm", out=work / "llama-bench-bundle", log=lambda m: None)}
    try:
        bundles["tvm-bf16"] = compile_graph(str(path), target="llvm", out=work / "llama-bench-bf16", precision="bf16",
                                            log=lambda m: None)
    except ValueError as err:  # a CPU without bf16 instructions: the row says why
        bf16_missing = str(err)
    else:
        bf16_missing = None
    ids = token_ids(model, 128, seed=7)
    want = torch_hidden(model, ids)
    import tvm
    engines, outputs = {}, {}
    for name, bundle in bundles.items():
        runner = LocalRunner(bundle)
        outputs[name] = runner.run({"input_ids": ids})["last_hidden_state"]
        main, arg = runner.vm["main"], tvm.runtime.tensor(ids)
        engines[name] = (lambda m, a: lambda: m(a))(main, arg)
    session = ort.InferenceSession(str(path))  # default settings: all cores, spinning pool
    outputs["onnxruntime"] = session.run(None, {"input_ids": ids})[0]
    engines["onnxruntime"] = lambda: session.run(None, {"input_ids": ids})
    for name, config_ov in (("openvino", {}), ("openvino-f32", {"INFERENCE_PRECISION_HINT": "f32"})):
        compiled = ov.Core().compile_model(str(path), "CPU", config_ov)
        request = compiled.create_infer_request()
        outputs[name] = np.asarray(request.infer({"input_ids": ids})[compiled.outputs[0]])
        engines[name] = (lambda r: lambda: r.infer({"input_ids": ids}))(request)
    times = {name: [] for name in engines}
    for name, fn in engines.items():  # warm-up
        for _ in range(3):
            fn()
    for block in range(blocks):
        order = list(engines) if block % 2 == 0 else list(reversed(engines))
        for name in order:
            for _ in range(runs):
                t = time.perf_counter()
                engines[name]()
                times[name].append(time.perf_counter() - t)
    med = {name: float(np.median(v)) * 1e3 for name, v in times.items()}

    def cosine(a, b):
        a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return {"config": "LlamaModel hidden 256, 4 layers, 8 heads (4 KV), ffn 688, dynamo opset 18",
            "B": 1, "T": 128, "median_ms": med, "ratio_tvm_to_ort": med["tvm"] / med["onnxruntime"],
            "ratio_bf16_to_openvino": med["tvm-bf16"] / med["openvino"] if "tvm-bf16" in med else None,
            "bf16_missing": bf16_missing,
            "max_abs_vs_torch": {name: float(np.abs(out - want).max()) for name, out in outputs.items()},
            "cosine_vs_torch": {name: cosine(out, want) for name, out in outputs.items()},
            "openvino_default_precision": str(ov.Core().compile_model(str(path), "CPU").get_property(
                "INFERENCE_PRECISION_HINT")),
            "blocks": blocks, "runs_per_block": runs,
            "threads": f"defaults: TVM {tvm.get_global_func('runtime.NumThreads')()} (portable_pe sizes its pool "
                       f"by physical cores), onnxruntime one per physical core ({physical_cores()}), "
                       f"OpenVINO its own (every core)"}


def to_markdown(result: dict) -> str:
    lines = [f"HF architectures (transformers {result['versions']['transformers']}, torch "
             f"{result['versions']['torch']}), llvm on {result['machine']}; max abs vs PyTorch at "
             f"T={list(LENGTHS)} (export traced at T=16), tolerance {TOL:g}.", "",
             "| architecture | positions | export | raw TVM from_onnx | portable-pe | export s | compile s |",
             "|---|---|---|---|---|---:|---:|"]
    for r in result["table"]:
        lines.append(f"| {r['arch']} | {r['positions']} | {r['export']} | {r['raw']} | {r['ours']} | "
                     f"{r.get('export_s', '')} | {r.get('compile_s', '')} |")
    if result.get("kv"):
        lines += ["", "KV cache: prefill 7 tokens, then 5 one-token steps; max abs per step (hidden state "
                  "and present K/V) vs transformers with DynamicCache.", "",
                  "| architecture | export | result | per step |", "|---|---|---|---|"]
        for r in result["kv"]:
            steps = ", ".join(f"{e:.1e}" for e in r.get("steps", []))
            lines.append(f"| {r['arch']} | {r['export']} | {r['result']} | {steps} |")
    if result.get("bench"):
        b = result["bench"]
        lines += ["", f"bench: {b['config']}, B={b['B']} T={b['T']}; median ms of {b['blocks']} alternating blocks "
                  f"of {b['runs_per_block']} runs; threads {b['threads']}; OpenVINO's default precision here: "
                  f"{b['openvino_default_precision']}" + (f"; no bf16 build: {b['bf16_missing']}" if b["bf16_missing"] else ""),
                  "", "| engine | median ms | cosine vs PyTorch | max abs vs PyTorch |", "|---|---:|---:|---:|"]
        for name, ms in b["median_ms"].items():
            lines.append(f"| {name} | {ms:.2f} | {b['cosine_vs_torch'][name]:.6f} | {b['max_abs_vs_torch'][name]:.1e} |")
        lines += ["", f"tvm / onnxruntime = {b['ratio_tvm_to_ort']:.2f}"
                  + (f"; tvm-bf16 / openvino (default) = {b['ratio_bf16_to_openvino']:.2f}"
                     if b["ratio_bf16_to_openvino"] is not None else "")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", default=",".join(ARCHITECTURES), help="comma-separated (default: all)")
    parser.add_argument("--exports", default=",".join(EXPORTS), help=f"comma-separated of {','.join(EXPORTS)}")
    parser.add_argument("--kv-archs", default=None, help="decoders for the KV table (default: every decoder asked)")
    parser.add_argument("--no-kv", action="store_true")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("scripts/results/hf"))
    parser.add_argument("--work", type=Path, help="folder for the exports and bundles (default: a temporary one)")
    args = parser.parse_args()
    from portable_pe.threads import default_tvm_threads
    default_tvm_threads()  # the raw TVM builds share the process's pool with portable-pe's
    import torch
    import transformers
    archs, exports = args.archs.split(","), args.exports.split(",")
    bad = sorted(set(archs) - set(ARCHITECTURES)) + sorted(set(exports) - set(EXPORTS))
    if bad:
        parser.error(f"unknown {bad}; architectures: {', '.join(ARCHITECTURES)}; exports: {', '.join(EXPORTS)}")
    kv_archs = args.kv_archs.split(",") if args.kv_archs else [a for a in archs if ARCHITECTURES[a].decoder]
    result = {"versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
              "machine": cpu_summary(), "table": [], "kv": []}
    args.out.mkdir(parents=True, exist_ok=True)

    def save():
        (args.out / "hf_table.json").write_text(json.dumps(result, indent=1))
        (args.out / "hf_table.md").write_text(to_markdown(result))

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for arch in archs:
            for key in exports:
                row = table_row(arch, key, work)
                result["table"].append(row)
                print(f"{arch} {key}: raw {row['raw']} | ours {row['ours']}", flush=True)
                save()
        for arch in [] if args.no_kv else kv_archs:
            for key in exports:
                row = kv_row(arch, key, work)
                result["kv"].append(row)
                print(f"kv {arch} {key}: {row['result']}", flush=True)
                save()
        if not args.no_bench:
            result["bench"] = bench_row(work, blocks=args.blocks, runs=args.runs)
            print(f"bench: {result['bench']}", flush=True)
            save()
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
