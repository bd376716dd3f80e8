"""`imagegen collect WHEEL... --external --arch LIST --out WHEELHOUSE`: a wheel imagegen did not build (an RTX
5090 user's SageAttention wheel built elsewhere) is verified (its real .nv_fatbin read by
imagegen.finish.verify), recorded as external in the wheelhouse's manifest, then indexed and published
(a real twine upload to the recording index on 127.0.0.1, a huggingface_hub commit to the Hub stand-in),
saying it is external wherever wheels are listed. What cannot be verified is refused in one line."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from imagegen import cli
from imagegen.publish.index import write_index
from imagegen.wheelhouse import external as external_wheels
from imagegen.wheelhouse import manifest as wheelhouse
from tests.publish_servers import FakeHub, FakeIndex, rebuilt
from tests.unit.executor_fixtures import WHEEL, pure_wheel

ARCHS = "8.0;9.0+PTX"  # what the fixture wheel carries: sm_80, sm_90, compute_90


def imagegen(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def external(tmp_path, *wheels, archs: str = ARCHS, out=None) -> tuple[int, str, str]:
    return imagegen("collect", *(wheels or (WHEEL,)), "--external", "--arch", archs, "--out",
                    out or tmp_path / "sage-wheels")


def test_an_external_wheel_is_verified_copied_flat_and_recorded_as_such(tmp_path):
    code, out, err = external(tmp_path)
    assert code == 0, err
    assert out.startswith(f"ok   {WHEEL}: recorded external (SASS/PTX for {ARCHS}; tags cp311-cp311-linux_x86_64")
    house = tmp_path / "sage-wheels"
    assert sorted(p.name for p in house.iterdir()) == ["manifest.json", WHEEL.name]  # flat: no cell folders
    [verified] = wheelhouse.verified_wheels(house)
    entry = verified.entry
    assert verified.path == house / WHEEL.name and verified.sha256 == wheelhouse.sha256(WHEEL)
    assert entry["external"] is True and entry["tags"] == ["cp311-cp311-linux_x86_64"]
    assert entry["checked"] == ["file name and tags", "SASS/PTX of every CUDA extension", "sha256 recorded"]
    assert "smoke test (import)" in entry["not_checked"]
    assert (entry["archs"], entry["expected_archs"], entry["cuda"], entry["torch"], entry["python"]) == (
        ARCHS, ARCHS, "cu130", "2.11", "3.11")
    assert entry["verify"]["ok"] is True
    assert entry["verify"]["extensions"][0]["archs"] == ["sm_80", "sm_90", "compute_90"]
    # Again: the same bytes are recorded again, nothing copied twice.
    assert external(tmp_path)[0] == 0 and len(wheelhouse.verified_wheels(house)) == 1


def test_wheels_already_in_the_wheelhouse_are_recorded_where_they_are(tmp_path):
    house = tmp_path / "sage-wheels"
    house.mkdir()
    wheel = house / WHEEL.name
    shutil.copyfile(WHEEL, wheel)
    assert wheelhouse.verified_wheels(house) == []  # not before collect
    assert external(tmp_path, wheel)[0] == 0
    assert sorted(p.name for p in house.iterdir()) == ["manifest.json", WHEEL.name]
    assert [v.path for v in wheelhouse.verified_wheels(house)] == [wheel]


def test_missing_archs_are_refused_and_nothing_is_recorded(tmp_path):
    code, out, err = external(tmp_path, archs="12.0")
    assert code == 6 and "FAIL" in out
    assert err.strip().splitlines() == [f"imagegen: error: 1 of 1 external wheels were not recorded: {WHEEL.name}:"
                                        " tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so lacks sm_120 (has sm_80,"
                                        " sm_90, compute_90)"]
    assert not (tmp_path / "sage-wheels").exists() or wheelhouse.verified_wheels(tmp_path / "sage-wheels") == []


def test_a_wheel_without_a_cuda_extension_is_refused(tmp_path):
    pure = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""})
    code, _, err = external(tmp_path, pure)
    assert code == 6 and "the wheel contains no CUDA extension" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sage-wheels" / pure.name).exists()


@pytest.mark.parametrize("make, needle", [
    (lambda p: p / "notes.txt", "not a wheel (NAME-VERSION-PYTHON-ABI-PLATFORM.whl)"),
    (lambda p: p / "missing-1.0-py3-none-any.whl", "no such wheel file"),
])
def test_what_is_not_a_wheel_is_refused_in_one_line_before_anything(tmp_path, make, needle):
    path = make(tmp_path)
    if path.name.endswith(".txt"):
        path.write_text("hello")
    code, out, err = external(tmp_path, WHEEL, path)
    assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sage-wheels").exists()  # refused before the good wheel was taken


def test_a_zip_that_is_no_wheel_is_a_problem_of_its_own(tmp_path):
    fake = tmp_path / "fake-1.0-cp311-cp311-linux_x86_64.whl"
    fake.write_bytes(b"not a zip")
    code, _, err = external(tmp_path, WHEEL, fake)
    assert code == 6 and "not a readable wheel" in err
    assert [v.path.name for v in wheelhouse.verified_wheels(tmp_path / "sage-wheels")] == [WHEEL.name]


def test_another_wheel_of_the_same_name_in_the_wheelhouse_is_not_replaced(tmp_path):
    other = rebuilt(WHEEL, tmp_path / "elsewhere")
    house = tmp_path / "sage-wheels"
    house.mkdir()
    shutil.copyfile(other, house / WHEEL.name)
    code, _, err = external(tmp_path)
    assert code == 10 and "is another wheel of the same name" in err
    assert (house / WHEEL.name).read_bytes() == other.read_bytes()


@pytest.mark.parametrize("argv, needle", [
    (["--external", "--arch", ARCHS], "collect --external needs --out WHEELHOUSE"),
    (["--external", "--out", "w"], "collect --external needs --arch LIST"),
    (["--arch", ARCHS], "--out and --arch are for --external wheels"),
])
def test_external_flags_go_together(tmp_path, argv, needle):
    code, _, err = imagegen("collect", WHEEL, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_index_and_publish_take_it_and_say_it_is_external(tmp_path, monkeypatch):
    assert external(tmp_path)[0] == 0
    house = tmp_path / "sage-wheels"
    result = write_index(house, say=lambda m: None)
    assert result.wheels == 1 and result.external == [WHEEL.name]
    code, out, _ = imagegen("index", house)
    assert code == 0 and f"  external: {WHEEL.name} (built outside imagegen" in out
    assert "tiny_kernel" in (house / "simple" / "tiny-kernel" / "index.html").read_text()

    monkeypatch.setenv("TWINE_USERNAME", "u")
    monkeypatch.setenv("TWINE_PASSWORD", "pw-ext-123456")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with FakeIndex("u", "pw-ext-123456") as index:
        code, out, err = imagegen("publish", house, "--to", f"pypi:{index.base}/legacy/", "--json")
        assert code == 0, err
        [outcome] = json.loads(out)["outcomes"]
        assert outcome["status"] == "uploaded" and outcome["external"] is True
        code, out, _ = imagegen("publish", house, "--to", f"pypi:{index.base}/legacy/")
        assert code == 0 and out.startswith(f"skipped      {WHEEL.name} [external] -> pypi:")


def test_publish_create_makes_the_hub_repository_and_the_commit_says_external(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    assert external(tmp_path)[0] == 0
    with FakeHub("hf_extTOKEN0123456789") as hub:  # no repository yet: --create makes it
        monkeypatch.setenv("HF_ENDPOINT", hub.base)
        monkeypatch.setenv("HF_TOKEN", "hf_extTOKEN0123456789")
        monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
        code, _, _ = imagegen("publish", tmp_path / "sage-wheels", "--to", "hf:rtx5090/sage-wheels")
        assert code == 9 and hub.created == []
        code, out, err = imagegen("publish", tmp_path / "sage-wheels", "--to", "hf:rtx5090/sage-wheels", "--create")
        assert code == 0, err
        assert [c["repo"] for c in hub.created] == ["rtx5090/sage-wheels"]
        assert out.startswith(f"uploaded     {WHEEL.name} [external] -> hf:rtx5090/sage-wheels")
        [commit] = hub.commits
        assert f"built outside imagegen (external): tiny-kernel 0.1.0+cu130torch2.11, SASS/PTX verified by imagegen" \
               f" for archs {ARCHS}" in commit["header"]["description"]
        assert hub.file("rtx5090/sage-wheels", WHEEL.name) == WHEEL.read_bytes()


def test_an_external_entry_is_keyed_by_its_file_and_marked_only_by_a_true_flag():
    from pathlib import Path

    key = external_wheels.cell_key(Path("sageattention-2.2.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl"))
    assert key == "external-sageattention-2_2_0_cu128torch2_8-cp312-cp312-linux_x86_64"
    assert external_wheels.is_external({"external": True})
    assert not any(external_wheels.is_external(e) for e in (None, {}, {"external": "true"}, {"external": 1}, ["external"]))
