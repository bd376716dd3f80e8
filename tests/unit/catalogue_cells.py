"""Shared by the tests of imagegen.model.cell and imagegen.plan.matrix: a cell of a catalogue recipe,
made by the planner's own make_cell."""

from __future__ import annotations

from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell

CAT = load_catalogue()


def catalogue_cell(name, arch, torch="2.8", cuda="12.8", python="3.12", flavor="runpod", version=None, **kw):
    r = CAT.get(name)
    return make_cell(r, r.version(version), torch, cuda, python, parse_arch_list(arch), flavor, **kw)
