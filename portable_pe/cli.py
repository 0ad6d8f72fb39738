"""`portable-pe`: a thin layer over the library. Heavy imports happen inside commands, so
`--help` and `list` stay instant."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,7,128, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return values


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
    bundle = compile_graph(args.graph, target=args.target, out=args.out,
                           keep_intermediates=args.keep_intermediates, shapes=dict(args.shape or []),
                           log=lambda m: print(m, flush=True))
    return _print_report(check_bundle(bundle, lengths=args.lengths or DEFAULT_LENGTHS), args.json)


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


def cmd_inspect(args) -> int:
    from .artifact import load_bundle
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


COMMANDS = {"compile": cmd_compile, "parity": cmd_parity, "run": cmd_run,
            "inspect": cmd_inspect, "list": cmd_list}


def build_parser() -> argparse.ArgumentParser:
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

    p = sub.add_parser("parity", help="check a bundle against its reference at several lengths")
    p.add_argument("bundle")
    p.add_argument("--lengths", type=_lengths, help="comma-separated (default 1,7,128,300)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")

    p = sub.add_parser("run", help="run a bundle on named arrays from an .npz")
    p.add_argument("bundle")
    p.add_argument("--inputs", required=True, help=".npz with one array per model input")
    p.add_argument("--out", required=True, help=".npz to write the named outputs to")

    p = sub.add_parser("inspect", help="show a bundle's manifest (verifies checksums)")
    p.add_argument("bundle")

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
