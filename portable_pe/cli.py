"""`portable-pe`: a thin layer over the library. Heavy imports happen inside commands, so
`--help` and `list` stay instant."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: export.EXPORTERS with the default first, spelled out because importing export.py loads
#: torch (a test keeps the two the same)
EXPORTER_CHOICES = ("torchscript", "dynamo")


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,7,128, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return values


def _guide_targets(text: str) -> str:
    from .guide import GUIDE_TARGETS
    bad = [t for t in text.split(",") if t not in GUIDE_TARGETS]
    if bad or not text:
        raise argparse.ArgumentTypeError(f"unknown guide target(s) {bad or [text]}; valid: {', '.join(GUIDE_TARGETS)}")
    return text


def _shape(text: str) -> tuple[str, list[int]]:
    name, _, dims = text.partition("=")
    try:
        return name, [int(d) for d in dims.split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape expects NAME=1x128, got {text!r}") from None


def _print_report(report, json_path: str | None) -> int:
    print(report.to_markdown())
    if json_path:
        Path(json_path).write_text(report.to_json())
        print(f"(JSON report written to {json_path})")
    return 0 if report.ok else 1


def cmd_compile(args) -> int:
    from .compile import compile_graph
    from .parity import DEFAULT_LENGTHS, check_bundle
    print(f"compiling {args.graph} for target {args.target}"
          f"{' -> ' + str(args.out) if args.out else ''}", flush=True)
    options = {k: v for k, v in (("board", args.board), ("arch", args.arch), ("profile", args.profile),
                                 ("seq_len", args.seq_len), ("host", args.host)) if v}
    bundle = compile_graph(args.graph, target=args.target, out=args.out,
                           keep_intermediates=args.keep_intermediates, shapes=dict(args.shape or []),
                           target_options=options, pe_tables=args.pe_tables, tuning=not args.no_tuning,
                           exporter=args.exporter, log=lambda m: print(m, flush=True))
    runner = _local_runner(bundle)
    if runner is None and bundle.manifest["reference"]["source"] == "onnxruntime":
        return 0  # onnxruntime is the reference: nothing else to compare here
    return _print_report(check_bundle(bundle, lengths=args.lengths or DEFAULT_LENGTHS, tvm_runner=runner,
                                      candidates=("onnxruntime", "tvm") if runner else ("onnxruntime",)), args.json)


def _local_runner(bundle):
    """The bundle's module loaded here, or None (with a note) for a board or a missing GPU."""
    from .artifact import BundleError
    from .runtime import LocalRunner
    try:
        return LocalRunner(bundle).run
    except BundleError as err:
        print(f"note: the compiled module is not run here: {err}", flush=True)
        return None


def cmd_deploy(args) -> int:
    from .deploy import deploy
    report = deploy(args.bundle, rpc=args.rpc, tracker=args.tracker, key=args.key, timeout=args.timeout,
                    log=lambda m: print(m, flush=True))
    return _print_report(report, args.json)


def _option_choices(option: str) -> list[str]:
    """The values targets/*.toml declare for a compile option (e.g. every target's boards)."""
    from .targets import TARGETS, load_target
    return [c for name in TARGETS for c in load_target(name).options.get(option, {}).get("choices", {})]


def cmd_tune(args) -> int:
    from .tune import rpc_runner, tune_graph
    if args.recheck:
        from .tune import recheck_graph
        recheck_graph(args.graph, target=args.target, log=lambda m: print(m, flush=True))
        return 0
    runner = rpc_runner(args.rpc_tracker, args.rpc_key) if args.rpc_tracker else None
    for batch in args.batch:
        for seq in args.lengths:
            result = tune_graph(args.graph, target=args.target, batch=batch, seq=seq, trials=args.trials,
                                only=args.only, runner=runner, log=lambda m: print(m, flush=True))
            print(f"tuned {result.tasks} kernel(s) at batch={batch} seq={seq} in {result.seconds:.0f} s "
                  f"-> {result.db_dir}")
    print("`portable-pe compile` applies this database automatically (`--no-tuning` to skip it)")
    return 0


def cmd_parity(args) -> int:
    from .artifact import load_bundle
    from .parity import DEFAULT_LENGTHS, check_bundle
    bundle = load_bundle(args.bundle)
    return _print_report(check_bundle(bundle, lengths=args.lengths or DEFAULT_LENGTHS, batch=args.batch), args.json)


def cmd_run(args) -> int:
    import numpy as np
    from .artifact import load_bundle
    from .runtime import run_local
    bundle = load_bundle(args.bundle)
    path = Path(args.inputs)
    if not path.is_file():
        raise FileNotFoundError(f"inputs file {path} does not exist")
    with np.load(path) as data:
        inputs = {k: data[k] for k in data.files}
    outputs = run_local(bundle, inputs)
    np.savez(args.out, **outputs)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
    print(f"wrote {args.out}")
    return 0


def inspect_onnx(path: Path) -> int:
    """What a compile would meet: inputs, ops, and the nodes that would block the import."""
    import onnx
    from collections import Counter
    from .frontend import blocking_nodes
    if not path.is_file():
        raise FileNotFoundError(f"ONNX file {path} does not exist")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf DecodeError and friends
        raise ValueError(f"{path} is not a valid ONNX model: {err}") from None
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    print(f"onnx {path}: {len(model.graph.node)} nodes, opsets: {opsets}, producer {model.producer_name or '?'}")
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for vi in values:
            dims = [d.dim_param or d.dim_value or "?" for d in vi.type.tensor_type.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) if vi.type.tensor_type.elem_type else "?"
            print(f"  {kind:6} {vi.name}: {dtype}[{', '.join(map(str, dims))}]")
    print("  ops: " + ", ".join(f"{op} x{n}" for op, n in Counter(n.op_type for n in model.graph.node).most_common()))
    blocked = blocking_nodes(model)
    if not blocked:
        print("  import: every node has a converter (TVM's or portable-pe's)")
        return 0
    print(f"  import: {len(blocked)} node(s) would block compilation:")
    for b in blocked:
        print(f"    {b['node']}: {b['op']} ({b['domain'] or 'ai.onnx'} opset {b['opset']}): {b['reason']}")
    return 1


def cmd_inspect(args) -> int:
    from .artifact import load_bundle
    if Path(args.bundle).suffix == ".onnx":
        return inspect_onnx(Path(args.bundle))
    bundle = load_bundle(args.bundle)
    m = bundle.manifest
    print(f"bundle {bundle.path}: graph {m['graph']['name']} ({m['graph']['source']}), "
          f"encoding {m['encoding']}, target {m['target']['name']}")
    print(f"  tvm target: {json.dumps(m['target']['tvm'])}")
    for kind in ("inputs", "outputs"):
        for io in m[kind]:
            print(f"  {kind[:-1]:6} {io['name']}: {io['dtype']}[{', '.join(map(str, io['dims']))}]")
    for dim, info in m.get("dims", {}).items():
        print(f"  dim {dim} ({info['role']}): {info['min']}..{info['max']} {info.get('why', '')}")
    print(f"  simplify: {m['simplify'].get('nodes_before')} -> {m['simplify'].get('nodes_after')} nodes")
    print(f"  reference: {m['reference']['source']} at T={m['reference']['lengths']}")
    print(f"  versions: {m['versions']}")
    print("  files: " + ", ".join(f"{n} (sha256 {h[:12]})" for n, h in m["files"].items()) + " [verified]")
    return 0


def cmd_list(args) -> int:
    from .encodings import ENCODING_NOTES
    from .graphs import DEFAULT_GRAPH, GRAPHS
    from .targets import TARGETS, load_target
    print("graphs:")
    for name, path in GRAPHS.items():
        print(f"  {name}{' (default)' if name == DEFAULT_GRAPH else ''}  {path}")
    print("encodings:")
    for name, note in ENCODING_NOTES.items():
        print(f"  {name:<11} {note}")
    print("targets:")
    for name in TARGETS:
        spec = load_target(name)
        print(f"  {name:<5} {spec.description}{'  [not yet: ' + spec.planned + ']' if spec.planned else ''}")
    return 0


def cmd_bench(args) -> int:
    from .bench import Settings, bench_graph
    settings = Settings(lengths=tuple(args.lengths), batches=tuple(args.batch), threads=args.threads,
                        repeat=args.repeat, min_time_s=args.min_time, engines=tuple(args.engines.split(",")))
    out = args.out or Path("dist") / f"bench-{Path(args.graph).stem}"
    result = bench_graph(args.graph, settings=settings, tuned=args.tuned, bundle=args.bundle, out=out,
                         log=lambda m: print(m, flush=True))
    print(result.to_markdown())
    print(f"(wrote {out / 'bench.json'}, bench.md and bench.png)")
    return 0 if all(c.ok is not False for c in result.cells) else 1


def cmd_guide(args) -> int:
    from .guide import render_from, run_guide
    if args.from_json:
        print(f"wrote {render_from(Path(args.from_json), args.out)}")
        return 0
    run_guide(graphs=args.graphs, targets=tuple(args.targets.split(",")), lengths=tuple(args.lengths),
              batches=tuple(args.batch), out=args.out or Path("dist/guide"), threads=args.threads,
              repeat=args.repeat, keep_work=args.keep_work, command="portable-pe " + " ".join(sys.argv[1:]),
              log=lambda m: print(m, flush=True))
    return 0


COMMANDS = {"compile": cmd_compile, "guide": cmd_guide, "parity": cmd_parity, "run": cmd_run,
            "inspect": cmd_inspect, "list": cmd_list, "tune": cmd_tune, "deploy": cmd_deploy, "bench": cmd_bench}


def build_parser() -> argparse.ArgumentParser:
    from .guide import GUIDE_TARGETS
    from .targets import TARGETS
    parser = argparse.ArgumentParser(prog="portable-pe", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a graph into a checked bundle and print its parity report")
    p.add_argument("graph", help="shipped graph name (see `portable-pe list`), a .toml spec, or an .onnx file")
    p.add_argument("--target", default="llvm", choices=list(TARGETS))
    p.add_argument("--out", type=Path, help="bundle folder (default: dist/<graph>-<target>)")
    p.add_argument("--keep-intermediates", action="store_true", help="dump each stage's output beside the bundle")
    p.add_argument("--shape", action="append", type=_shape, metavar="NAME=1x128", help="fix an ONNX input's dims")
    p.add_argument("--lengths", type=_lengths, help="parity sequence lengths (default 1,7,128,300)")
    p.add_argument("--json", metavar="PATH", help="also write the parity report as JSON")
    p.add_argument("--board", choices=_option_choices("board"), help="--target arm: the board (default generic aarch64)")
    p.add_argument("--arch", metavar="sm_XY", help="--target cuda: SM arch (default: the local GPU's, else sm_80)")
    p.add_argument("--profile", metavar="NAME", help="--target npu: NPU profile, targets/npu/NAME.toml (default generic_int8)")
    p.add_argument("--seq-len", type=int, metavar="N", help="--target npu: the static sequence length (default 128)")
    p.add_argument("--host", choices=["llvm", "arm"], help="--target npu: host CPU for the TVM build (default llvm)")
    p.add_argument("--pe-tables", choices=["int8"], help="store position tables as int8 rows with per-row scales")
    p.add_argument("--no-tuning", action="store_true", help="ignore the graph's tuning database (targets/tuning/)")
    p.add_argument("--exporter", choices=EXPORTER_CHOICES, default=EXPORTER_CHOICES[0],
                   help="torch -> ONNX exporter for graph specs (default %(default)s, 13x faster "
                        "than dynamo; falls back to dynamo if it fails)")

    p = sub.add_parser("deploy", help="run a bundle on a board over TVM RPC and print its parity report")
    p.add_argument("bundle")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--rpc", metavar="HOST:PORT", help="the board's TVM RPC server")
    where.add_argument("--tracker", metavar="HOST:PORT", help="a TVM RPC tracker (with --key)")
    p.add_argument("--key", help="with --tracker: the key the board registered under")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds: the board ends the session after this; connecting waits at most min(this, 30)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")

    p = sub.add_parser("tune", help="autotune a graph's kernels with MetaSchedule into its tuning database")
    p.add_argument("graph", help="shipped graph name, .toml spec, or .onnx file")
    p.add_argument("--target", default="llvm", choices=list(TARGETS))
    p.add_argument("--only", choices=["rope"], help="tune only the RoPE kernels (rotation and cos/sin tables)")
    p.add_argument("--trials", type=int, default=64, help="measured candidates per kernel (default 64)")
    p.add_argument("--lengths", type=_lengths, default=[128], help="sequence lengths to tune at (default 128)")
    p.add_argument("--batch", type=_lengths, default=[1], help="batch sizes to tune at (default 1)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on boards behind a TVM RPC tracker")
    p.add_argument("--rpc-key", help="the boards' key at the tracker (with --rpc-tracker)")
    p.add_argument("--recheck", action="store_true",
                   help="tune nothing: time the database's kernels against the default schedules again "
                        "and keep only the faster ones (after the default schedules changed)")

    p = sub.add_parser("parity", help="check a bundle against its reference at several lengths")
    p.add_argument("bundle")
    p.add_argument("--lengths", type=_lengths, help="comma-separated (default 1,7,128,300)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")

    p = sub.add_parser("run", help="run a bundle on named arrays from an .npz")
    p.add_argument("bundle")
    p.add_argument("--inputs", required=True, help=".npz with one array per model input")
    p.add_argument("--out", required=True, help=".npz to write the named outputs to")

    p = sub.add_parser("inspect", help="show a bundle's manifest (verifies checksums), or what an "
                                       ".onnx file holds and which nodes would block its compile")
    p.add_argument("bundle", help="bundle folder or .onnx file")

    p = sub.add_parser("guide", help="measure what each position encoding costs on each target and length; "
                                     "write a Markdown report, PNG plots and guide.json")
    p.add_argument("--targets", default=",".join(GUIDE_TARGETS), type=_guide_targets,
                   help=f"comma-separated, from {', '.join(GUIDE_TARGETS)} (default: all)")
    p.add_argument("--lengths", type=_lengths, default=[128, 512, 2048, 4096], help="default 128,512,2048,4096")
    p.add_argument("--batch", type=_lengths, default=[1, 8], help="llvm batch sizes (default 1,8)")
    p.add_argument("--graphs", type=lambda t: [g for g in t.split(",") if g],
                   help="graph names or .toml specs of one model (default: every shipped graph; the "
                        "no-position baseline is added)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="at least this many timed runs per encoder and cell")
    p.add_argument("--out", type=Path, help="report folder (default dist/guide)")
    p.add_argument("--keep-work", action="store_true", help="keep the bundles and vendor builds (out/work)")
    p.add_argument("--from", dest="from_json", metavar="GUIDE_JSON", help="measure nothing: render a guide.json again")

    p = sub.add_parser("bench", help="time PyTorch, torch.compile, onnxruntime and TVM on a graph, side by side")
    p.add_argument("graph", help="shipped graph name or a .toml spec")
    p.add_argument("--lengths", type=_lengths, default=[128, 512], help="sequence lengths (default 128,512)")
    p.add_argument("--batch", type=_lengths, default=[1, 8], help="batch sizes (default 1,8)")
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--repeat", type=int, default=20, help="at least this many timed runs per cell (default 20)")
    p.add_argument("--min-time", type=float, default=2.0, help="and at least this many seconds per cell (default 2)")
    p.add_argument("--engines", default="torch,torch.compile,onnxruntime,tvm,tvm-tuned",
                   help="comma-separated subset of torch,torch.compile,onnxruntime,tvm,tvm-tuned (default all)")
    p.add_argument("--tuned", metavar="BUNDLE", help="a tuned llvm bundle for the 'tvm-tuned' column")
    p.add_argument("--bundle", metavar="BUNDLE", help="reuse this untuned llvm bundle instead of compiling one")
    p.add_argument("--out", type=Path, help="folder for bench.json/.md/.png and the compiled bundle "
                                            "(default dist/bench-<graph>)")

    sub.add_parser("list", help="list shipped graphs, encodings and targets")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"portable-pe {args.command}: error: {err}", file=sys.stderr)
        return 2
