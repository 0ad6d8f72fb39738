"""The schema of a graph spec (graphs/*.toml), checked field by field before anything is built.

Every error names the file, the field, the value and what is allowed:

    graphs/x.toml: model.n_heads = 0: expected an integer in 1..1024

ENCODING_OPTIONS lists each encoding's options with their rules (a test keeps it equal to
the encodings' constructor parameters). Torch-free: no model is built here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

MAX_LENGTH = 1 << 20


@dataclass(frozen=True)
class Rule:
    allowed: str                  # "an integer in 1..1024", shown in errors
    ok: Callable[[object], bool]


def integer(lo: int, hi: int, *, even: bool = False) -> Rule:
    return Rule(f"{'an even' if even else 'an'} integer in {lo}..{hi}",
                lambda v: type(v) is int and lo <= v <= hi and not (even and v % 2))


def number(*, above: float, hi: float = math.inf) -> Rule:
    return Rule(f"a number > {above:g}" + (f" and <= {hi:g}" if hi < math.inf else ""),
                lambda v: type(v) in (int, float) and math.isfinite(v) and above < v <= hi)


def integers(n: int | tuple[int, ...], lo: int, hi: int) -> Rule:
    """A list of `n` integers (or any of the counts in a tuple) in lo..hi."""
    counts = (n,) if isinstance(n, int) else n
    return Rule(f"a list of {' or '.join(map(str, counts))} integers in {lo}..{hi}",
                lambda v: isinstance(v, list) and len(v) in counts and all(type(e) is int and lo <= e <= hi for e in v))


BOOLEAN = Rule("true or false", lambda v: type(v) is bool)
TEXT = Rule("a string", lambda v: isinstance(v, str))
#: the name becomes part of file paths (exports, tuning databases): no separators, no leading dot
NAME = Rule("a name of ASCII letters, digits, '_', '-' or '.' (not starting with '.'), at most 64 characters",
            lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}", v) is not None)

TOP = {"name": NAME, "description": TEXT, "seed": integer(0, 2**32 - 1)}
MODEL = {"d_model": integer(1, 16384), "n_heads": integer(1, 1024), "n_layers": integer(1, 256),
         "d_ff": integer(1, 65536), "norm_eps": number(above=0, hi=1)}
EXPORT = {"example_length": integer(1, MAX_LENGTH), "max_length": integer(1, MAX_LENGTH),
          "max_batch": integer(1, 65536),
          # a vision graph's [H, W] (video: [F, H, W]) pixel sizes: the export example, the largest
          "example_size": integers((2, 3), 1, MAX_LENGTH), "max_size": integers((2, 3), 1, MAX_LENGTH)}
#: [vision]: a patch stem in front of the encoder (spec/vision.py VisionConfig)
VISION = {"patch": integer(1, 1024), "channels": integer(1, 1024), "cls_tokens": integer(0, 64),
          "registers": integer(0, 64), "temporal_patch": integer(0, 64)}
ENCODING_OPTIONS = {
    "sinusoidal": {"base": number(above=1)},
    "learned": {"max_len": integer(1, MAX_LENGTH)},
    "t5_bias": {"num_buckets": integer(4, 1024, even=True), "max_distance": integer(2, MAX_LENGTH)},
    "rope": {"base": number(above=1), "rotary_dim": integer(2, 16384, even=True), "interleaved": BOOLEAN},
    "alibi": {},
    "hybrid": {},  # `layers` and one table of options per listed encoding: checked in _encoding
    "none": {},  # the no-position baseline (graphs/baselines/none.toml)
    # grid encodings (spec/grid_encodings.py): positions of image (2 axes) or video (3) patches
    "rope_2d": {"base": number(above=1)},
    "rope_mixed": {"base": number(above=1)},
    "mrope": {"base": number(above=1), "sections": integers(3, 0, 8192)},
    "sincos_2d": {"base": number(above=1)},
    "learned_2d": {"grid": integers(2, 1, 4096)},
    "rel_bias_2d": {"grid": integers(2, 1, 4096)},
    "window_rel_bias_2d": {"window": integer(1, 256), "shift": integer(0, 255)},
}
#: the position axes each encoding takes (their classes' `axes`; a test keeps them the same):
#: 1 for a sequence, 2 for image patches, 3 for video patches; None: any
ENCODING_AXES = {"sinusoidal": 1, "learned": 1, "t5_bias": 1, "rope": 1, "alibi": 1, "hybrid": None, "none": None,
                 "rope_2d": 2, "rope_mixed": 2, "mrope": 3, "sincos_2d": 2, "learned_2d": 2, "rel_bias_2d": 2,
                 "window_rel_bias_2d": 2}
#: what a left-out field takes, for the checks that span fields: the defaults of
#: EncoderConfig, GraphSpec and the encodings' constructors, spelled out because those
#: modules load torch (a test keeps them the same)
DEFAULTS = {
    "model": {"d_model": 256, "n_heads": 4, "n_layers": 4, "d_ff": 1024, "norm_eps": 1e-5},
    "export": {"example_length": 16, "max_length": 4096, "max_batch": 64},
    "vision": {"patch": 16, "channels": 3, "cls_tokens": 1, "registers": 0, "temporal_patch": 0},
    "encoding": {"sinusoidal": {"base": 10000.0}, "learned": {"max_len": 512},
                 "t5_bias": {"num_buckets": 32, "max_distance": 128},
                 "rope": {"base": 10000.0, "rotary_dim": None, "interleaved": False}, "alibi": {}, "hybrid": {}, "none": {},
                 "rope_2d": {"base": 100.0}, "rope_mixed": {"base": 100.0}, "mrope": {"base": 10000.0, "sections": None},
                 "sincos_2d": {"base": 10000.0}, "learned_2d": {"grid": None}, "rel_bias_2d": {"grid": None},
                 "window_rel_bias_2d": {"window": 7, "shift": None}},
}
def validate_spec(data, *, source: str) -> dict:
    """`data` with `encoding` as a table, once every field follows the schema."""
    defaults = DEFAULTS
    fail = _failer(source)
    if not isinstance(data, dict):
        fail(f"a graph spec must be a TOML table, got {type(data).__name__}")
    _table(data, {**TOP, "model": None, "encoding": None, "export": None, "vision": None}, "", fail)
    for key in ("name", "model", "encoding"):
        if key not in data:
            fail(f"missing required key `{key}`")
    for key in ("model", "export", "vision"):
        if not isinstance(data.get(key, {}), dict):
            fail(f"{key} = {data[key]!r}: expected a table ([{key}])")
    _table(data["model"], MODEL, "model.", fail)
    _table(data.get("export", {}), EXPORT, "export.", fail)
    _table(data.get("vision", {}), VISION, "vision.", fail)
    model, export = {**defaults["model"], **data["model"]}, {**defaults["export"], **data.get("export", {})}
    d_model, n_heads = model["d_model"], model["n_heads"]
    if d_model % n_heads:
        fail(f"model.d_model = {d_model} must be divisible by model.n_heads = {n_heads}")
    example, longest = export["example_length"], export["max_length"]
    if example > longest:
        fail(f"export.example_length = {example} exceeds export.max_length = {longest}; "
             "expected example_length <= max_length")
    if not isinstance(data["encoding"], (dict, str)):
        fail(f"encoding = {_show(data['encoding'])}: expected an encoding name or an [encoding] table")
    encoding = data["encoding"] if isinstance(data["encoding"], dict) else {"name": data["encoding"]}
    _encoding(encoding, "encoding", fail, model=model, defaults=defaults["encoding"], hybrid_allowed=True)
    parts = [encoding] if encoding["name"] != "hybrid" else [
        {"name": n, **encoding.get(n, {})} for n in dict.fromkeys(encoding["layers"])]
    for part in parts:
        table = {**defaults["encoding"].get(part["name"], {}), **part}.get("max_len")
        if part["name"] == "learned" and example > table:
            fail(f"export.example_length = {example} exceeds the learned table's max_len = {table}; "
                 "expected example_length <= max_len")
    _axes(encoding, data, fail)
    if "vision" in data:
        _vision_sizes({**defaults["vision"], **data["vision"]}, export, fail, window=patch_window(encoding))
    elif {"example_size", "max_size"} & set(export):
        fail("export.example_size and export.max_size are a vision graph's pixel sizes; this graph has no "
             "[vision] table (a sequence graph's bounds are export.example_length and export.max_length)")
    return {**data, "encoding": encoding}


def _axes(encoding: dict, data: dict, fail) -> None:
    """The encoding's position axes must be the graph's: 1 for a sequence, 2 for images, 3 for video."""
    names = [encoding["name"]] if encoding["name"] != "hybrid" else list(dict.fromkeys(encoding["layers"]))
    vision = data.get("vision")
    wanted = 1 if vision is None else 3 if vision.get("temporal_patch", 0) else 2
    what = {1: "a sequence graph (no [vision] table)", 2: "an image graph ([vision])",
            3: "a video graph ([vision] temporal_patch > 0)"}[wanted]
    for name in names:
        axes = ENCODING_AXES[name]
        if axes not in (None, wanted):
            fail(f"encoding {name!r} takes positions of {axes} axes; {what} has {wanted}: choose "
                 f"{', '.join(n for n, a in ENCODING_AXES.items() if a == wanted)}")


def patch_window(encoding: dict) -> int:
    """Patches a side of the encoding's attention windows (window_rel_bias_2d's `window`);
    1 for attention over all tokens. `encoding`: the spec's [encoding] table."""
    if encoding.get("name") != "window_rel_bias_2d":
        return 1
    return {**DEFAULTS["encoding"]["window_rel_bias_2d"], **encoding}["window"]


def pixel_multiples(vision: dict, window: int) -> list[int]:
    """What each pixel axis ([frames,] height, width) must be a multiple of: its patch, and
    height and width whole windows of `window` patches. `vision`: [vision] with its defaults."""
    return ([vision["temporal_patch"]] if vision["temporal_patch"] else []) + [vision["patch"] * window] * 2


def multiple_text(multiple: int, patch: int) -> str:
    """What a pixel size must be a multiple of, in words: 'the patch size 8', or
    '56 (whole windows: 7 patches of 8 pixels)'."""
    if multiple == patch:
        return f"the patch size {patch}"
    return f"{multiple} (whole windows: {multiple // patch} patches of {patch} pixels)"


def _vision_sizes(vision: dict, export: dict, fail, *, window: int) -> None:
    """example_size and max_size: one size per pixel axis, each a multiple of its patch
    (height and width: of whole windows, for window attention)."""
    patches = pixel_multiples(vision, window)
    axes = ["frames"] * (len(patches) == 3) + ["height", "width"]
    for key in ("example_size", "max_size"):
        if key not in export:
            fail(f"missing export.{key}: a vision graph needs [{', '.join(a.upper()[0] for a in axes)}] pixel sizes "
                 f"(multiples of {patches})")
        sizes = export[key]
        if len(sizes) != len(patches):
            fail(f"export.{key} = {sizes}: expected {len(patches)} sizes ({', '.join(axes)})")
        for axis, size, patch in zip(axes, sizes, patches):
            if size % patch:
                stem = vision["temporal_patch"] if axis == "frames" else vision["patch"]
                what = f"its patch size {patch}" if patch == stem else multiple_text(patch, stem)
                fail(f"export.{key} = {sizes}: {axis} {size} is not a multiple of {what}")
    if any(e > m for e, m in zip(export["example_size"], export["max_size"])):
        fail(f"export.example_size = {export['example_size']} exceeds export.max_size = {export['max_size']}")


def _encoding(options: dict, where: str, fail, *, model: dict, defaults: dict, hybrid_allowed: bool) -> None:
    names = [n for n in ENCODING_OPTIONS if hybrid_allowed or n != "hybrid"]
    name = options.get("name")
    if not isinstance(name, str) or name not in names:
        fail(f"{where}.name = {name!r}: expected one of {', '.join(names)}")
    if name == "hybrid":
        layers, n_layers = options.get("layers"), model["n_layers"]
        parts = [n for n in ENCODING_OPTIONS if n != "hybrid"]
        if not (isinstance(layers, list) and all(isinstance(n, str) and n in parts for n in layers)):
            fail(f"{where}.layers = {layers!r}: expected a list of encoding names ({', '.join(parts)}), "
                 "one per layer")
        if len(layers) != n_layers:
            fail(f"{where}.layers lists {len(layers)} layer(s); expected {n_layers} (model.n_layers)")
        for key, sub in options.items():
            if key in ("name", "layers"):
                continue
            if key not in layers or not isinstance(sub, dict):
                fail(f"{where}.{key} = {sub!r}: expected a table of options for one of the listed layers "
                     f"({', '.join(dict.fromkeys(layers))})")
            _encoding({"name": key, **sub}, f"{where}.{key}", fail, model=model, defaults=defaults,
                      hybrid_allowed=False)
        return
    _table({k: v for k, v in options.items() if k != "name"}, ENCODING_OPTIONS[name], f"{where}.", fail,
           what=f"encoding {name!r}")
    _encoding_cross_checks(name, {**defaults.get(name, {}), **options}, where, fail, model=model)


def _encoding_cross_checks(name: str, options: dict, where: str, fail, *, model: dict) -> None:
    """`options` with their defaults filled in."""
    head_dim = model["d_model"] // model["n_heads"]
    d_model = model["d_model"]
    if name == "sinusoidal" and d_model % 2:
        fail(f"model.d_model = {d_model}: expected an even d_model for the sinusoidal encoding")
    rotary_dim = options.get("rotary_dim")
    if name == "rope" and rotary_dim is not None and rotary_dim > head_dim:
        fail(f"{where}.rotary_dim = {rotary_dim}: expected an even integer in 2..{head_dim} "
             "(the head dim, d_model / n_heads)")
    if name == "rope" and rotary_dim is None and head_dim % 2:
        fail(f"model.d_model / model.n_heads = {head_dim}: rope rotates pairs, so the head dim must be "
             f"even (or set {where}.rotary_dim to an even value below it)")
    if name == "t5_bias" and options["max_distance"] <= options["num_buckets"] // 4:
        fail(f"{where}.max_distance = {options['max_distance']}: expected more than num_buckets / 4 "
             f"= {options['num_buckets'] // 4}")


def _table(table: dict, rules: dict, prefix: str, fail, *, what: str = "") -> None:
    for key, value in table.items():
        if key not in rules:
            valid = ", ".join(rules) or "none"
            fail(f"unknown key `{prefix}{key}`{' for ' + what if what else ''}; valid keys: {valid}")
        rule = rules[key]
        if rule is not None and not rule.ok(value):
            fail(f"{prefix}{key} = {_show(value)}: expected {rule.allowed}")


def _show(value) -> str:
    text = repr(value).replace("True", "true").replace("False", "false")
    return text if len(text) <= 60 else text[:57] + "..."


def _failer(source: str):
    def fail(message: str):
        raise ValueError(f"{source}: {message}")
    return fail
