"""Issue 34, items 1 and 6: several versions of one recipe in one plan, bake and workflow (seed 001's
FA_VERSIONS="2.8.2 2.8.3"); no single-valued flag that keeps the last of two values; generated bake files
that build together; every suggested flag one the command takes (seed 000: native mode never says
--cuda); --print-env that downloads nothing and never prints over a failed audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from imagegen.cli import build_parser, main
from imagegen.errors import CompatError, UsageError
from imagegen.executors import native
from imagegen.model.catalogue import load_catalogue
from imagegen.render import bakefiles
from tests.unit import bake_print_stand_in as stand_in
from tests.unit.command_helpers import TINY, fake_host, native_cell, parse

FA = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "8.0;9.0"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------- several versions


@pytest.mark.parametrize("versions", [["--version", "2.8.2", "--version", "2.8.3"], ["--version", "2.8.2 2.8.3"],
                                      ["--version", "2.8.2,2.8.3"]])
def test_plan_takes_several_versions_of_one_recipe(capsys, versions):
    code, out, _ = run(capsys, "plan", "flash-attn", *versions, *FA, "--json")
    assert code == 0
    cells = json.loads(out)["cells"]
    assert sorted(c["version"] for c in cells) == ["2.8.2", "2.8.3"]


def test_two_versions_make_distinct_bake_targets_wheelhouse_folders_and_version_groups(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bakefiles, "print_bake", stand_in.print_bake)
    code, _, _ = run(capsys, "bake", "flash-attn", "--version", "2.8.2,2.8.3", *FA, "-f", "fa.json",
                     "--layout", "fa{version}/torch{torch}/{cuda}")
    assert code == 0
    d = json.loads((tmp_path / "fa.json").read_text())
    assert sorted(d["target"]) == ["fa2-2_8_2-torch2_8-cu128-py312", "fa2-2_8_3-torch2_8-cu128-py312"]
    assert sorted(t["output"][0] for t in d["target"].values()) == [
        "type=local,dest=wheelhouse/fa2.8.2/torch2.8/cu128", "type=local,dest=wheelhouse/fa2.8.3/torch2.8/cu128"]
    assert d["group"]["flash-attn-2_8_2"]["targets"] == ["fa2-2_8_2-torch2_8-cu128-py312"]
    assert d["group"]["flash-attn-2_8_3"]["targets"] == ["fa2-2_8_3-torch2_8-cu128-py312"]


def test_two_bake_files_build_together_by_their_version_groups(tmp_path, monkeypatch, capsys):
    """buildx keeps the last file's group of a name (`default`, `flash-attn`); the version groups differ."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bakefiles, "print_bake", stand_in.print_bake)
    for v in ("2.8.2", "2.8.3"):
        assert run(capsys, "bake", "flash-attn", "--version", v, *FA, "-f", f"fa{v}.json")[0] == 0
    files = [Path("fa2.8.2.json"), Path("fa2.8.3.json")]
    alone = stand_in.print_bake_files(files, tmp_path)
    assert list(alone["target"]) == ["fa2-2_8_3-torch2_8-cu128-py312"]  # `default`: the last file's
    both = stand_in.print_bake_files(files, tmp_path, ["flash-attn-2_8_2", "flash-attn-2_8_3"])
    assert sorted(both["target"]) == ["fa2-2_8_2-torch2_8-cu128-py312", "fa2-2_8_3-torch2_8-cu128-py312"]


def test_ci_windows_jobs_take_several_versions(tmp_path, monkeypatch):
    from imagegen.commands import ci
    args = parse("ci", "github", "--windows", "fa2", "--windows-version", "2.8.2,2.8.3", "--windows-torch", "2.8",
                 "--windows-cuda", "12.8", "--windows-arch", "8.0;9.0", "--imagegen-from", "imagegen-wheels @ git+https://x/y@v1")
    request = ci.windows_request(args)
    assert request.versions == ("2.8.2", "2.8.3") and "--windows-version" in request.command()
    cells, left_out = ci.windows_cells(request, tmp_path)
    assert [(c.name, c.version) for c in cells] == [("fa2-2_8_2-torch2_8-cu128-py312", "2.8.2"),
                                                    ("fa2-2_8_3-torch2_8-cu128-py312", "2.8.3")]


@pytest.mark.parametrize("argv, says", [
    (["plan", "fa2", "--ref", "v2.8.2", "--version", "2.8.2,2.8.3"], "--ref is one source"),
    (["render", "fa2", "--version", "2.8.2,2.8.3"], "--version takes one value here"),
])
def test_one_source_takes_one_version(capsys, argv, says):
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out and err.count("\n") == 1 and says in err, err


def test_a_native_build_takes_one_version(tmp_path):
    py = fake_host(tmp_path)
    with pytest.raises(UsageError, match="--native builds one version at a time"):
        native_cell(parse("build", "--native", "fa2", "--version", "2.8.2,2.8.3", "--python-exe", py), load_catalogue())


# ------------------------------------------------------------------ a single value given twice


@pytest.mark.parametrize("argv", [["render", "sage", "--arch", "8.0", "--arch", "9.0"],
                                  ["render", "sage", "--torch", "2.8", "--torch", "2.9"],
                                  ["render", "fa2", "--version", "2.8.2", "--version", "2.8.3"]])
def test_render_refuses_a_cell_flag_given_twice(capsys, argv):
    code, out, err = run(capsys, *argv)
    flag = argv[2]
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith(f"imagegen: error: imagegen render: {flag} given twice") and "render makes one cell" in err
    assert "plan, bake and build take several" in err


def _single_valued_options():
    """(command, option, a value) for every option of every subcommand that takes one value."""
    parser = build_parser()
    out = []

    def walk(p, prefix):
        for action in p._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):  # subparsers
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])
            elif action.option_strings and type(action).__name__ == "_Once":
                out.append((tuple(prefix), action.option_strings[-1], action))
    walk(parser, [])
    return out


def test_every_single_valued_option_refuses_a_second_value():
    found = _single_valued_options()
    assert len(found) > 60  # every subcommand's; none left to argparse's plain store
    for command, option, action in found:
        parser = build_parser()
        a, b = (list(action.choices)[:2] if action.choices else ["1", "2"])
        with pytest.raises(UsageError, match=f"{option} given twice"):
            parser.parse_args([*command, option, str(a), option, str(b)])


def test_the_same_value_twice_drops_nothing_and_passes():
    assert build_parser().parse_args(["render", "sage", "--arch", "9.0", "--arch", "9.0"]).arch == "9.0"


# ------------------------------------------------------------ suggestions the command accepts


def test_a_native_build_without_a_gpu_says_what_to_install_not_cuda(tmp_path):
    """Seed 000: no GPU, no --arch, a cu126 torch: the default archs include sm_120."""
    py = fake_host(tmp_path, torch="2.9.0", torch_cuda="12.6", nvcc="12.6")
    with pytest.raises(CompatError) as info:
        native_cell(parse("build", "--native", "bsa", "--python-exe", py), load_catalogue())
    assert "--cuda" not in str(info.value)
    assert str(info.value).endswith("sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: install CUDA 12.8 or"
                                    " newer (its nvcc, and a torch built for it), or build the others: --arch '8.0;9.0'")


def test_a_native_build_names_the_torch_to_install_not_torch_flag(tmp_path):
    py = fake_host(tmp_path, torch="2.9.0", torch_cuda="12.8", nvcc="12.8")
    with pytest.raises(CompatError) as info:
        native_cell(parse("build", "--native", "xformers", "--arch", "9.0", "--python-exe", py), load_catalogue())
    assert "use --torch" not in str(info.value)
    assert "install torch 2.10 or newer (a native build uses this host's torch), or --version" in str(info.value)


def test_a_rejected_windows_ci_cell_names_the_windows_flags(tmp_path):
    from imagegen.commands import ci
    args = parse("ci", "github", "--windows", "xformers", "--windows-torch", "2.9", "--windows-cuda", "12.8",
                 "--windows-arch", "9.0", "--imagegen-from", "imagegen-wheels @ git+https://x/y@v1")
    with pytest.raises(CompatError) as info:
        ci.windows_cells(ci.windows_request(args), tmp_path)
    assert "use --windows-torch 2.10 or newer, or --windows-version 0.0.33.post2" in str(info.value)


@pytest.mark.parametrize("argv, says", [
    (["render", "sage", "--arch", "9.0"], "the Dockerfile takes it at build time (docker build --build-arg MAX_JOBS=N)"),
    (["render", "sage", "--arch", "9.0", "--shell", "cmd"], "use --max-jobs"),
    (["plan", "sage", "--arch", "9.0"], "imagegen build sets it (--max-jobs)"),
    (["bake", "sage", "--arch", "9.0"], "the bake file takes it at bake time (IMAGEGEN_MAX_JOBS=N docker buildx bake)"),
    (["build", "sage", "--arch", "9.0"], "use --max-jobs"),
])
def test_an_env_imagegen_sets_names_what_sets_it_for_this_command(capsys, tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv, "--env", "MAX_JOBS=3")
    assert code == 2 and err.count("\n") == 1 and err.rstrip().endswith(says), err


def test_verify_gpu_names_check_for_a_recipe_it_cannot_find():
    from imagegen.finish import check
    with pytest.raises(Exception) as info:
        check.recipe_for(load_catalogue(), "no-such-dist", how="imagegen check W.whl --recipe NAME")
    assert "name one with imagegen check W.whl --recipe NAME" in str(info.value)


def test_no_message_of_the_engine_suggests_native_as_a_flag():
    from imagegen import engine
    assert engine.NO_DOCKER.endswith("or build without Docker: imagegen build --native")
    assert engine.no_engine("x").endswith("or build without Docker: imagegen build --native")


# ------------------------------------------------------------------------------------- --print-env


def test_print_env_downloads_nothing_when_the_source_is_not_here(tmp_path, monkeypatch, capsys):
    py = fake_host(tmp_path)
    steps: list = []
    monkeypatch.setattr(native, "_run_step", lambda *a, **k: steps.append(a[6]) or 0.0)
    monkeypatch.setattr(native, "_audit", lambda *a, **k: pytest.fail("audited a source that is not here"))
    code, out, err = run(capsys, "build", "--native", "fa2", "--arch", "9.0", "--python-exe", py, "--print-env",
                         "--work", tmp_path / "w")
    assert code == 0 and json.loads(out)["FLASH_ATTN_CUDA_ARCHS"] == "90" and steps == []
    assert "--print-env fetches nothing" in err and not (tmp_path / "w" / "src").exists()


def test_print_env_with_a_failed_audit_is_an_error_not_exit_0(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from imagegen.model import audit
    py = fake_host(tmp_path)  # a local project: its source is here, so --print-env audits it first
    monkeypatch.setattr(native, "_run_step", lambda *a, **k: 0.0)
    monkeypatch.setattr(native, "_audit", lambda *a, **k: SimpleNamespace(ok=False))
    monkeypatch.setattr(audit, "refuse", lambda cell, verdict: CompatError(f"{cell.name}: the audit refused it"))
    code, out, err = run(capsys, "build", "--native", "--source", TINY, "--arch", "9.0", "--python-exe", py,
                         "--print-env", "--work", tmp_path / "w")
    assert code != 0 and out == "" and "the audit refused it" in err and err.count("\n") == 1


def test_a_windows_script_of_one_version_names_the_windows_matrix_that_takes_several(capsys, tmp_path, monkeypatch):
    # A team's flash-attn matrix: render --shell writes one cell's script; the Windows jobs take the versions.
    code, out, err = run(capsys, "render", "flash-attn", "--shell", "powershell", "--version", "2.8.2,2.8.3",
                         "--torch", "2.8", "--cuda", "12.8")
    assert code == 2 and not out and err.count("\n") == 1 and "--windows-version" in err, err
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "ci", "github", "--windows", "flash-attn", "--windows-version", "2.8.2,2.8.3",
                         "--windows-torch", "2.6,2.7,2.8", "--windows-cuda", "126,128,129", "--windows-python",
                         "cp310,cp311,cp312", "--windows-arch", "80;86;89;90", "-o", "-")
    assert code == 0, err
    rows = yaml.safe_load(out)["jobs"]["build-windows"]["strategy"]["matrix"]["include"]
    assert len(rows) == 36 and {r["version"] for r in rows} == {"2.8.2", "2.8.3"}
    assert len({(r["version"], r["torch"], r["cuda"], r["python"]) for r in rows}) == 36  # one job per cell
