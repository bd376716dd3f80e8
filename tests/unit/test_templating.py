"""The one Jinja2 environment of the render step (imagegen.render.templating)."""

from __future__ import annotations

from importlib import resources

import jinja2
import pytest

from imagegen.render import templating

TEMPLATES = {"Dockerfile.j2", "build.cmd.j2", "build.ps1.j2", "github-workflow.yml.j2"}


def test_it_reads_the_templates_in_render_templates():
    env = templating.environment(filters={})
    assert set(env.list_templates()) == TEMPLATES
    folder = resources.files("imagegen.render") / templating.TEMPLATES
    assert {p.name for p in folder.iterdir() if p.name.endswith(".j2")} == TEMPLATES
    assert not (resources.files("imagegen") / "templates").is_dir()  # the old home is gone
    for name in TEMPLATES:  # (compiling one needs its generator's filters: the source is enough here)
        source, filename, _ = env.loader.get_source(env, name)
        assert source and filename.replace("\\", "/").endswith(f"imagegen/render/templates/{name}")


def test_an_undefined_name_is_an_error():
    with pytest.raises(jinja2.UndefinedError):
        templating.environment(filters={}).from_string("{{ missing }}").render()


def test_blocks_leave_no_blank_lines_the_last_newline_stays_and_nothing_is_escaped():
    text = "a\n  {% if x %}\nb <&> {{ x }}\n  {% endif %}\nc\n"
    assert templating.environment(filters={}).from_string(text).render(x="<'\">") == "a\nb <&> <'\">\nc\n"


def test_filters_are_added_and_finalize_applies_to_plain_expressions_only():
    env = templating.environment(filters={"up": str.upper}, finalize=lambda value: f"[{value}]")
    assert env.from_string("{{ x }} {{ x | up }}").render(x="a") == "[a] [A]"
    assert templating.environment(filters={"up": str.upper}).from_string("{{ x | up }}").render(x="a") == "A"


def test_each_call_is_a_fresh_environment():
    first = templating.environment(filters={"only_here": str.upper})
    second = templating.environment(filters={})
    assert "only_here" in first.filters and "only_here" not in second.filters
    assert second.finalize is None and "upper" in second.filters  # jinja2's own filters stay
