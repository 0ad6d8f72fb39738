"""portable-pe: compile Transformer encoders with swappable position encodings into TVM
bundles checked against PyTorch.

A thin layer over the library. Heavy imports happen inside commands, so `--help` and
`list` stay instant. Exit status: 0 ok, 1 parity failed, 2 bad input, 3 internal error,
130 interrupted (cli_errors.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .inspection import cmd_inspect
from .parser import build_parser, chosen_target_options


def _print_report(report, json_path: str | None) -> int:
    from ..bundle.paths import write_file_atomically
    print(report.to_markdown())
    if json_path:
        write_file_atomically(Path(json_path), report.to_json().encode())
        print(f"(JSON report written to {json_path})")
    return 0 if report.ok else 1


def _json_path(args) -> None:
    """--json checked before the work, not after it."""
    from ..bundle.paths import output_file
    if args.json is not None:
        args.json = str(output_file(args.json, kind="json", option="--json"))


def cmd_compile(args) -> int:
    from ..bundle.paths import bundle_destination
    _json_path(args)
    if args.out is not None:  # compile_graph checks it again; this spares a refused --out the imports
        bundle_destination(args.out, force=args.force)
    if Path(args.graph).suffix != ".onnx":  # the same: a bad spec is refused before torch loads
        from ..spec.graphs import read_spec
        vision = "vision" in read_spec(args.graph)[0]
        _sizes_or_lengths(args, vision=vision)
        if args.lengths:  # lengths the graph can never take, refused before the compile (not an empty FAIL after it)
            _refuse_beyond_spec(args.graph, lengths=args.lengths, batches=(1,))
    from ..compile.pipeline import compile_graph
    from ..npu.simulator import vendor_runners
    from ..run.parity import DEFAULT_LENGTHS, check_bundle, usable_lengths
    print(f"compiling {args.graph} for target {args.target}"
          f"{' -> ' + str(args.out) if args.out is not None else ''}", flush=True)
    bundle = compile_graph(args.graph, target=args.target, out=args.out,
                           keep_intermediates=args.keep_intermediates, shapes=dict(args.shape or []),
                           dim_relations=tuple(args.dim_relation or ()),
                           target_options=chosen_target_options(args), pe_tables=args.pe_tables, tuning=not args.no_tuning,
                           exporter=args.exporter, precision=args.precision, force=args.force,
                           reference_sizes=tuple(args.sizes or ()), log=lambda m: print(m, flush=True))
    lengths = usable_lengths(bundle.manifest, args.lengths or DEFAULT_LENGTHS)
    if args.lengths and not lengths:  # an .onnx file's bounds are known only now
        from ..run.parity import check_request
        try:
            check_request(bundle.manifest, lengths=args.lengths)
        except ValueError as err:
            raise ValueError(f"{err}; the bundle was written to {bundle.path} but not checked: run "
                             f"`portable-pe parity {bundle.path} --lengths N` with lengths it accepts") from None
    skipped = sorted(set(args.lengths or ()) - set(lengths))
    if skipped:
        print(f"note: --lengths {','.join(map(str, skipped))} skipped: outside what the bundle accepts", flush=True)
    sizes = _bundle_sizes(bundle.manifest, args)
    runner, why = _local_runner(bundle)
    vendor = vendor_runners(bundle, simulated=True)  # the simulator ran in the vendor stage
    report = check_bundle(bundle, lengths=lengths, sizes=sizes, tvm_runner=runner,
                          candidates=("onnxruntime", "tvm") if runner else ("onnxruntime",), extra_runners=vendor)
    report.unverified = why
    if runner is None and report.rows and not any(r.gating for r in report.rows):  # an int8 or bf16 bundle for a board
        peers = _PEERS_OF_PRECISION.get(bundle.manifest.get("precision"), "the engines on this machine are")
        print(f"note: {peers} shown for comparison; the bundle itself is checked on the board "
              "(portable-pe deploy, or its run_on_board.py)", flush=True)
    return _print_report(report, args.json)


#: what a board bundle's parity shows on this machine, by precision (run.parity picks the peers)
_PEERS_OF_PRECISION = {"int8": "onnxruntime's int8 kernels on this machine are",
                       "bf16": "onnxruntime (float32) and OpenVINO (its bf16 default) on this machine are"}


def _sizes_or_lengths(args, *, vision: bool) -> None:
    """A vision graph is checked at image sizes (--sizes), a sequence graph at lengths."""
    if vision and args.lengths:
        raise ValueError("--lengths: this is a vision graph, checked at image sizes: give --sizes HxW[,HxW...] "
                         "(pixels, multiples of the patch size)")
    if not vision and args.sizes:
        raise ValueError("--sizes: this bundle has no image dims to size: a sequence graph (checked at --lengths "
                         "N[,N...]), or an image pinned when it was built (--shape, an npu --image-size), which "
                         "runs at that one size; --sizes is for vision bundles built for any size")


def _bundle_sizes(manifest: dict, args) -> list[dict] | None:
    """--sizes parsed for this bundle's pixel axes and checked against its bounds, or None."""
    from ..run.parity import check_request, parse_sizes, pixel_roles
    roles = pixel_roles(manifest)
    _sizes_or_lengths(args, vision=bool(roles))
    if not args.sizes:
        return None
    sizes = [parse_sizes(text, roles) for text in args.sizes]
    check_request(manifest, lengths=(), sizes=sizes)
    return sizes


def _local_runner(bundle):
    """(the bundle's module loaded here, "") or (None, why) for a board's or a GPU's bundle."""
    from ..bundle.artifact import BundleError
    from ..run.local import LocalRunner
    try:
        return LocalRunner(bundle).run, ""
    except BundleError as err:
        print(f"note: the compiled module is not run here: {err}", flush=True)
        return None, str(err)


def cmd_deploy(args) -> int:
    from ..run.deploy import deploy
    _json_path(args)
    report = deploy(args.bundle, rpc=args.rpc, tracker=args.tracker, key=args.key, timeout=args.timeout,
                    log=lambda m: print(m, flush=True))
    return _print_report(report, args.json)


def cmd_tune(args) -> int:
    from ..tune.autotune import check_tunable, tune_graph
    if args.recheck:
        from ..tune.autotune import recheck_graph
        recheck_graph(args.graph, target=args.target, log=lambda m: print(m, flush=True))
        return 0
    options = chosen_target_options(args)
    check_tunable(args.target, options)  # in a second, before the tracker and the export
    runner = None
    if args.rpc_tracker:
        from ..tune.rpc import board_runner
        runner = board_runner(tracker=args.rpc_tracker, key=args.rpc_key, timeout=args.rpc_timeout,
                              log=lambda m: print(m, flush=True))
    elif args.rpc_key:
        raise ValueError("--rpc-key needs --rpc-tracker HOST:PORT (the tracker the boards registered with)")
    for batch in args.batch:
        for seq in args.lengths:
            result = tune_graph(args.graph, target=args.target, target_options=options, batch=batch, seq=seq,
                                trials=args.trials, only=args.only, runner=runner,
                                log=lambda m: print(m, flush=True))
            print(f"tuned {result.tasks} kernel(s) at batch={batch} seq={seq} in {result.seconds:.0f} s "
                  f"-> {result.db_dir}")
    print("`portable-pe compile` applies this database automatically where the recheck timed the tuned entry "
          "faster than the dynamic main (tuned.json 'entry'; `--no-tuning` to skip it)")
    return 0


def cmd_parity(args) -> int:
    from ..bundle.artifact import load_bundle
    from ..npu.simulator import vendor_runners
    from ..run.parity import DEFAULT_LENGTHS, check_bundle
    from ..run.parity import check_request
    _json_path(args)
    bundle = load_bundle(args.bundle)
    sizes = _bundle_sizes(bundle.manifest, args)
    check_request(bundle.manifest, lengths=args.lengths or (), batch=args.batch)
    return _print_report(check_bundle(bundle, lengths=args.lengths or DEFAULT_LENGTHS, batch=args.batch, sizes=sizes,
                                      extra_runners=vendor_runners(bundle, log=lambda m: print(m, flush=True))),
                         args.json)


def cmd_run(args) -> int:
    import io
    import numpy as np
    from ..bundle.artifact import load_bundle
    from ..bundle.paths import output_file, write_file_atomically
    from ..run.local import run_local
    from ..interrupts import outputs_complete
    from ..user_files import load_npz_inputs
    out = output_file(args.out, kind="npz", option="--out", protect=(Path(args.inputs),))
    bundle = load_bundle(args.bundle)
    inputs = load_npz_inputs(args.inputs)
    if args.past:  # a step of a KV-cache graph: the cache, and a mask over it and positions after it
        from ..run.kv_cache import past_inputs, step_inputs
        past = past_inputs(bundle, args.past, batch=next(iter(inputs.values())).shape[0])
        if "input_ids" in inputs:
            cached = next(iter(past.values())).shape[2] if past else 0
            inputs = {**step_inputs(bundle.manifest, inputs["input_ids"], cached, given=inputs), **inputs}
        inputs = {**past, **inputs}
    outputs = run_local(bundle, inputs)
    buf = io.BytesIO()
    np.savez(buf, **outputs)  # to a buffer: savez given a path would add ".npz" to it
    write_file_atomically(out, buf.getvalue())
    outputs_complete()
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
    print(f"wrote {args.out}")
    return 0


def cmd_list(args) -> int:
    from ..spec.encoding_notes import ENCODING_NOTES
    from ..spec.graphs import DEFAULT_GRAPH, GRAPHS, VISION_GRAPHS
    from ..backends.targets import TARGETS, load_target
    print("graphs:")
    for name, path in GRAPHS.items():
        print(f"  {name}{' (default)' if name == DEFAULT_GRAPH else ''}  {path}")
    print("vision graphs (pixel_values in, any image size within bounds; llvm, arm, cuda; npu with rknpu2 at one --image-size):")
    for name, path in VISION_GRAPHS.items():
        print(f"  {name}  {path}")
    print("encodings:")
    for name, note in ENCODING_NOTES.items():
        print(f"  {name:<11} {note}")
    print("targets:")
    for name in TARGETS:
        spec = load_target(name)
        print(f"  {name:<5} {spec.description}{'  [not yet: ' + spec.planned + ']' if spec.planned else ''}")
    return 0


def cmd_bench(args) -> int:
    from ..bench.graph import Settings, bench_graph
    from ..bundle.paths import output_folder
    settings = Settings(lengths=tuple(args.lengths), batches=tuple(args.batch), threads=args.threads,
                        repeat=args.repeat, min_time_s=args.min_time, engines=tuple(args.engines.split(",")),
                        pool=args.pool)
    out = Path(args.out) if args.out is not None else Path("dist") / f"bench-{Path(args.graph).stem}"
    output_folder(args.out if args.out is not None else out, option="--out", files=("bench.json", "bench.md", "bench.png"))
    _bench_precheck(args, settings)
    result = bench_graph(args.graph, settings=settings, tuned=args.tuned, bundle=args.bundle,
                         int8_bundle=args.int8_bundle, bf16_bundle=args.bf16_bundle, out=out,
                         log=lambda m: print(m, flush=True))
    print(result.to_markdown())
    print(f"(wrote {out / 'bench.json'}, bench.md and bench.png)")
    return 0 if all(c.ok is not False for c in result.cells) else 1


def _bench_precheck(args, settings) -> None:
    """What bench_graph would refuse only after compiling, refused before."""
    from ..bundle.artifact import load_bundle
    from ..bench.graph import ENGINES
    from ..run.parity import check_request
    unknown = sorted(set(settings.engines) - set(ENGINES))
    if unknown:
        raise ValueError(f"--engines: unknown engine(s) {', '.join(unknown)}; valid: {', '.join(ENGINES)}")
    bundles = [load_bundle(path) for path in (args.bundle, args.tuned, args.int8_bundle, args.bf16_bundle)
               if path is not None]
    for bundle in bundles:
        check_request(bundle.manifest, lengths=settings.lengths, batch=max(settings.batches))
    if not bundles and Path(args.graph).suffix != ".onnx":
        _refuse_beyond_spec(args.graph, lengths=settings.lengths, batches=settings.batches)


def _refuse_beyond_spec(graph, *, lengths, batches) -> None:
    """Lengths or batch sizes beyond a graph spec's export bounds, refused before a compile."""
    from ..spec.graphs import load_graph
    spec = load_graph(graph)  # max_length as the encoding caps it (a learned table's size)
    beyond = sorted(n for n in set(lengths) if n > spec.max_length)
    if beyond:
        raise ValueError(f"--lengths {','.join(map(str, beyond))}: graph {spec.name!r} accepts lengths 1..{spec.max_length}")
    if max(batches) > spec.max_batch:
        raise ValueError(f"--batch {max(batches)}: graph {spec.name!r} accepts batch sizes 1..{spec.max_batch}")


def cmd_guide(args) -> int:
    from ..guide import render_from, run_guide
    from ..bundle.paths import output_folder
    output_folder(args.out if args.out is not None else "dist/guide", option="--out",
                  files=("guide_vision.md", "guide_vision.json") if args.vision else ("guide.md", "guide.json"))
    if args.from_json:
        print(f"wrote {render_from(Path(args.from_json), args.out)}")
        return 0
    for option, given in (("--sizes", args.sizes), ("--npu-sizes", args.npu_sizes), ("--video-sizes", args.video_sizes),
                          ("--video-npu-sizes", args.video_npu_sizes)):
        if given and not args.vision:
            raise ValueError(f"{option} is for the vision section: add --vision (the text guide takes --lengths)")
    if args.vision:
        from ..guide.vision import DEFAULT_SIZES, DEFAULT_VIDEO_SIZES, run_vision_guide
        run_vision_guide(graphs=args.graphs, sizes=tuple(args.sizes.split(",")) if args.sizes else DEFAULT_SIZES,
                         batches=tuple(args.batch), out=args.out or Path("dist/guide"), threads=args.threads,
                         repeat=args.repeat, targets=tuple((args.targets or "llvm").split(",")),
                         npu_sizes=tuple(args.npu_sizes.split(",")) if args.npu_sizes else None,
                         video_sizes=tuple(args.video_sizes.split(",")) if args.video_sizes else DEFAULT_VIDEO_SIZES,
                         video_npu_sizes=tuple(args.video_npu_sizes.split(",")) if args.video_npu_sizes else None,
                         command="portable-pe " + " ".join(sys.argv[1:]), log=lambda m: print(m, flush=True))
        return 0
    from ..guide import GUIDE_TARGETS
    run_guide(graphs=args.graphs, targets=tuple((args.targets or ",".join(GUIDE_TARGETS)).split(",")),
              lengths=tuple(args.lengths),
              batches=tuple(args.batch), out=args.out or Path("dist/guide"), threads=args.threads,
              repeat=args.repeat, keep_work=args.keep_work, command="portable-pe " + " ".join(sys.argv[1:]),
              log=lambda m: print(m, flush=True))
    return 0


COMMANDS = {"compile": cmd_compile, "guide": cmd_guide, "parity": cmd_parity, "run": cmd_run,
            "inspect": cmd_inspect, "list": cmd_list, "tune": cmd_tune, "deploy": cmd_deploy, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    from .errors import interrupted, run_command
    from ..interrupts import install
    install()  # before parsing: Ctrl-C at any point is an exit 130 with partial files removed
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt as err:
        return interrupted("", err)
    return run_command(args.command, COMMANDS[args.command], args, debug=getattr(args, "debug", False))


def entry() -> int:
    """The `portable-pe` program (console script and `python -m portable_pe`): main, then a
    teardown no signal can turn into a failure (interrupts.ignore_from_now)."""
    from ..interrupts import ignore_from_now, ignore_once_complete
    ignore_once_complete()
    code = main()
    ignore_from_now()
    return code
