"""Compare a compiled Hugging Face export with transformers itself (PyTorch eager).

``lengths_error``: the bundle at sequence lengths the export never saw, each against the
model's ``last_hidden_state`` for the same token ids. ``generation_error``: a prefill and
then one-token steps through ``kv_cache.KVCacheSession``, each step against the model
run with its own ``DynamicCache`` the way ``generate`` runs it (hidden state and the
cache after the step).
"""

from __future__ import annotations

import numpy as np

FIRST_ID = 3  # ids below this are the tiny configs' bos/eos/pad tokens


def token_ids(model, length: int, *, seed: int = 0, batch: int = 1) -> np.ndarray:
    vocab = model.config.get_text_config().vocab_size
    return np.random.default_rng(seed).integers(FIRST_ID, vocab, (batch, length)).astype(np.int64)


def torch_hidden(model, input_ids: np.ndarray) -> np.ndarray:
    import torch  # pylint: disable=import-outside-toplevel
    if model.training:
        raise ValueError("the reference model is in training mode (dropout on): call model.eval()")
    from .export import LastHidden  # pylint: disable=import-outside-toplevel
    with torch.no_grad():
        return LastHidden(model)(torch.from_numpy(input_ids)).numpy()


def lengths_error(runner, model, lengths, *, seed: int = 0) -> dict[int, float]:
    """{T: max abs |runner - PyTorch|} over last_hidden_state; runner.run(inputs) -> outputs."""
    errors = {}
    for n in lengths:
        ids = token_ids(model, n, seed=seed + n)
        got = runner.run({"input_ids": ids})
        out = got.get("last_hidden_state", next(iter(got.values())))
        want = torch_hidden(model, ids)
        if out.shape != want.shape:
            raise AssertionError(f"T={n}: output shape {out.shape}, PyTorch gives {want.shape}")
        errors[n] = float(np.abs(out - want).max())
    return errors


def generation_reference(model, input_ids: np.ndarray, *, prefill: int) -> list[dict[str, np.ndarray]]:
    """PyTorch's outputs for a prefill of ``prefill`` tokens, then one token at a time:
    per step the last hidden state and the cache's keys/values after it."""
    import torch  # pylint: disable=import-outside-toplevel
    from transformers import DynamicCache  # pylint: disable=import-outside-toplevel
    from .export import cache_kwarg, cache_names  # pylint: disable=import-outside-toplevel
    ids = torch.from_numpy(input_ids)
    cache = DynamicCache(config=model.config)
    cuts = [(0, prefill)] + [(i, i + 1) for i in range(prefill, ids.shape[1])]
    steps = []
    with torch.no_grad():
        for lo, hi in cuts:
            out = model(input_ids=ids[:, lo:hi], use_cache=True, **{cache_kwarg(model): cache})
            _, present = cache_names(len(cache.layers))
            tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            steps.append({"last_hidden_state": out.last_hidden_state.numpy(),
                          **{name: t.numpy() for name, t in zip(present, tensors)}})
    return steps


def generation_error(session, model, *, prefill: int = 7, steps: int = 5, seed: int = 0) -> list[float]:
    """Max abs error of every step (hidden state and present K/V) of a KVCacheSession
    against PyTorch: the prefill first, then ``steps`` one-token steps."""
    ids = token_ids(model, prefill + steps, seed=seed)
    reference = generation_reference(model, ids, prefill=prefill)
    session.reset()
    cuts = [(0, prefill)] + [(i, i + 1) for i in range(prefill, prefill + steps)]
    errors = []
    for (lo, hi), want in zip(cuts, reference):
        got = session.run(ids[:, lo:hi])
        worst = 0.0
        for name, value in want.items():
            if got[name].shape != value.shape:
                raise AssertionError(f"step {lo}:{hi} {name}: shape {got[name].shape}, PyTorch {value.shape}")
            worst = max(worst, float(np.abs(got[name] - value).max()))
        errors.append(worst)
    return errors
