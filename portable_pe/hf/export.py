"""Export a transformers model to ONNX with a dynamic sequence length, with or without its
KV cache, the way a user would hand it to ``portable-pe compile``.

Without a cache the graph maps ``input_ids [1, T]`` to ``last_hidden_state [1, T, D]``.
With one (``kv_cache=True``) it also takes ``past_key_values.{i}.key|value`` ``[1, Hkv,
past, Dh]`` and returns ``present.{i}.key|value`` ``[1, Hkv, past + T, Dh]`` (optimum's
names), positions offset by ``past`` inside the graph as transformers computes them (or,
with ``attention_mask=True``, given as ``position_ids`` beside a mask over past + T);
``portable_pe.kv_cache`` feeds each step's present back as the next step's past.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

EXPORTERS = ("dynamo", "torchscript")
EXAMPLE_LENGTH = 16  # the export traces at this length; parity runs at others
EXAMPLE_PAST = 5
MAX_LENGTH = 1024


def cache_names(n_layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names), key then value per layer."""
    past = [f"past_key_values.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    return past, present


class LastHidden(torch.nn.Module):
    """input_ids -> last_hidden_state. ``use_cache=False`` by default; ``None`` leaves the
    model's default (a decoder then builds a cache it does not return)."""

    def __init__(self, model, *, use_cache: bool | None = False):
        super().__init__()
        self.model = model
        self.use_cache = use_cache

    def forward(self, input_ids):
        kwargs = {"use_cache": self.use_cache} if self.use_cache is not None and _takes(self.model, "use_cache") else {}
        return self.model(input_ids=input_ids, **kwargs).last_hidden_state


class WithCache(torch.nn.Module):
    """(input_ids, *past) -> (last_hidden_state, *present): the cache as flat tensors."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, *past):
        from transformers import DynamicCache  # pylint: disable=import-outside-toplevel
        pairs = [(past[i], past[i + 1]) for i in range(0, len(past), 2)]
        cache = DynamicCache(pairs, config=self.model.config)
        out = self.model(input_ids=input_ids, use_cache=True, **{cache_kwarg(self.model): cache})
        present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.last_hidden_state, *present)


class WithCacheAndMask(torch.nn.Module):
    """(input_ids, attention_mask, position_ids, *past) -> (last_hidden_state, *present): the
    layout Optimum and onnxruntime-genai exports carry, the mask over past + T tokens."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache  # pylint: disable=import-outside-toplevel
        pairs = [(past[i], past[i + 1]) for i in range(0, len(past), 2)]
        cache = DynamicCache(pairs, config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **{cache_kwarg(self.model): cache})
        present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.last_hidden_state, *present)


def example_past(model, *, length: int = EXAMPLE_PAST, batch: int = 1) -> list[torch.Tensor]:
    """Zero-free random past K/V of the shapes the model's attention layers keep."""
    cfg = model.config.get_text_config(decoder=True)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(batch, heads, length, head_dim, generator=gen) for _ in range(2 * cfg.num_hidden_layers)]


def export_hf(model, path: str | Path, *, exporter: str = "dynamo", opset: int = 18,
              kv_cache: bool = False, attention_mask: bool = False, length: int = EXAMPLE_LENGTH) -> Path:
    """Write ``model`` (a transformers base model in eval mode) to ``path`` as ONNX.

    The sequence length (and with ``kv_cache`` the past length) stays a dynamic dim,
    named ``T`` (and ``past``). With ``attention_mask`` (and ``kv_cache``) the graph also
    takes ``attention_mask [1, past + T]`` and ``position_ids [1, T]``; the mask's dim gets
    a name of its own, as users' exports have it (torch.export: ``Dim.AUTO``, an ``s..``
    symbol; TorchScript: ``past_plus_T``), and nothing in the file says how it relates.
    Weights are stored inside the file."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    path = Path(path)
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, length),
                        generator=torch.Generator().manual_seed(0))
    # The wrapper must be in eval mode too: the TorchScript exporter puts the module it
    # exported back in that module's mode, recursively (a fresh wrapper is in training
    # mode, which would turn the model's dropout on from then on).
    if attention_mask and not kv_cache:
        raise ValueError("attention_mask=True exports the cache layout (mask over past + T): pass kv_cache=True too")
    masked = ["attention_mask", "position_ids"] if attention_mask else []
    if kv_cache:
        past = example_past(model)
        past_names, present_names = cache_names(len(past) // 2)
        if attention_mask:
            mask = torch.ones(1, EXAMPLE_PAST + length, dtype=torch.int64)
            positions = torch.arange(EXAMPLE_PAST, EXAMPLE_PAST + length)[None]
            module, args = WithCacheAndMask(model).eval(), (ids, mask, positions, *past)
        else:
            module, args = WithCache(model).eval(), (ids, *past)
        inputs, outputs = ["input_ids", *masked, *past_names], ["last_hidden_state", *present_names]
    else:
        # With use_cache=False transformers' masks check for packed sequences with
        # torch.diff, which the TorchScript exporter has no symbolic for; with a cache
        # (the default) they do not, and the hidden states are the same.
        module, args = LastHidden(model, use_cache=False if exporter == "dynamo" else None).eval(), (ids,)
        inputs, outputs, past_names, present_names = ["input_ids"], ["last_hidden_state"], [], []
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            seq = torch.export.Dim("T", min=1, max=MAX_LENGTH)
            dims = [{1: seq}] + ([{1: torch.export.Dim.AUTO}, {1: seq}] if attention_mask else [])
            if kv_cache:  # *past arrives as one tuple argument
                cached = torch.export.Dim("past", min=1, max=past_max(model))
                dims.append(tuple({2: cached} for _ in past_names))
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=opset,
                              dynamic_shapes=tuple(dims), input_names=inputs, output_names=outputs,
                              external_data=False, verbose=False)
        else:
            axes = {"input_ids": {1: "T"}, "last_hidden_state": {1: "T"}}
            axes.update({"attention_mask": {1: "past_plus_T"}, "position_ids": {1: "T"}} if attention_mask else {})
            axes.update({name: {2: "past"} for name in past_names})
            axes.update({name: {2: "past_plus_T"} for name in present_names})
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                              input_names=inputs, output_names=outputs, dynamic_axes=axes)
    return path


def past_max(model) -> int:
    """The largest past length the dynamo export declares. A sliding-window cache layer
    keeps its last ``sliding_window - 1`` tokens, and a flat cache has one past length for
    every layer, so a longer past never arrives; torch.export may also guard the cache
    below the window (after a TorchScript export in the same process it refuses
    ``past <= MAX_LENGTH`` for Gemma2: "Not all values of past ... satisfy the generated
    guard ... <= 63")."""
    from transformers.cache_utils import get_layer_types_and_kwargs  # pylint: disable=import-outside-toplevel
    _, kwargs = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    windows = [k["sliding_window"] for k in kwargs if k.get("sliding_window")]
    return min([MAX_LENGTH] + [w - 1 for w in windows])


def cache_kwarg(model) -> str:
    """transformers 5.24 renamed some models' past_key_values argument to cache (the old
    name still works there, with a deprecation warning)."""
    return "cache" if _takes(model, "cache") else "past_key_values"


def _takes(model, name: str) -> bool:
    import inspect  # pylint: disable=import-outside-toplevel
    return name in inspect.signature(model.forward).parameters
