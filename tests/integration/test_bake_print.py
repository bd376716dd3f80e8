"""Generated bake definitions checked by buildx itself (`docker buildx bake --print`) and read back:
the repository's files, IMAGEGEN_-prefixed overrides, `imagegen bake --print`, and hostile strings that
must reach buildx literally.

These need the docker CLI with the buildx plugin (no daemon): scripts/install-engine.sh installs both,
and scripts/test.sh runs it first. A missing buildx fails the tests; it is not a skip. What needs no
buildx is tests/unit/test_bake.py and tests/unit/test_bakefiles.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from imagegen.cli import main
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import MatrixRequest
from imagegen.plan.matrix import expand
from imagegen.render import bake as B
from imagegen.render.bake import build_definition
from imagegen.render.bakefiles import print_bake, validate_round_trip
from imagegen.render.dockerfile import builder_files

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny_kernel"


@pytest.fixture(scope="module", autouse=True)
def buildx():
    proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True) if shutil.which("docker") else None
    if proc is None or proc.returncode != 0:
        pytest.fail("docker buildx is required for these tests: run scripts/install-engine.sh (scripts/test.sh does)")


@pytest.mark.parametrize("rel", ["docker-bake.hcl"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bake").glob("*.json")))
def test_every_generated_bake_file_passes_buildx_print_and_reads_back(rel):
    printed = print_bake(ROOT / rel, ROOT)
    meant = json.loads((ROOT / rel).read_text()) if rel.endswith(".json") else None
    if meant is None:
        # The HCL says the same as the JSON union: compare with a fresh definition.
        from imagegen.plan.matrix import defaults
        from imagegen.render.bakefiles import REPO_SCRIPTS, repo_plan

        meant = build_definition(repo_plan(load_catalogue()), out_dir=defaults()["repo"]["out"], root=ROOT,
                                 scripts=REPO_SCRIPTS).as_dict()
    validate_round_trip(meant, printed)
    for name, target in printed["target"].items():
        assert target["target"] == "wheels" and target["output"][0].startswith("type=local,dest=wheelhouse/")
        assert "args" not in target or not target["args"], "no override set: the Dockerfile defaults apply"
        assert target["context"] == "dockerfiles" and (ROOT / "dockerfiles" / target["dockerfile"]).is_file()


def test_prefixed_variables_override_and_generic_names_do_not_leak(tmp_path):
    ca = tmp_path / "my-ca.pem"
    ca.write_text("not a real CA, only its path is read by --print\n")
    printed = print_bake(ROOT / "docker-bake.hcl", ROOT, ["sage-2_2_0-torch2_8-cu128-py312"],
                         env={"IMAGEGEN_TORCH_CUDA_ARCH_LIST": "9.0;12.0+PTX", "IMAGEGEN_MAX_JOBS": "2",
                              "MAX_JOBS": "64", "TORCH_CUDA_ARCH_LIST": "7.0", "IMAGEGEN_PIP_CERT": str(ca)})
    t = printed["target"]["sage-2_2_0-torch2_8-cu128-py312"]
    assert t["args"] == {"TORCH_CUDA_ARCH_LIST": "9.0;12.0+PTX", "MAX_JOBS": "2"}
    # the compile cache's secret names its variable only: the URL (a credential) never goes into the file
    assert t["secret"] == [f"id=pip_cert,src={ca}", "id=imagegen_ccache_remote,env=IMAGEGEN_CCACHE_REMOTE"]


def test_bake_command_writes_checks_and_prints(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["bake", "sage", "flash-attn", "--torch", "2.8", "--cuda", "12.8", "--python", "3.11",
                 "--python", "3.12", "--arch", "8.0;9.0", "-f", "out.json", "--out", "wh", "--print"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    names = sorted(printed["target"])
    assert names == ["fa2-2_8_3-torch2_8-cu128-py311", "fa2-2_8_3-torch2_8-cu128-py312",
                     "sage-2_2_0-torch2_8-cu128-py311", "sage-2_2_0-torch2_8-cu128-py312"]
    assert printed["target"]["fa2-2_8_3-torch2_8-cu128-py311"]["output"] == ["type=local,dest=wh/flash-attn-2.8.3/torch2.8/cu128"]
    assert (tmp_path / "dockerfiles" / "fa2-2_8_3-torch2_8-cu128-py311.Dockerfile").is_file()


def test_bake_local_source_uses_a_named_context(tmp_path, monkeypatch, capsys):
    project = tmp_path / "proj"
    shutil.copytree(FIXTURE, project)
    monkeypatch.chdir(tmp_path)
    code = main(["bake", "--source", "proj", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11",
                 "--arch", "8.0;9.0+PTX", "--flavor", "pypi", "-f", "docker-bake.hcl", "--print"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed["target"]) == ["tiny-kernel-0_1_0-torch2_11-cu130-py311"]
    # imagegen's build steps are written beside the Dockerfiles: the files build without imagegen.
    assert printed["target"]["tiny-kernel-0_1_0-torch2_11-cu130-py311"]["contexts"] == {
        "source": "./proj", "imagegen-scripts": "./dockerfiles/imagegen-scripts"}
    # every file the script needs, nothing else
    assert sorted(p.name for p in (tmp_path / "dockerfiles" / "imagegen-scripts").iterdir()) == sorted(builder_files())


def _definition(value: str) -> dict:
    plan = expand(MatrixRequest(recipes=[(r := load_catalogue().get("sage"), r.version(None))], torch=["2.8"],
                                cuda=["12.8"], python=["3.12"], archs=[parse_arch_list("9.0")], flavor="runpod"))
    d = B.build_definition(plan, out_dir="wheelhouse").as_dict()
    t = next(iter(d["target"].values()))
    t["context"] = value
    t["labels"]["hostile"] = value + " %{ if true }x%{ endif } $${x} $$${y} a$ %%{z"
    return d


@pytest.mark.parametrize("suffix", [".hcl", ".json"])
def test_bake_strings_reach_buildx_literally(tmp_path, suffix):
    """`${` and `%{` in a value we did not write as an interpolation are escaped in HCL and in JSON
    (bake evaluates templates in both): buildx reads the very value back; our own interpolations work."""
    d = _definition("${IMAGEGEN_PIP_CERT}")
    text = B.to_json(d) if suffix == ".json" else B.to_hcl(d, "header")
    f = tmp_path / f"x{suffix}"
    f.write_text(text)
    (tmp_path / "ca.pem").write_text("")
    printed = print_bake(f, tmp_path, env={"IMAGEGEN_PIP_CERT": str(tmp_path / "ca.pem"), "IMAGEGEN_MAX_JOBS": "3"})
    validate_round_trip(d, printed)  # context and labels exactly as meant
    got = next(iter(printed["target"].values()))
    assert got["context"] == "${IMAGEGEN_PIP_CERT}"
    assert got["labels"]["hostile"].endswith(" %{ if true }x%{ endif } $${x} $$${y} a$ %%{z")
    assert str(got["secret"][0]).endswith(f"{tmp_path}/ca.pem") or "ca.pem" in json.dumps(got["secret"])
    assert got["args"]["MAX_JOBS"] == "3"


@pytest.mark.parametrize("fmt", ["json", "hcl"])
def test_an_arm64_cell_reaches_buildx_with_its_platform_and_an_amd64_cell_without_one(tmp_path, monkeypatch, capsys, fmt):
    monkeypatch.chdir(tmp_path)
    code = main(["bake", "sage", "--flavor", "pypi", "--torch", "2.11", "--cuda", "13.0", "--python", "3.12",
                 "--arch", "9.0", "--platform", "linux/amd64,arm64", "-f", f"out.{fmt}", "--out", "wh", "--print"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)["target"]
    assert sorted(printed) == ["sage-2_2_0-torch2_11-cu130-py312", "sage-2_2_0-torch2_11-cu130-py312-arm64"]
    assert printed["sage-2_2_0-torch2_11-cu130-py312-arm64"]["platforms"] == ["linux/arm64"]
    assert "platforms" not in printed["sage-2_2_0-torch2_11-cu130-py312"]  # the builder's own platform, as before
    # both wheels land in the same folder: their file names differ by platform tag
    assert {t["output"][0] for t in printed.values()} == {"type=local,dest=wh/sageattention-2.2.0/torch2.11/cu130"}


def test_a_jetson_matrix_reaches_buildx_as_arm64_targets_on_each_jetpacks_image(tmp_path, monkeypatch, capsys):
    # no --platform: the jetson flavor has arm64 images only; Orin (8.7, JetPack 6) and Thor (11.0, JetPack 7)
    monkeypatch.chdir(tmp_path)
    code = main(["bake", "causal-conv1d", "--flavor", "jetson", "--torch", "2.9", "--cuda", "12.6", "--cuda", "13.0",
                 "--python", "3.10", "--python", "3.12", "--arch", "8.7", "--arch", "11.0", "-f", "out.hcl",
                 "--out", "wh", "--print"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)["target"]
    assert sorted(printed) == ["causal-conv1d-1_6_1-torch2_9-cu126-py310-arm64",
                               "causal-conv1d-1_6_1-torch2_9-cu130-py312-arm64"]
    orin, thor = (printed[n] for n in sorted(printed))
    assert orin["platforms"] == thor["platforms"] == ["linux/arm64"]
    texts = [(tmp_path / t["context"] / t["dockerfile"]).read_text() for t in (orin, thor)]
    assert "ARG BASE_IMAGE=nvcr.io/nvidia/l4t-jetpack:r36.4.0\n" in texts[0]
    assert "ARG BASE_IMAGE=nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu24.04\n" in texts[1]
    assert "ARG TORCH_CUDA_ARCH_LIST=8.7\n" in texts[0] and "ARG TORCH_CUDA_ARCH_LIST=11.0\n" in texts[1]


def test_two_bake_files_of_two_versions_build_together_by_their_version_groups(tmp_path, monkeypatch, capsys):
    """Seed 001's two flash-attn versions in two files: buildx keeps the last file's `default` (and
    `flash-attn`) group, so `-f a -f b` alone is b's; the version groups stay apart and build both."""
    monkeypatch.chdir(tmp_path)
    cell = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "8.0;9.0"]
    for v in ("2.8.2", "2.8.3"):
        assert main(["bake", "flash-attn", "--version", v, *cell, "-f", f"fa{v}.hcl"]) == 0
    capsys.readouterr()

    def printed(*targets: str) -> dict:
        proc = subprocess.run(["docker", "buildx", "bake", "--print", "-f", "fa2.8.2.hcl", "-f", "fa2.8.3.hcl", *targets],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    assert sorted(printed()["target"]) == ["fa2-2_8_3-torch2_8-cu128-py312"]
    assert sorted(printed("flash-attn-2_8_2", "flash-attn-2_8_3")["target"]) == [
        "fa2-2_8_2-torch2_8-cu128-py312", "fa2-2_8_3-torch2_8-cu128-py312"]
