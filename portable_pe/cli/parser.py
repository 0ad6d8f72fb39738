"""The command line's parser: every subcommand's options and the argument types that
range-check them (with the option's name), apart from what the commands do (cli.py)."""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

#: the first paragraph of `portable-pe --help`
DESCRIPTION = ("portable-pe: compile Transformer encoders with swappable position encodings into TVM "
               "bundles checked against PyTorch.")
#: export.EXPORTERS with the default first, spelled out because importing export.py loads
#: torch (a test keeps the two the same)
EXPORTER_CHOICES = ("torchscript", "dynamo")
#: bench_engines.ENGINES and POOLS, spelled out for the same reason (a test keeps them the same)
BENCH_ENGINES = ("torch", "torch.compile", "onnxruntime", "openvino", "openvino-f32", "tvm", "tvm-tuned",
                 "onnxruntime-int8", "openvino-int8", "tvm-int8", "tvm-bf16")
BENCH_POOLS = ("default", "passive")


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,7,128, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers in 1..{MAX_SIZE} like 1,7,128, got {text!r}")
    return values


#: the largest batch, length or dim a command line may ask for (a bundle's own bounds are
#: checked later, against its manifest)
MAX_SIZE = 1 << 20


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {value}")
        return value
    return parse


def _seconds(lo: float, hi: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds in {lo:g}..{hi:g}, got {text!r}") from None
        if not lo <= value <= hi:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"expected seconds in {lo:g}..{hi:g}, got {text}")
        return value
    return parse


def _sizes(text: str) -> list[str]:
    """HxW (or FxHxW) sizes, comma-separated: checked against the bundle's axes later."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    ok = values and all(re.fullmatch(r"\d+(x\d+){1,2}", v) and 0 < min(map(int, v.split("x"))) <= MAX_SIZE
                        for v in values)
    if not ok:
        raise argparse.ArgumentTypeError(f"expected comma-separated image sizes in pixels like 224x224,160x256 "
                                         f"(video: FxHxW), each in 1..{MAX_SIZE}, got {text!r}")
    return values


def _size(text: str) -> list[int]:
    """One image size, HxW (video FxHxW), in pixels: checked against the graph's patch later."""
    if not re.fullmatch(r"\d+(x\d+){1,2}", text.strip()) or not 0 < min(map(int, text.split("x"))) <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected an image size in pixels like 224x224 (video: FxHxW), each in "
                                         f"1..{MAX_SIZE}, got {text!r}")
    return [int(v) for v in text.split("x")]


def _guide_targets(text: str) -> str:
    from ..guide import GUIDE_TARGETS
    bad = [t for t in text.split(",") if t not in GUIDE_TARGETS]
    if bad or not text:
        raise argparse.ArgumentTypeError(f"unknown guide target(s) {bad or [text]}; valid: {', '.join(GUIDE_TARGETS)}")
    return text


def _shape(text: str) -> tuple[str, list[int]]:
    name, _, dims = text.partition("=")
    try:
        sizes = [int(d) for d in dims.split("x")]
    except ValueError:
        sizes = []
    if not name.strip() or not sizes or min(sizes) < 1 or max(sizes) > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected NAME=1x128 (an input name, then sizes in 1..{MAX_SIZE} "
                                         f"joined by x), got {text!r}")
    return name, sizes


def _dim_relation(text: str):
    from ..spec.dims import DimRelation
    try:
        return DimRelation.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def target_options(command: str) -> dict[str, tuple[list[str], dict]]:
    """{option: (the targets that declare it, its declaration)} for the target options
    `command` takes: each targets/<name>.toml [options.NAME] table, declared there once
    (help, default, choices, type/range/metavar, commands; commands default ["compile"])."""
    from ..backends.targets import TARGETS, load_target
    declared: dict[str, tuple[list[str], dict]] = {}
    for target in TARGETS:
        for name, option in load_target(target).options.items():
            if command in option.get("commands", ["compile"]):
                targets, first = declared.setdefault(name, ([], dict(option)))
                targets.append(target)
                if option is not first and "choices" in option:  # two targets' values, one flag
                    first["choices"] = {**first.get("choices", {}), **option["choices"]}
    return declared


def chosen_target_options(args) -> dict:
    """The target options given on the command line ({name: value}; the rest stay unset,
    so the target's defaults apply)."""
    return {name: getattr(args, name) for name in target_options(args.command)
            if getattr(args, name, None) is not None}


def _add_target_options(p: argparse.ArgumentParser, command: str) -> None:
    for name, (targets, option) in target_options(command).items():
        kwargs = {"dest": name, "help": f"--target {'/'.join(targets)}: {option.get('help', '')}"}
        if "choices" in option:
            kwargs["choices"] = list(option["choices"])
        if option.get("type") == "int":
            kwargs["type"] = _int_in(*option.get("range", (1, MAX_SIZE)))
        if option.get("type") == "size":
            kwargs["type"] = _size
        if "metavar" in option:
            kwargs["metavar"] = option["metavar"]
        p.add_argument("--" + name.replace("_", "-"), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from ..quant import PRECISIONS
    from ..guide import GUIDE_TARGETS
    from ..backends.targets import TARGETS
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the Python traceback of an error")
    parser = argparse.ArgumentParser(prog="portable-pe", description=DESCRIPTION,
                                     parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser = functools.partial(sub.add_parser, parents=[common])

    p = sub.add_parser("compile", help="compile a graph into a checked bundle and print its parity report")
    p.add_argument("graph", help="shipped graph name (see `portable-pe list`), a .toml spec, or an .onnx file")
    p.add_argument("--target", default="llvm", choices=list(TARGETS))
    p.add_argument("--out", help="bundle folder: a new path or an existing bundle "
                                            "(default: dist/<graph>-<target>)")
    p.add_argument("--force", action="store_true",
                   help="let --out replace a file or a folder that is not a bundle (never '.' or a parent of it)")
    p.add_argument("--keep-intermediates", action="store_true", help="dump each stage's output beside the bundle")
    p.add_argument("--shape", action="append", type=_shape, metavar="NAME=1x128", help="fix an ONNX input's dims")
    p.add_argument("--dim-relation", action="append", type=_dim_relation, metavar="DIM=DIM+DIM",
                   help="how an ONNX file's dims are tied where the compile cannot learn it (e.g. a mask "
                        "over the cache and the new tokens: s53=past+T)")
    p.add_argument("--lengths", type=_lengths, help="parity sequence lengths (default 1,7,128,300)")
    p.add_argument("--sizes", type=_sizes, metavar="HxW,...", help="a vision graph's parity image sizes in pixels, "
                   "also stored as the bundle's reference cases (its run_on_board.py checks at them; "
                   "default: 2x3, 4x4 and 5x3 patches)")
    p.add_argument("--json", metavar="PATH", help="also write the parity report as JSON")
    _add_target_options(p, "compile")  # --board, --arch, --profile, ...: targets/*.toml [options]
    p.add_argument("--pe-tables", choices=["int8"], help="store position tables as int8 rows with per-row scales")
    p.add_argument("--precision", choices=list(PRECISIONS),
                   help="int8: calibrated int8 matmuls (llvm, arm; npu is always int8); default: the target's")
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
    p.add_argument("--timeout", type=_seconds(0.1, 7 * 86400), default=600.0,
                   help="seconds: the board ends the session after this; connecting waits at most min(this, 30)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")

    p = sub.add_parser("tune", help="autotune a graph's kernels with MetaSchedule into its tuning database")
    p.add_argument("graph", help="shipped graph name, .toml spec, or .onnx file")
    p.add_argument("--target", default="llvm", choices=list(TARGETS))
    p.add_argument("--only", choices=["rope"], help="tune only the RoPE kernels (rotation and cos/sin tables)")
    p.add_argument("--trials", type=_int_in(1, 100_000), default=64, help="measured candidates per kernel (default 64)")
    p.add_argument("--lengths", type=_lengths, default=[128], help="sequence lengths to tune at (default 128)")
    p.add_argument("--batch", type=_lengths, default=[1], help="batch sizes to tune at (default 1)")
    _add_target_options(p, "tune")  # --board, --num-cores, --arch: targets/*.toml [options]
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on boards behind a TVM RPC tracker")
    p.add_argument("--rpc-key", help="the boards' key at the tracker (with --rpc-tracker)")
    p.add_argument("--rpc-timeout", type=_seconds(1, 86400), default=120.0, metavar="S",
                   help="seconds: the longest wait for a free board, and for one candidate's session (default 120)")
    p.add_argument("--recheck", action="store_true",
                   help="tune nothing: time the database's kernels against the default schedules again "
                        "and keep only the faster ones (after the default schedules changed)")

    p = sub.add_parser("parity", help="check a bundle against its reference at several lengths")
    p.add_argument("bundle")
    p.add_argument("--lengths", type=_lengths, help="comma-separated (default 1,7,128,300)")
    p.add_argument("--sizes", type=_sizes, metavar="HxW,...", help="a vision bundle's image sizes in pixels, "
                   "e.g. 224x224,160x256 (video: FxHxW; default: 2x3, 4x4 and 5x3 patches)")
    p.add_argument("--batch", type=_int_in(1, MAX_SIZE), default=1, help="batch size (default 1)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")

    p = sub.add_parser("run", help="run a bundle on named arrays from an .npz")
    p.add_argument("bundle")
    p.add_argument("--inputs", required=True, help=".npz with one array per model input")
    p.add_argument("--out", required=True, help=".npz to write the named outputs to")
    p.add_argument("--past", metavar="PREV.npz|empty", help="a KV-cache bundle: the previous step's --out "
                   "(its present.N.key/value become this step's past inputs), or 'empty' for the prefill")

    p = sub.add_parser("inspect", help="show a bundle's manifest (verifies checksums), or what an "
                                       ".onnx file holds and which nodes would block its compile")
    p.add_argument("bundle", help="bundle folder or .onnx file")

    p = sub.add_parser("guide", help="measure what each position encoding costs on each target and length; "
                                     "write a Markdown report, PNG plots and guide.json")
    p.add_argument("--targets", type=_guide_targets,
                   help=f"comma-separated, from {', '.join(GUIDE_TARGETS)} (default: all; with --vision: llvm, "
                        "and npu-ethos-u may be added)")
    p.add_argument("--lengths", type=_lengths, default=[128, 512, 2048, 4096], help="default 128,512,2048,4096")
    p.add_argument("--batch", type=_lengths, default=[1, 8], help="llvm batch sizes (default 1,8)")
    p.add_argument("--graphs", type=lambda t: [g for g in t.split(",") if g],
                   help="graph names or .toml specs of one model (default: every shipped graph; the "
                        "no-position baseline is added)")
    p.add_argument("--threads", type=_int_in(1, 1024), default=2, help="threads for every build (default 2)")
    p.add_argument("--repeat", type=_int_in(1, 1_000_000), default=5, help="at least this many timed runs per encoder and cell")
    p.add_argument("--out", type=Path, help="report folder (default dist/guide)")
    p.add_argument("--keep-work", action="store_true", help="keep the bundles and vendor builds (out/work)")
    p.add_argument("--from", dest="from_json", metavar="GUIDE_JSON", help="measure nothing: render a guide.json again")
    p.add_argument("--vision", action="store_true",
                   help="the vision section instead: each shipped 2D image encoding against a no-position ViT "
                        "on llvm at --sizes, and the 3D video encoding against a no-position video ViT at "
                        "--video-sizes (writes guide_vision.md and guide_vision.json)")
    p.add_argument("--sizes", help="with --vision: image sizes HxW, comma-separated (default 224x224,448x448,672x672)")
    p.add_argument("--video-sizes", help="with --vision: video sizes FxHxW (frames, pixels), comma-separated "
                                         "(default 4x224x224,8x224x224,16x224x224)")
    p.add_argument("--npu-sizes", help="with --vision --targets ...,npu-ethos-u: the Vela builds' image sizes HxW "
                                       "(default 112x112,224x224,336x336)")
    p.add_argument("--video-npu-sizes", help="with --vision --targets ...,npu-ethos-u: the video graphs' Vela builds' "
                                             "sizes FxHxW (default 2x224x224,4x224x224)")

    p = sub.add_parser("bench", help="time PyTorch, torch.compile, onnxruntime, OpenVINO and TVM (float32 and "
                                     "int8) on a graph, side by side")
    p.add_argument("graph", help="shipped graph name or a .toml spec")
    p.add_argument("--lengths", type=_lengths, default=[128, 512], help="sequence lengths (default 128,512)")
    p.add_argument("--batch", type=_lengths, default=[1, 8], help="batch sizes (default 1,8)")
    p.add_argument("--threads", type=_int_in(1, 1024), default=2, help="threads for every engine (default 2)")
    p.add_argument("--repeat", type=_int_in(1, 1_000_000), default=20,
                   help="at least this many timed runs per cell (default 20)")
    p.add_argument("--min-time", type=_seconds(0, 3600), default=2.0,
                   help="and at least this many seconds per cell (default 2)")
    p.add_argument("--engines", default=",".join(BENCH_ENGINES),
                   help=f"comma-separated subset of {','.join(BENCH_ENGINES)} (default all)")
    p.add_argument("--pool", choices=BENCH_POOLS, default=BENCH_POOLS[0],
                   help="default: every engine's thread pool at its defaults (onnxruntime spins), engines "
                        "timed in alternating blocks; passive: idle workers sleep (a machine shared with other work)")
    p.add_argument("--tuned", metavar="BUNDLE", help="a tuned llvm bundle for the 'tvm-tuned' column")
    p.add_argument("--int8-bundle", metavar="BUNDLE", help="an llvm --precision int8 bundle for the int8 columns")
    p.add_argument("--bf16-bundle", metavar="BUNDLE", help="an llvm --precision bf16 bundle for the 'tvm-bf16' column")
    p.add_argument("--bundle", metavar="BUNDLE", help="reuse this untuned llvm bundle instead of compiling one")
    p.add_argument("--out", help="folder for bench.json/.md/.png and the compiled bundle "
                                            "(default dist/bench-<graph>)")

    sub.add_parser("list", help="list shipped graphs, encodings and targets")
    return parser
