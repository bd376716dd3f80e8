"""executors/bases.py: a cell with fallback base images builds on the first that can be had; a cell
with none fails alone, naming every candidate's reason. The engine is stood in for by the probe (the
pull itself is registry.pull, tested against a real registry in tests/integration)."""

from __future__ import annotations

import pytest

from imagegen.plan import registry
from imagegen.errors import ImageMissing, RegistryError
from imagegen.executors import bases
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell

CAT = load_catalogue()


def cell(cuda="13.0", base_image=None, flavor="pypi", torch="2.11"):
    r = CAT.get("sage")
    c = make_cell(r, r.version(None), torch, cuda, "3.12", parse_arch_list("9.0"), flavor, base_image)
    assert c.buildable, c.problems
    return c


def probe_of(answers: dict[str, str | None], calls: list[str]):
    def probe(ref: str) -> str | None:
        calls.append(ref)
        return answers[ref]
    return probe


def test_a_cell_without_fallbacks_is_not_probed():
    calls: list[str] = []
    c = cell(base_image="a/b:1")
    chosen, failed = bases.pick([c], say=lambda m: None, probe=probe_of({}, calls))
    assert chosen == [c] and failed == {} and calls == []


def test_the_primary_when_it_can_be_had():
    calls: list[str] = []
    c = cell(base_image="a/b:1,c/d:2")
    chosen, failed = bases.pick([c], say=lambda m: None, probe=probe_of({"a/b:1": None}, calls))
    assert chosen == [c] and calls == ["a/b:1"]


def test_the_next_candidate_when_the_primary_cannot_be_pulled():
    said: list[str] = []
    calls: list[str] = []
    c = cell(base_image="127.0.0.1:9/x/base:1,a/b:2,c/d:3")
    answers = {"127.0.0.1:9/x/base:1": "cannot reach 127.0.0.1:9", "a/b:2": "a/b:2 is not in its registry", "c/d:3": None}
    (chosen, again), failed = bases.pick([c, c], say=said.append, probe=probe_of(answers, calls))
    assert failed == {} and again == chosen and calls == ["127.0.0.1:9/x/base:1", "a/b:2", "c/d:3"]  # each image probed once
    assert chosen.base.ref == "c/d:3" and chosen.base.fallbacks == ()
    assert chosen.notes[-1] == "built on the fallback base image c/d:3: 127.0.0.1:9/x/base:1: cannot reach 127.0.0.1:9"
    assert not any(n.startswith("fallback base image:") for n in chosen.notes)
    assert said[0] == f"[{c.name}] base image 127.0.0.1:9/x/base:1: cannot reach 127.0.0.1:9: building on the fallback c/d:3"


def test_no_candidate_fails_the_cell_alone():
    calls: list[str] = []
    stuck = cell(base_image="a/b:1,c/d:2")
    fine = cell(cuda="12.8", flavor="cuda", torch="2.8")
    chosen, failed = bases.pick([stuck, fine], say=lambda m: None,
                                probe=probe_of({"a/b:1": "denied", "c/d:2": "missing"}, calls))
    assert chosen == [fine]
    assert failed == {stuck.name: "no base image could be had: a/b:1: denied; c/d:2: missing"}


def test_the_manylinux_fallback_keeps_what_the_flavor_knows():
    c = cell(cuda="12.8", flavor="manylinux", torch="2.8")
    assert c.base.fallbacks == ("sameli/manylinux_2_34_x86_64_cuda_12.8",)
    calls: list[str] = []
    (chosen,), _ = bases.pick([c], say=lambda m: None, probe=probe_of(
        {"pytorch/manylinux2_28-builder:cuda12.8": "not in its registry", "sameli/manylinux_2_34_x86_64_cuda_12.8": None}, calls))
    assert chosen.base.ref == "sameli/manylinux_2_34_x86_64_cuda_12.8"
    assert (chosen.base.python, chosen.base.nvcc, chosen.base.flavor) == (c.base.python, c.base.nvcc, c.base.flavor)


@pytest.mark.parametrize(("exists", "pull", "expected"), [
    (True, None, None),
    (False, "sha256:" + "0" * 64, None),
    (False, ImageMissing("a/b:1 is not in its registry"), "a/b:1 is not in its registry"),
    (False, RegistryError("cannot reach 127.0.0.1:9: start the registry"), "cannot reach 127.0.0.1:9: start the registry"),
])
def test_unavailable_is_a_local_image_or_a_pull(monkeypatch, exists, pull, expected):
    pulled: list[str] = []

    def fake_pull(ref):
        pulled.append(ref)
        if isinstance(pull, Exception):
            raise pull
        return pull

    monkeypatch.setattr(registry, "image_exists", lambda ref: exists)
    monkeypatch.setattr(registry, "pull", fake_pull)
    assert bases.unavailable("a/b:1") == expected
    assert pulled == ([] if exists else ["a/b:1"])
