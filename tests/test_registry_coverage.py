"""Every registry entry has a test (optimum's test_all_models_tested): each registered target,
NPU vendor, NPU profile and position encoding appears among the parameters of some collected
test. conftest.pytest_itemcollected records them; the check runs only when the whole tests/
folder was collected, since a partial run cannot tell an untested entry from an unselected one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import COLLECTED


def registries() -> dict[str, list[str]]:
    """Registry -> its entry names (keys only: VENDORS is becoming a table of records)."""
    from portable_pe.backends.targets import TARGETS
    from portable_pe.npu.profiles import PROFILES
    from portable_pe.npu.vendors import VENDORS
    from portable_pe.spec.encodings import ENCODINGS
    return {"portable_pe.backends.targets.TARGETS": list(TARGETS),
            "portable_pe.npu.vendors.VENDORS": list(VENDORS),
            "portable_pe.npu.profiles.PROFILES": list(PROFILES),
            "portable_pe.spec.encodings.ENCODINGS": list(ENCODINGS)}


def appears(name: str, ids: set[str]) -> bool:
    """`name` is a parameter value, or whole dash-separated parts of a parameter id
    ("ethos-u55" in "rope-ethos-u55", but "rope" not in "rope_interleaved")."""
    return any(i == name or f"-{name}-" in f"-{i}-" for i in ids)


def untested(regs: dict[str, list[str]], collected: dict[str, set[str]]) -> dict[str, list[str]]:
    """Registry -> its names that no collected test (other than this file's) has as a parameter."""
    ids = set().union(*(v for k, v in collected.items() if k != Path(__file__).name))
    missing = {reg: [n for n in names if not appears(n, ids)] for reg, names in regs.items()}
    return {reg: names for reg, names in missing.items() if names}


def test_every_registry_entry_has_a_test():
    folder = Path(__file__).parent
    files = {p.name for p in folder.glob("test_*.py")}
    if not files <= set(COLLECTED):
        pytest.skip(f"only part of tests/ was collected ({len(files & set(COLLECTED))} of {len(files)} files): "
                    "run `python -m pytest` (the whole folder) to check registry coverage")
    missing = untested(registries(), COLLECTED)
    assert not missing, ("registry entries without a test (parametrize a test over them): "
                         + "; ".join(f"{reg}: {', '.join(names)}" for reg, names in missing.items()))


def test_an_entry_without_a_test_is_reported(monkeypatch):
    """A fake entry in each registry, with the ids the other tests really have: each is named."""
    from portable_pe.backends import targets
    from portable_pe.npu import profiles, vendors
    from portable_pe.spec import encodings
    monkeypatch.setitem(targets.TARGETS, "fake_target", Path("targets/fake_target.toml"))
    monkeypatch.setitem(vendors.VENDORS, "fake_vendor", "portable_pe.npu.fake_vendor")
    monkeypatch.setitem(profiles.PROFILES, "fake-profile", Path("targets/npu/fake-profile.toml"))
    monkeypatch.setitem(encodings.ENCODINGS, "fake_encoding", object)
    collected = {"test_x.py": {"rope_interleaved-generic_int8", "llvm", "fake_target_2", "fake-profile2"},
                 Path(__file__).name: {"fake_encoding", "fake_vendor"}}  # this file's own ids do not count
    fakes = {"portable_pe.backends.targets.TARGETS": ["fake_target"],
             "portable_pe.npu.vendors.VENDORS": ["fake_vendor"],
             "portable_pe.npu.profiles.PROFILES": ["fake-profile"],
             "portable_pe.spec.encodings.ENCODINGS": ["fake_encoding"]}
    for ids in (collected, COLLECTED):  # made-up ids, and this run's real ones
        missing = untested(registries(), ids)
        assert {reg: [n for n in names if n.startswith("fake")] for reg, names in missing.items()} == fakes
    missing = untested(registries(), collected)
    assert "generic_int8" not in missing["portable_pe.npu.profiles.PROFILES"]  # a dash-separated part
    assert "llvm" not in missing["portable_pe.backends.targets.TARGETS"]  # a whole id
    assert "rope" in missing["portable_pe.spec.encodings.ENCODINGS"]  # "rope_interleaved" is not "rope"
