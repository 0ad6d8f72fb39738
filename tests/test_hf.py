"""Hugging Face models as foreign ONNX exports: transformers' own classes, tiny configs
built here (random weights, no download), exported in the test, compiled for llvm, run
at lengths the export never saw and compared with transformers itself.

Default run: Llama (dynamo, opset 18) with and without its KV cache (prefill then
one-token steps, from the Python API and from `portable-pe run --past`), the KV caches of
GPT-NeoX, MPT, Mistral and Gemma2, BERT (TorchScript, opset 17), MPT and Falcon with
ALiBi (dynamo, opset 18). Every architecture of ``portable_pe.hf.zoo`` at every exporter
and opset, and the KV cache of every decoder, run with ``-m hf_full``; on the emulated
aarch64 board (``-m "hf_full and board"``) Llama and BERT.
"""

from __future__ import annotations


import numpy as np
import pytest

from conftest import require_cross

pytest.importorskip("transformers")

from portable_pe.cli.main import main as cli  # noqa: E402
from portable_pe.compile.pipeline import compile_graph  # noqa: E402
from conftest import assert_parity  # noqa: E402
from portable_pe.hf.check import generation_reference, token_ids, torch_hidden  # noqa: E402
from portable_pe.hf.export import export_hf  # noqa: E402
from portable_pe.hf.zoo import ARCHITECTURES, build  # noqa: E402
from portable_pe.run.kv_cache import KVCacheSession  # noqa: E402
from portable_pe.run.local import LocalRunner  # noqa: E402

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

TOL = "float32_abs"  # conftest.TEST_TOLERANCES: max abs error 1e-4 against PyTorch, fp32
UNSEEN = (5, 37, 100)  # the export traces at T=16
EXPORTS = [("dynamo", 18), ("dynamo", 23), ("torchscript", 17)]
# MPT (its ALiBi table sliced by max(0, L - T): a bound T <= L, an end of INT_MAX beside a
# symbolic start) and Falcon's ALiBi (a bf16 Mul onnxruntime has no kernel for) once failed
DEFAULT = {("llama", "dynamo", 18), ("bert", "torchscript", 17), ("mpt", "dynamo", 18),
           ("falcon_alibi", "dynamo", 18)}
# KV caches with a Min/Max of two dims (past and T) that once failed to import: MPT's ALiBi
# table (a bound on past + T), sliding windows (Mistral's cache offset and its Attention
# op, Gemma2's TorchScript slice of past[-(W - 1):]). GPT-NeoX's TorchScript cache export
# runs by default in test_hf_kv_mask.py (with its attention mask), so not here too.
DEFAULT_KV = {("llama", "dynamo", 18), ("mpt", "dynamo", 18),
              ("mistral", "dynamo", 23), ("gemma2", "torchscript", 17)}
hf_full = pytest.mark.hf_full


def _params(cases, default):
    return [pytest.param(*case, id="-".join(map(str, case)), marks=() if case in default else hf_full)
            for case in cases]


MATRIX = _params([(a, e, o) for a in ARCHITECTURES for e, o in EXPORTS], DEFAULT)
KV_MATRIX = _params([(a, e, o) for a, arch in ARCHITECTURES.items() if arch.decoder for e, o in EXPORTS],
                    DEFAULT_KV)


@pytest.fixture(scope="session")
def hf_bundle(tmp_path_factory):
    """(arch, exporter, opset, kv_cache, target) -> (model, bundle), once per session.
    An exporter that cannot export the model skips the test with its words."""
    made = {}

    def make(arch, exporter, opset, *, kv_cache=False, target="llvm"):
        key = (arch, exporter, opset, kv_cache, target)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"{arch}-{exporter}{opset}{'-kv' if kv_cache else ''}")
            model = build(arch)
            try:
                path = export_hf(model, folder / "model.onnx", exporter=exporter, opset=opset, kv_cache=kv_cache)
            except Exception as err:  # the exporter's failure, not ours: say it, don't hide it
                made[key] = (model, f"{exporter} opset {opset} cannot export {arch}: "
                                    f"{str(err).strip().splitlines()[-1][:300]}")
            else:
                made[key] = (model, compile_graph(str(path), target=target, out=folder / "bundle",
                                                  log=lambda m: None))
        model, bundle = made[key]
        if isinstance(bundle, str):
            pytest.skip(bundle)
        return model, bundle
    return make


def check_lengths(runner, model, lengths, *, name: str) -> dict[int, float]:
    """The runner's last_hidden_state at each length against transformers' own, through the
    parity harness; returns {T: max abs error}."""
    errors = {}
    for n in lengths:
        ids = token_ids(model, n, seed=n)
        got = runner.run({"input_ids": ids})
        got = {"last_hidden_state": got.get("last_hidden_state", next(iter(got.values())))}
        (row,) = assert_parity({"last_hidden_state": torch_hidden(model, ids)}, got, tolerance=TOL, name=name, length=n)
        errors[n] = row.max_abs
    return errors


def check_generation(session, model, *, prefill: int, steps: int) -> list[float]:
    """A prefill and then one-token steps through `session`, each step's hidden state and
    present K/V against transformers' run with its DynamicCache, through the parity
    harness; returns each step's worst max abs error."""
    ids = token_ids(model, prefill + steps, seed=0)
    reference = generation_reference(model, ids, prefill=prefill)
    session.reset()
    cuts = [(0, prefill)] + [(i, i + 1) for i in range(prefill, prefill + steps)]
    errors = []
    for (lo, hi), want in zip(cuts, reference, strict=True):
        rows = assert_parity(want, session.run(ids[:, lo:hi]), tolerance=TOL, name=f"step {lo}:{hi}", length=hi - lo)
        errors.append(max(r.max_abs for r in rows))
    return errors


@pytest.mark.parametrize("arch,exporter,opset", MATRIX)
def test_architecture_matches_pytorch_at_unseen_lengths(arch, exporter, opset, hf_bundle, record_property):
    model, bundle = hf_bundle(arch, exporter, opset)
    assert bundle.manifest["reference"]["source"] == "onnxruntime"
    assert "T" in bundle.manifest["dims"], bundle.manifest["dims"]  # the length stayed dynamic
    record_property("max_abs", check_lengths(LocalRunner(bundle), model, UNSEEN, name=f"tvm {arch}"))


@pytest.mark.parametrize("arch,exporter,opset", KV_MATRIX)
def test_kv_cache_generation_matches_pytorch(arch, exporter, opset, hf_bundle, record_property):
    """Prefill 7 tokens from an empty cache, then 5 one-token steps, each step's present
    K/V fed back as the next past: every step's hidden state and cache against
    transformers' own generation-time run (DynamicCache)."""
    model, bundle = hf_bundle(arch, exporter, opset, kv_cache=True)
    dims = bundle.manifest["dims"]
    assert {"T", "past"} <= set(dims) and dims["past"]["min"] == 0, dims  # two dynamic dims
    errors = check_generation(KVCacheSession(bundle), model, prefill=7, steps=5)
    record_property("max_abs_per_step", errors)
    assert len(errors) == 6, errors


def test_cli_run_steps_through_the_cache(hf_bundle, tmp_path, capsys):
    """`portable-pe run --past empty` is the prefill; `--past PREV.npz` feeds the previous
    step's present K/V back; both agree with the Python API."""
    model, bundle = hf_bundle("llama", "dynamo", 18, kv_cache=True)
    from portable_pe.hf.check import token_ids
    ids = token_ids(model, 8, seed=4)
    session = KVCacheSession(bundle)
    want = [session.run(ids[:, :7]), session.run(ids[:, 7:])]
    previous = "empty"
    for k, chunk in enumerate((ids[:, :7], ids[:, 7:])):
        np.savez(tmp_path / f"in{k}.npz", input_ids=chunk)
        assert cli(["run", str(bundle.path), "--inputs", str(tmp_path / f"in{k}.npz"), "--past", previous,
                    "--out", str(tmp_path / f"out{k}.npz")]) == 0
        with np.load(tmp_path / f"out{k}.npz") as got:
            for name, value in want[k].items():
                np.testing.assert_array_equal(got[name], value)
        previous = str(tmp_path / f"out{k}.npz")
    assert "present.0.key: float32[1, 2, 8, 8]" in capsys.readouterr().out
    assert cli(["run", str(bundle.path), "--inputs", str(tmp_path / "in1.npz"), "--past",
                str(tmp_path / "in0.npz"), "--out", str(tmp_path / "x.npz")]) == 2
    assert "lacks the present outputs" in capsys.readouterr().err


def test_mpt_length_is_bounded_by_its_alibi_table(hf_bundle):
    """MPT's graph runs only for T <= max_seq_len (its ALiBi table's rows): legalize
    decides max(0, L - T) under that bound, and the manifest refuses longer inputs."""
    _, bundle = hf_bundle("mpt", "dynamo", 18)
    assert bundle.manifest["dims"]["T"]["max"] == ARCHITECTURES["mpt"].options["max_seq_len"]


def test_mpt_cache_is_bounded_by_its_alibi_table(hf_bundle):
    """With a KV cache MPT's table is sliced by max(0, L - past - T): the bound is on the
    sum, each dim's max follows from it, and the runtime refuses a longer total."""
    from portable_pe.run.local import InputError
    _, bundle = hf_bundle("mpt", "dynamo", 18, kv_cache=True)
    top = ARCHITECTURES["mpt"].options["max_seq_len"]
    assert bundle.manifest["dim_sums"] == [{"dims": {"T": 1, "past": 1}, "max": top,
                                            "why": f"(the graph's shapes agree only up to T + past = {top})"}]
    assert bundle.manifest["dims"]["T"]["max"] == top and bundle.manifest["dims"]["past"]["max"] == top - 1
    past = {i["name"]: np.zeros((1, i["dims"][1], 2, i["dims"][3]), np.float32)
            for i in bundle.manifest["inputs"] if i["name"] != "input_ids"}
    with pytest.raises(InputError, match=f"T \\+ past is {top + 1}"):
        LocalRunner(bundle).run({"input_ids": np.full((1, top - 1), 5, np.int64), **past})


def test_inspect_says_every_dim_is_followed(hf_bundle, capsys):
    _, bundle = hf_bundle("llama", "dynamo", 18)
    assert cli(["inspect", str(bundle.file("model.onnx"))]) == 0
    assert "shapes: every node's dims are expressions of the input dims (T)" in capsys.readouterr().out


# ----------------------------------------------------------------- the emulated board
def _board_ready():
    from conftest import load_script
    return load_script("board_server")

@hf_full
@pytest.mark.board
@pytest.mark.parametrize("arch,exporter,opset", [("llama", "dynamo", 18), ("bert", "torchscript", 17)])
def test_architecture_on_the_emulated_board(arch, exporter, opset, hf_bundle):
    board_server = _board_ready()
    require_cross()
    if not board_server.board_available():
        pytest.skip("emulated board not set up: run `bash scripts/board_setup.sh`")
    if board_server.server_status() is not None:
        pytest.skip("a board RPC server is already running (python scripts/board_server.py stop)")
    from portable_pe.run.deploy import RemoteRunner, connect
    model, bundle = hf_bundle(arch, exporter, opset, target="arm")
    host, port = board_server.start_server(port=0, timeout=120)
    try:
        session, where = connect(rpc=f"{host}:{port}", timeout=600)
        check_lengths(RemoteRunner(session, bundle, where), model, UNSEEN, name=f"board {arch}")
        del session
    finally:
        board_server.stop_server()
