"""The one schema of manifest.json, checked on every write and every load.

A manifest that is not an object, lacks a required key, has a value of the wrong type,
or whose checksum list (`files`) does not cover the bundle's files is refused with the
key's path and what was expected, before anything reads it. Keys a backend adds (npu,
cuda, pe_tables, timings_s, ...) are free-form.
"""

from __future__ import annotations

import re

from ..spec.io_names import ROLES

#: files every bundle has; each must be in the checksum list
REQUIRED_FILES = ("model.so", "model.onnx", "reference.npz")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """A manifest.json that does not follow the schema."""


class _Choice:
    def __init__(self, *values):
        self.values = values

    def __repr__(self):
        return " or ".join(map(repr, self.values))


class _MapOf:
    def __init__(self, item):
        self.item = item


class _ListOf:
    def __init__(self, item, *, non_empty=False):
        self.item, self.non_empty = item, non_empty


_NUMBER = (int, float)
_IO = {"name": str, "dtype": str, "dims": _ListOf((int, str))}
_CASE = {"length?": int, "sizes?": _MapOf(int), "inputs": _MapOf(str), "outputs": _MapOf(str)}
_DIM = {"role": _Choice(*ROLES), "min": int, "max": int, "why?": str, "past?": bool, "multiple?": int,
        "patch?": int}  # patch: a foreign image's stem stride, when the graph needs a coarser multiple
SCHEMA = {
    "format_version": int,
    "graph": {"name": str, "source": _Choice("spec", "onnx"), "spec": (dict, type(None))},
    "encoding": str,
    "target": {"name": str, "device": str, "options?": dict, "tvm": dict, "host_arch?": str,
               "cpu_features?": _ListOf(str)},
    "inputs": _ListOf(_IO, non_empty=True),
    "outputs": _ListOf(_IO, non_empty=True),
    "dims?": _MapOf(_DIM),
    "value_limits?": _MapOf({"min": int, "max": int, "why?": str}),
    # a bound on a sum of dims ({"T": 1, "past": 1} <= max: MPT's ALiBi table with a KV cache)
    "dim_sums?": _ListOf({"dims": _MapOf(int), "max": int, "why?": str}),
    # a dim the graph ties to others (an attention mask over past + T: spec/dims.py DimRelation)
    "dim_relations?": _ListOf({"dim": str, "terms": _MapOf(int), "how": _Choice("learned", "stated")}),
    "static_length?": int,
    # reference.npz's records (bundle/reference.py): which array is which input or output
    "reference": {"source": _Choice("torch", "onnxruntime"), "lengths": _ListOf(int),
                  "sizes?": _ListOf(_MapOf(int)), "cases": _ListOf(_CASE, non_empty=True)},
    "tolerance": _MapOf({"atol": _NUMBER, "rtol": _NUMBER, "min_cosine": _NUMBER}),
    "versions": _MapOf(str),
    "tuning?": dict,
    "files": _MapOf(_SHA256),
}


def validate_manifest(manifest, *, where: str) -> dict:
    """`manifest` if it follows SCHEMA and is consistent, else ManifestError naming the key."""
    fail = _failer(where)
    if isinstance(manifest, dict) and "files" not in manifest:
        fail("it has no checksum list (`files`): the bundle cannot be verified")
    _check(manifest, SCHEMA, where, "")
    bad = [name for name in manifest["files"] if not _is_bundle_path(name)]
    if bad:
        fail(f"the checksum list `files` names {bad[0]!r}; expected file names inside the bundle folder "
             "(subfolders allowed, e.g. rknn/model.rknn; no '..', no absolute or hidden parts)")
    missing = [name for name in REQUIRED_FILES if name not in manifest["files"]]
    if missing:
        fail(f"the checksum list `files` lacks {', '.join(missing)}: the bundle cannot be verified")
    dims = manifest.get("dims", {})
    for kind in ("inputs", "outputs"):
        for i, io in enumerate(manifest[kind]):
            for dim in io["dims"]:
                if isinstance(dim, str) and kind == "inputs" and dim not in dims:
                    fail(f"`{kind}[{i}].dims` names dim {dim!r}, which `dims` does not define")
                if isinstance(dim, int) and dim < 1:
                    fail(f"`{kind}[{i}].dims` has size {dim}; sizes must be >= 1")
    for name, info in dims.items():
        # a KV cache's past length starts at 0 (the prefill); every other dim at 1 or more
        if not 0 <= info["min"] <= info["max"] or (info["min"] == 0 and not info.get("past")):
            fail(f"`dims.{name}` allows {info['min']}..{info['max']}; expected 1 <= min <= max "
                 "(0 <= min only for a KV cache's past length)")
    for i, limit in enumerate(manifest.get("dim_sums", [])):
        if not set(limit["dims"]) <= set(dims):
            fail(f"`dim_sums[{i}].dims` names {sorted(set(limit['dims']) - set(dims))}, which `dims` does not define")
    for i, rel in enumerate(manifest.get("dim_relations", [])):
        if not {rel["dim"], *rel["terms"]} <= set(dims):
            fail(f"`dim_relations[{i}]` names {sorted({rel['dim'], *rel['terms']} - set(dims))}, which `dims` does not define")
    for i, out in enumerate(manifest["outputs"]):
        if out["dtype"] not in manifest["tolerance"]:
            fail(f"`tolerance` has no entry for output {out['name']!r}'s dtype {out['dtype']}")
    for i, case in enumerate(manifest["reference"]["cases"]):
        if ("length" in case) == ("sizes" in case):
            fail(f"`reference.cases[{i}]` must have a `length` (a sequence) or `sizes` (a vision bundle), not "
                 f"{'both' if 'length' in case else 'neither'}")
    lengths = [case["length"] for case in manifest["reference"]["cases"] if "length" in case]
    if lengths != manifest["reference"]["lengths"]:
        fail(f"`reference.cases` are at lengths {lengths}, `reference.lengths` says {manifest['reference']['lengths']}")
    if manifest["graph"]["source"] == "spec" and manifest["graph"]["spec"] is None:
        fail("`graph.spec` is null but `graph.source` is 'spec'")
    return manifest


def _is_bundle_path(name) -> bool:
    """A relative path below the bundle folder: no empty, '.', '..' or hidden parts."""
    parts = str(name).split("/")
    return bool(name) and all(p and not p.startswith(".") for p in parts)


def _failer(where: str):
    def fail(message: str):
        raise ManifestError(f"{where}: {message}; the manifest is damaged or was not written by "
                            "portable-pe: recompile the bundle")
    return fail


def _check(value, schema, where: str, path: str) -> None:
    fail = _failer(where)
    shown = f"`{path}`" if path else "the manifest"
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            fail(f"{shown} must be a JSON object, got {_kind(value)}")
        for key, sub in schema.items():
            name = key.rstrip("?")
            if name not in value:
                if not key.endswith("?"):
                    fail(f"required key `{_join(path, name)}` is missing")
                continue
            _check(value[name], sub, where, _join(path, name))
    elif isinstance(schema, _MapOf):
        if not isinstance(value, dict):
            fail(f"{shown} must be a JSON object, got {_kind(value)}")
        for key, item in value.items():
            _check(item, schema.item, where, _join(path, key))
    elif isinstance(schema, _ListOf):
        if not isinstance(value, list):
            fail(f"{shown} must be a list, got {_kind(value)}")
        if schema.non_empty and not value:
            fail(f"{shown} must not be empty")
        for i, item in enumerate(value):
            _check(item, schema.item, where, f"{path}[{i}]")
    elif isinstance(schema, _Choice):
        if value not in schema.values:
            fail(f"{shown} must be {schema!r}, got {value!r}")
    elif isinstance(schema, re.Pattern):
        if not (isinstance(value, str) and schema.fullmatch(value)):
            fail(f"{shown} must be a sha256 hex digest (64 hex digits), got {value!r}")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        # JSON true/false are Python bools, which are ints: never accept them as numbers
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            fail(f"{shown} must be {' or '.join(_TYPE_NAMES.get(t, t.__name__) for t in types)}, got {_kind(value)}")


_TYPE_NAMES = {dict: "a JSON object", list: "a list", str: "a string", int: "an integer", float: "a number",
               type(None): "null"}


def _kind(value) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{_TYPE_NAMES.get(type(value), type(value).__name__)} {text[:40] + '...' if len(text) > 40 else text}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
