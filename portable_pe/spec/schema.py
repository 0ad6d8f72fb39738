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


BOOLEAN = Rule("true or false", lambda v: type(v) is bool)
TEXT = Rule("a string", lambda v: isinstance(v, str))
#: the name becomes part of file paths (exports, tuning databases): no separators, no leading dot
NAME = Rule("a name of ASCII letters, digits, '_', '-' or '.' (not starting with '.'), at most 64 characters",
            lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}", v) is not None)

TOP = {"name": NAME, "description": TEXT, "seed": integer(0, 2**32 - 1)}
MODEL = {"d_model": integer(1, 16384), "n_heads": integer(1, 1024), "n_layers": integer(1, 256),
         "d_ff": integer(1, 65536), "norm_eps": number(above=0, hi=1)}
EXPORT = {"example_length": integer(1, MAX_LENGTH), "max_length": integer(1, MAX_LENGTH),
          "max_batch": integer(1, 65536)}
ENCODING_OPTIONS = {
    "sinusoidal": {"base": number(above=1)},
    "learned": {"max_len": integer(1, MAX_LENGTH)},
    "t5_bias": {"num_buckets": integer(4, 1024, even=True), "max_distance": integer(2, MAX_LENGTH)},
    "rope": {"base": number(above=1), "rotary_dim": integer(2, 16384, even=True), "interleaved": BOOLEAN},
    "alibi": {},
    "hybrid": {},  # `layers` and one table of options per listed encoding: checked in _encoding
    "none": {},  # the no-position baseline (graphs/baselines/none.toml)
}
#: what a left-out field takes, for the checks that span fields: the defaults of
#: EncoderConfig, GraphSpec and the encodings' constructors, spelled out because those
#: modules load torch (a test keeps them the same)
DEFAULTS = {
    "model": {"d_model": 256, "n_heads": 4, "n_layers": 4, "d_ff": 1024, "norm_eps": 1e-5},
    "export": {"example_length": 16, "max_length": 4096, "max_batch": 64},
    "encoding": {"sinusoidal": {"base": 10000.0}, "learned": {"max_len": 512},
                 "t5_bias": {"num_buckets": 32, "max_distance": 128},
                 "rope": {"base": 10000.0, "rotary_dim": None, "interleaved": False}, "alibi": {}, "hybrid": {}, "none": {}},
}
def validate_spec(data, *, source: str) -> dict:
    """`data` with `encoding` as a table, once every field follows the schema."""
    defaults = DEFAULTS
    fail = _failer(source)
    if not isinstance(data, dict):
        fail(f"a graph spec must be a TOML table, got {type(data).__name__}")
    _table(data, {**TOP, "model": None, "encoding": None, "export": None}, "", fail)
    for key in ("name", "model", "encoding"):
        if key not in data:
            fail(f"missing required key `{key}`")
    for key in ("model", "export"):
        if not isinstance(data.get(key, {}), dict):
            fail(f"{key} = {data[key]!r}: expected a table ([{key}])")
    _table(data["model"], MODEL, "model.", fail)
    _table(data.get("export", {}), EXPORT, "export.", fail)
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
    return {**data, "encoding": encoding}


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
