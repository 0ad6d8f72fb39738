"""KV-cache exports in the layout Optimum and onnxruntime-genai carry: input_ids [1, T],
attention_mask [1, past + T] under a dim name of its own (torch.export's ``s..``,
TorchScript's ``past_plus_T``), position_ids [1, T] and the flat past K/V. Nothing in the
file relates the mask's dim to past and T; the compile learns it by running the graph
(compile/relation_probe.py), records it in the manifest, makes every check input by it,
and the runtime refuses a mask that breaks it. Each bundle runs a prefill of 7 tokens and
5 one-token steps through KVCacheSession (mask and positions made per step) against
transformers' own DynamicCache run.

Default: Llama (dynamo, opset 18) and GPT-NeoX (TorchScript, opset 17); the table's other
decoders with ``-m hf_full``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("transformers")

from portable_pe.cli.main import main as cli  # noqa: E402
from portable_pe.compile.pipeline import compile_graph  # noqa: E402
from portable_pe.hf.check import generation_error, token_ids  # noqa: E402
from portable_pe.hf.export import export_hf  # noqa: E402
from portable_pe.hf.zoo import build  # noqa: E402
from portable_pe.run.kv_cache import KVCacheSession, empty_cache  # noqa: E402
from portable_pe.run.local import InputError, LocalRunner  # noqa: E402
from portable_pe.spec.dims import DimRelation  # noqa: E402

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

DEFAULT = [("llama", "dynamo", 18), ("gpt_neox", "torchscript", 17)]
FULL = [("qwen2", "dynamo", 18), ("qwen2", "torchscript", 17), ("gpt_neox", "dynamo", 18),
        ("phi3", "dynamo", 18), ("phi3", "torchscript", 17), ("gemma", "dynamo", 18), ("gemma", "torchscript", 17),
        ("mistral", "dynamo", 18), ("mistral", "torchscript", 17), ("llama", "torchscript", 17)]


@pytest.fixture(scope="module")
def masked_bundle(tmp_path_factory):
    made = {}

    def make(arch, exporter, opset):
        if (arch, exporter, opset) not in made:
            folder = tmp_path_factory.mktemp(f"{arch}-{exporter}-mask")
            model = build(arch)
            path = export_hf(model, folder / "model.onnx", exporter=exporter, opset=opset, kv_cache=True,
                             attention_mask=True)
            made[arch, exporter, opset] = (model, path, compile_graph(str(path), target="llvm", out=folder / "bundle",
                                                                       log=lambda m: None))
        return made[arch, exporter, opset]
    return make


def _dims(path, name):
    graph = onnx.load(str(path)).graph
    return [d.dim_param or d.dim_value for d in next(i for i in graph.input if i.name == name).type.tensor_type.shape.dim]


@pytest.mark.parametrize("arch,exporter,opset", DEFAULT + [pytest.param(*c, marks=pytest.mark.hf_full) for c in FULL])
def test_prefill_and_steps_match_transformers(arch, exporter, opset, masked_bundle):
    model, path, bundle = masked_bundle(arch, exporter, opset)
    mask_dim, tokens_dim = _dims(path, "attention_mask")[1], _dims(path, "input_ids")[1]
    past_dim = _dims(path, "past_key_values.0.key")[2]
    assert len({mask_dim, tokens_dim, past_dim}) == 3  # the file names the mask's dim apart
    relations = [DimRelation.from_json(r) for r in bundle.manifest["dim_relations"]]
    assert DimRelation(mask_dim, {tokens_dim: 1, past_dim: 1}) in relations
    errors = generation_error(KVCacheSession(bundle), model, prefill=7, steps=5)
    assert len(errors) == 6 and max(errors) < 1e-4, errors


def test_a_mask_that_breaks_the_relation_is_refused(masked_bundle):
    model, path, bundle = masked_bundle(*DEFAULT[0])
    ids = token_ids(model, 3)
    inputs = {"input_ids": ids, "attention_mask": np.ones((1, 4), np.int64),  # past 0 + T 3 is 3, not 4
              "position_ids": np.arange(3)[None], **empty_cache(bundle.manifest)}
    with pytest.raises(InputError, match=r"needs .* = .*\+") as err:
        LocalRunner(bundle).run(inputs)
    assert _dims(path, "attention_mask")[1] in str(err.value)


def test_cli_run_makes_the_mask_for_each_step(masked_bundle, tmp_path, capsys):
    model, _, bundle = masked_bundle(*DEFAULT[0])
    ids = token_ids(model, 6)
    np.savez(tmp_path / "prompt.npz", input_ids=ids[:, :5])
    np.savez(tmp_path / "next.npz", input_ids=ids[:, 5:])
    assert cli(["run", str(bundle.path), "--inputs", str(tmp_path / "prompt.npz"), "--past", "empty",
                "--out", str(tmp_path / "s0.npz")]) == 0
    assert cli(["run", str(bundle.path), "--inputs", str(tmp_path / "next.npz"), "--past", str(tmp_path / "s0.npz"),
                "--out", str(tmp_path / "s1.npz")]) == 0
    session = KVCacheSession(bundle)
    session.run(ids[:, :5])
    want = session.run(ids[:, 5:])["last_hidden_state"]
    with np.load(tmp_path / "s1.npz") as got:
        np.testing.assert_array_equal(got["last_hidden_state"], want)  # the same module, the same inputs
    assert "present.0.key: float32[1, 2, 6, 8]" in capsys.readouterr().out


def test_a_stated_relation_is_used_and_a_wrong_name_refused(masked_bundle, tmp_path):
    _, path, _ = masked_bundle(*DEFAULT[0])
    mask_dim, tokens_dim = _dims(path, "attention_mask")[1], _dims(path, "input_ids")[1]
    past_dim = _dims(path, "past_key_values.0.key")[2]
    logs = []
    bundle = compile_graph(str(path), target="llvm", out=tmp_path / "b", log=logs.append,
                           dim_relations=(f"{mask_dim}={past_dim}+{tokens_dim}",))
    assert {"dim": mask_dim, "terms": {past_dim: 1, tokens_dim: 1}, "how": "stated"} in bundle.manifest["dim_relations"]
    assert not any("dims:" in line for line in logs)  # nothing left to learn
    with pytest.raises(ValueError, match="the graph has no dim nope"):
        compile_graph(str(path), target="llvm", out=tmp_path / "c", log=lambda m: None,
                      dim_relations=(f"nope={past_dim}+{tokens_dim}",))


@pytest.mark.parametrize("text", ["s53", "s53=", "=past+T", "s53=past+", "s53=s53+T", "s53=past*T"])
def test_a_malformed_dim_relation_is_refused(text):
    with pytest.raises(ValueError, match="expected DIM=DIM"):
        DimRelation.parse(text)


def test_inspect_says_how_the_dims_are_tied(masked_bundle, capsys):
    _, path, _ = masked_bundle(*DEFAULT[0])
    cli(["inspect", str(path)])
    out = capsys.readouterr().out
    mask_dim, tokens_dim = _dims(path, "attention_mask")[1], _dims(path, "input_ids")[1]
    assert f"dims: {mask_dim} = {tokens_dim} + past" in out, out
