"""Generation with a KV cache: a bundle whose graph takes past keys/values as inputs and
returns the present ones, run as a prefill followed by one-token steps.

A decoder exported with its cache (``portable_pe.hf.export_hf(..., kv_cache=True)``, or
optimum's ``past_key_values.{i}.key`` / ``present.{i}.key`` naming) has inputs
``input_ids [B, T]`` and ``past_key_values.{i}.key|value [B, Hkv, past, Dh]`` and outputs
``present.{i}.key|value [B, Hkv, past + T, Dh]``. ``cache_pairs`` finds which output
feeds which input from the names; ``KVCacheSession`` starts from an empty cache
(``past = 0``), runs the prefill and then each step, feeding every step's present
back as the next step's past, and hands back each step's outputs.

    session = KVCacheSession(load_bundle("dist/llama-kv-llvm"))
    first = session.run(prompt_ids)          # prefill: (1, 7) token ids
    for token in next_tokens:
        out = session.run(token[None, None])  # one token: past grows by one
"""

from __future__ import annotations


import numpy as np

from ..spec.io_names import cache_pairs, past_dims  # noqa: F401 (the cache's names live with the others)


class KVCacheSession:
    """Prefill, then steps, on a local runner (``runtime.LocalRunner``) or any object
    with ``run(inputs) -> outputs`` and the bundle's ``manifest``."""

    def __init__(self, bundle, *, runner=None):
        from .local import LocalRunner  # pylint: disable=import-outside-toplevel
        self.manifest = bundle.manifest
        self.pairs = cache_pairs(self.manifest["inputs"], self.manifest["outputs"])
        if not self.pairs:
            raise ValueError(f"bundle {bundle.path} has no KV cache: no input named like "
                             f"past_key_values.N.key paired with an output present.N.key "
                             f"(inputs {[i['name'] for i in self.manifest['inputs']]})")
        self.runner = runner or LocalRunner(bundle)
        self.past: dict[str, np.ndarray] | None = None

    @property
    def length(self) -> int:
        """Tokens in the cache so far."""
        if not self.past:
            return 0
        return next(iter(self.past.values())).shape[2]

    def reset(self) -> None:
        self.past = None

    def run(self, input_ids: np.ndarray, **extra: np.ndarray) -> dict[str, np.ndarray]:
        """One step (the first is the prefill): the model's outputs for these tokens. A graph
        that also takes an attention mask (over the cache and these tokens) and position ids
        gets all-ones and past..past + T - 1 unless `extra` gives them."""
        input_ids = np.asarray(input_ids)
        past = self.past if self.past is not None else empty_cache(self.manifest, batch=input_ids.shape[0])
        extra = {**step_inputs(self.manifest, input_ids, self.length, given=extra), **extra}
        outputs = self.runner.run({"input_ids": input_ids, **extra, **past})
        self.past = {name: outputs[present] for name, present in self.pairs.items()}
        return outputs


def step_inputs(manifest: dict, input_ids: np.ndarray, past: int, *, given=()) -> dict[str, np.ndarray]:
    """The inputs of a step besides the tokens and the cache: an attention mask of ones over
    past + T (``[B, past + T]``) and position ids past..past + T - 1, for each such input the
    graph has and `given` lacks."""
    from ..spec.io_names import is_position_input  # pylint: disable=import-outside-toplevel
    batch, tokens = input_ids.shape
    cached = set(cache_pairs(manifest["inputs"], manifest["outputs"]))
    made = {}
    for spec in manifest["inputs"]:
        name, dtype = spec["name"], np.dtype(spec["dtype"])
        if name in given or name in cached or name == "input_ids":
            continue
        if is_position_input(name):
            made[name] = np.broadcast_to(np.arange(past, past + tokens), (batch, tokens)).astype(dtype).copy()
        elif "mask" in name.lower() and len(spec["dims"]) == 2:
            made[name] = np.ones((batch, past + tokens), dtype)
    return made


def empty_cache(manifest: dict, *, batch: int = 1) -> dict[str, np.ndarray]:
    """Zero-length past arrays (``past = 0``) for every cache input: the prefill's cache."""
    specs = {i["name"]: i for i in manifest["inputs"]}
    roles = {d: info.get("role") for d, info in manifest.get("dims", {}).items()}
    empty = past_dims(manifest["inputs"], manifest["outputs"])
    arrays = {}
    for name in cache_pairs(manifest["inputs"], manifest["outputs"]):
        dims = [0 if d in empty else batch if roles.get(d) == "batch" else d for d in specs[name]["dims"]]
        if not all(isinstance(d, int) for d in dims):
            raise ValueError(f"cache input {name!r} has dims {specs[name]['dims']}: "
                             f"cannot make an empty cache of them")
        arrays[name] = np.zeros(dims, dtype=specs[name]["dtype"])
    return arrays


def past_inputs(bundle, previous: str, *, batch: int = 1) -> dict[str, np.ndarray]:
    """The cache inputs of a step run from the command line: the present outputs in the
    previous step's .npz (``portable-pe run --out``), or an empty cache for ``'empty'``."""
    from pathlib import Path  # pylint: disable=import-outside-toplevel
    pairs = cache_pairs(bundle.manifest["inputs"], bundle.manifest["outputs"])
    if not pairs:
        raise ValueError(f"--past: bundle {bundle.path} has no KV cache (no past_key_values.N.key "
                         f"input paired with a present.N.key output)")
    if previous == "empty":
        return empty_cache(bundle.manifest, batch=batch)
    path = Path(previous)
    if not path.is_file():
        raise FileNotFoundError(f"--past file {path} does not exist")
    with np.load(path) as data:
        missing = sorted(set(pairs.values()) - set(data.files))
        if missing:
            raise ValueError(f"--past {path} lacks the present outputs {missing} (it should be the "
                             f"previous step's --out)")
        return {name: data[present] for name, present in pairs.items()}
