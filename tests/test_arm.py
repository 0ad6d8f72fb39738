"""The arm target: board tags, the cross compiler, and what an arm bundle holds.

Running arm bundles on the (emulated) board is in test_deploy.py (marker `board`)."""

from __future__ import annotations

import struct

import pytest

from portable_pe.bundle.artifact import BundleError
from portable_pe.compile.pipeline import compile_graph
from portable_pe.spec.graphs import GRAPHS
from portable_pe.run.local import run_local
from portable_pe.backends.targets import load_target

from conftest import TINY_SPEC, needs_cross, require_cross

ARM = load_target("arm")
BOARDS = list(ARM.options["board"]["choices"])


def elf_machine(path) -> int:
    with open(path, "rb") as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return struct.unpack_from("<H", header, 18)[0]


@needs_cross
@pytest.mark.parametrize("board", BOARDS)
def test_every_board_is_an_aarch64_neon_cpu(board):
    from portable_pe.backends import arm
    target = arm.tvm_target(ARM, board=board)
    assert target.kind.name == "llvm"
    assert str(target.attrs["mtriple"]).startswith("aarch64")
    assert bool(target.attrs["feature.has_asimd"]), f"board {board}: no NEON (asimd) in {target}"


@needs_cross
def test_board_tags_are_tvms():
    from portable_pe.backends import arm
    assert str(arm.tvm_target(ARM, board="rasp4b64").attrs["mcpu"]) == "cortex-a72"
    assert str(arm.tvm_target(ARM, board="rk3399").attrs["model"]) == "rk3399"
    # the Jetson tag is its GPU: we build for its CPU, the tag's host part
    assert int(arm.tvm_target(ARM, board="jetson-orin-nano").attrs["num-cores"]) == 6


@needs_cross
def test_unknown_board_lists_the_valid_ones():
    from portable_pe.backends import arm
    with pytest.raises(ValueError, match=r"unknown board 'rpi9'.*valid: generic, rasp4b64, rk3399, jetson-orin-nano"):
        arm.tvm_target(ARM, board="rpi9")


def test_missing_cross_compiler_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTABLE_PE_AARCH64_CXX", "no-such-aarch64-g++")
    with pytest.raises(RuntimeError, match=r"no-such-aarch64-g\+\+.*apt-get install g\+\+-aarch64-linux-gnu"):
        compile_graph(str(TINY_SPEC), target="arm", out=tmp_path / "b", log=lambda m: None)
    assert not (tmp_path / "b").exists()


def test_an_option_of_another_target_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"target 'llvm' takes no option board \(--board\); its valid options: none"):
        compile_graph(str(TINY_SPEC), target="llvm", target_options={"board": "rk3399"},
                      out=tmp_path / "b", log=lambda m: None)


@pytest.fixture(scope="module")
def arm_bundle(bundle_factory):
    require_cross()
    return bundle_factory(TINY_SPEC, "arm", board="rasp4b64")


def test_arm_bundle_is_aarch64_and_records_the_board(arm_bundle):
    assert elf_machine(arm_bundle.file("model.so")) == 0xB7  # EM_AARCH64
    target = arm_bundle.manifest["target"]
    assert (target["name"], target["host_arch"], target["options"]) == ("arm", "aarch64", {"board": "rasp4b64"})
    assert target["tvm"]["mcpu"] == "cortex-a72" and "+neon" in target["tvm"]["mattr"]
    assert arm_bundle.file("run_on_board.py").is_file()


def test_default_board_is_generic(bundle_factory):
    require_cross()
    bundle = bundle_factory(TINY_SPEC, "arm")
    assert bundle.manifest["target"]["options"] == {"board": "generic"}
    assert "mcpu" not in bundle.manifest["target"]["tvm"]


def test_arm_bundle_refuses_to_run_here_and_says_deploy(arm_bundle):
    with pytest.raises(BundleError, match=r"built for aarch64 \(arm target\).*portable-pe deploy"):
        run_local(arm_bundle, {})


@pytest.mark.slow
@needs_cross
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_every_shipped_graph_compiles_for_arm(graph, bundle_factory):
    bundle = bundle_factory(graph, "arm")
    assert elf_machine(bundle.file("model.so")) == 0xB7
