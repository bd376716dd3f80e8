"""imagegen.finish.reuse on real ELF objects compiled here (tests/unit/elf_fixtures.py): an extension
built against an "older torch" (a libc10.so exporting c10::alpha() and beta()) is reusable with a torch
that still exports both, and not with one that lost either: the missing symbol is named demangled with
the library it came from, and the real loader agrees when the wheel is imported with that torch. What
is not torch's business (the wheel's own library, libstdc++'s std::string, a weak symbol, Python's C
API) is never held against it."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from imagegen.errors import NotReusableError, RefusedError, UsageError
from imagegen.finish import reuse
from imagegen.finish.reuse import check_reuse, place_reused, require_reusable, wheel_facts
from imagegen.publish.index import write_index

from tests.unit import elf_fixtures as fx


@pytest.fixture(scope="module")
def torches(tmp_path_factory):
    root = tmp_path_factory.mktemp("torches")
    return {
        "old": fx.torch_lib(root / "old", version="2.11.0"),
        "same": fx.torch_lib(root / "same", version="2.12.0"),
        "no-alpha": fx.torch_lib(root / "no-alpha", alpha=False, version="2.13.0"),
        "no-beta": fx.torch_lib(root / "no-beta", beta=False, version="2.13.0"),
        "no-dispose": fx.torch_lib(root / "no-dispose", dispose=False, version="2.12.0"),
        "cpu": fx.torch_lib(root / "cpu", cuda=False, version="2.12.0"),
    }


@pytest.fixture(scope="module")
def ext(tmp_path_factory, torches):
    return fx.extension(tmp_path_factory.mktemp("ext"), torches["old"], calls=("alpha", "beta", "dispose"))


def test_reusable_with_a_torch_that_exports_every_symbol(ext, torches):
    result = check_reuse(ext.wheel, torch="2.12", torch_wheel=torches["same"])
    assert result.reusable, result.problems
    assert result.built_for == "2.11" and result.target == "2.12.0+cu130"
    [so] = result.extensions
    assert so.name == f"pkg/_ext{fx.EXT_SUFFIX}" and so.needs == ["libc10.so"] and so.ok
    assert so.judged == 2  # c10::alpha() and beta(); not Python's API, the weak symbol, nor libstdc++'s
    assert result.import_status == "skipped" and result.gpu_check == "skipped"
    assert result.lines()[-1].startswith("reusable: ")
    require_reusable(result)


def test_a_namespaced_symbol_the_new_torch_dropped(ext, torches):
    result = check_reuse(ext.wheel, torch=None, torch_wheel=torches["no-alpha"])
    assert not result.reusable and result.symbols == "failed"
    [missing] = result.extensions[0].missing
    assert missing.symbol == "_ZN3c105alphaEv" and missing.demangled == "c10::alpha()"
    assert missing.expected_from == "libc10.so, by its namespace"
    assert "    missing c10::alpha() (expected from libc10.so, by its namespace)" in result.lines()
    with pytest.raises(NotReusableError, match=r"not reusable with torch 2\.13\.0: .*c10::alpha\(\)") as err:
        require_reusable(result)
    assert err.value.exit_code == 11


def test_the_torch_it_was_built_with_names_the_library(ext, torches):
    result = check_reuse(ext.wheel, torch=None, torch_wheel=torches["no-beta"], source_torch=torches["old"])
    [missing] = result.extensions[0].missing
    assert missing.symbol == "beta" and missing.expected_from == "libc10.so (torch 2.11.0)"
    # Without it, a plain C symbol nothing else it needs provides is still judged: it needs torch.
    alone = check_reuse(ext.wheel, torch=None, torch_wheel=torches["no-beta"])
    assert [m.symbol for m in alone.extensions[0].missing] == ["beta"]


def test_libstdcxx_still_provides_what_the_old_torch_exported_too(ext, torches):
    # torch 2.11's libraries export std::string::_M_dispose, which extensions bind to; 2.12's do not,
    # and libstdc++ provides it: not a missing symbol, with or without the torch it was built with.
    for source in (None, torches["old"]):
        result = check_reuse(ext.wheel, torch=None, torch_wheel=torches["no-dispose"], source_torch=source)
        assert result.reusable, result.problems


def test_a_torch_library_the_target_lacks(tmp_path, torches):
    cuda = fx.extension(tmp_path / "cuda", torches["old"], calls=("alpha",), needs_cuda=True)
    result = check_reuse(cuda.wheel, torch=None, torch_wheel=torches["cpu"])
    assert result.extensions[0].lacking_libraries == ["libtorch_cuda.so"]
    assert any("needs libtorch_cuda.so, which torch 2.12.0+cu130 does not have" in p for p in result.problems)
    assert check_reuse(cuda.wheel, torch=None, torch_wheel=torches["same"]).reusable


def test_the_wheels_own_library_is_not_torchs_business(tmp_path, torches):
    own = fx.extension(tmp_path / "own", torches["old"], calls=("alpha", "own"), own=True)
    result = check_reuse(own.wheel, torch=None, torch_wheel=torches["same"])
    assert result.reusable, result.problems  # c10::own() is in torch's namespace, and libown.so defines it


def test_a_pin_on_another_torch_and_another_python_are_not_reusable(tmp_path, torches):
    pinned = fx.extension(tmp_path / "pinned", torches["old"], calls=("alpha",), requires="torch (==2.11.0)")
    result = check_reuse(pinned.wheel, torch=None, torch_wheel=torches["same"])
    assert result.problems == ["its METADATA requires torch (==2.11.0): pip would replace torch 2.12.0 to install it"
                               " (pip install --no-deps would not)"]
    other = fx.extension(tmp_path / "py39", torches["old"], calls=("alpha",), python="cp39")
    wheel = fx.torch_wheel(tmp_path, torches["same"], "2.12.0")  # cp3XY of this interpreter
    result = check_reuse(other.wheel, torch=None, torch_wheel=wheel)
    assert any("a wheel for cp39" in p for p in result.problems), result.problems


def test_a_torch_wheel_file_is_read_for_its_libraries(tmp_path, ext, torches):
    wheel = fx.torch_wheel(tmp_path, torches["no-alpha"], "2.13.0")
    result = check_reuse(ext.wheel, torch="2.13.0", torch_wheel=wheel)
    assert [m.demangled for m in result.extensions[0].missing] == ["c10::alpha()"]
    assert result.target == "2.13.0"


def test_imported_with_the_target_torch_the_real_loader_agrees(tmp_path, ext, torches, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    good = fx.venv_with(tmp_path / "good", torches["same"])
    result = check_reuse(ext.wheel, torch="2.12.0", python_exe=str(good))
    assert result.reusable, result.problems
    assert result.imports == {"pkg": "ok", "pkg._ext": "ok"} and result.import_status == "ok"
    assert result.gpu_check == "skipped" and result.gpu_note.startswith("no GPU here")
    bad = fx.venv_with(tmp_path / "bad", torches["no-alpha"])
    result = check_reuse(ext.wheel, torch=None, python_exe=str(bad))
    assert result.symbols == "failed" and result.import_status == "failed"
    assert "undefined symbol: _ZN3c105alphaEv" in result.import_note
    assert result.gpu_note == "not run: the import failed"


def test_a_library_torch_loads_is_loaded_as_torch_loads_it(tmp_path, torches, monkeypatch):
    # torchvision's _C.so is no Python module (torch.ops.load_library loads it): Python's "does not define
    # module export function" is no failure; the library is loaded with every symbol bound instead.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    ops = fx.extension(tmp_path / "ops", torches["old"], calls=("beta",), ops=True)
    good = check_reuse(ops.wheel, torch=None, python_exe=str(fx.venv_with(tmp_path / "good", torches["same"])))
    assert good.reusable, good.problems
    assert good.imports["pkg._ops"].startswith("ok (a library torch loads, not a Python module")
    bad = check_reuse(ops.wheel, torch=None, python_exe=str(fx.venv_with(tmp_path / "bad", torches["no-alpha"])))
    assert bad.imports["pkg._ext"] == "ok"  # the module itself needs beta() only
    assert "undefined symbol: _ZN3c105alphaEv" in bad.imports["pkg._ops"]  # the loader's own word
    assert bad.import_status == "failed" and bad.symbols == "failed"


def test_bad_input_is_one_line(tmp_path, ext, torches):
    cases = [
        (dict(torch=None), "give the torch to check against"),
        (dict(torch=None, torch_wheel=torches["same"], python_exe="python3"), "not both"),
        (dict(torch="2.14", torch_wheel=torches["same"]), "--torch 2.14, but --torch-wheel"),
        (dict(torch="latest", torch_wheel=torches["same"]), "a torch release"),
        (dict(torch=None, torch_wheel=tmp_path / "nothing"), "no such file or folder"),
        (dict(torch=None, torch_wheel=tmp_path), "no torch/lib/libc10.so"),
        (dict(torch=None, torch_wheel=ext.wheel), "a wheel of pkg, not of torch"),
        (dict(torch=None, torch_wheel=torches["same"], timeout=0), "--timeout"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UsageError, match=message):
            check_reuse(ext.wheel, **kwargs)
    with pytest.raises(UsageError, match="no such wheel file"):
        check_reuse(tmp_path / "missing.whl", torch=None, torch_wheel=torches["same"])
    not_zip = tmp_path / "pkg-0.1.0-py3-none-any.whl"
    not_zip.write_text("not a zip")
    with pytest.raises(UsageError, match="not a readable wheel"):
        check_reuse(not_zip, torch=None, torch_wheel=torches["same"])


def test_an_interpreter_without_torch_is_one_line(tmp_path, ext):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    with pytest.raises(UsageError, match="has no torch"):
        check_reuse(ext.wheel, torch=None, python_exe=str(tmp_path / "v" / "bin" / "python"))


def test_an_unreadable_shared_object_is_not_reusable(tmp_path, ext, torches):
    broken = tmp_path / f"pkg-0.1.0-{fx.PY}-{fx.PY}-linux_x86_64.whl"
    with zipfile.ZipFile(ext.wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("pkg/libbroken.so", b"\x7fELF\x02\x01\x01" + b"\x00" * 9)
    result = check_reuse(broken, torch=None, torch_wheel=torches["same"])
    assert any(p.startswith("pkg/libbroken.so cannot be read") for p in result.problems), result.problems


def test_wheel_facts(tmp_path):
    facts = wheel_facts(fx.write_wheel(
        tmp_path / "x-1.0+cu128torch2.9-cp39-abi3-linux_x86_64.whl", {}, "x-1.0+cu128torch2.9.dist-info", "Metadata-Version: 2.1\nName: x\nVersion: 1.0\n"
        "Requires-Dist: torch>=2.9\nRequires-Dist: torch==2.0; extra == 'old'\n\nRequires-Dist: not-a-header\n"))
    assert (facts.built_for, facts.cuda, facts.abi3, facts.torch_requirement) == ("2.9", "cu128", True, "torch>=2.9")
    assert reuse.python_fits(facts, "3.12") and not reuse.python_fits(facts, "3.8")


def test_into_a_wheelhouse_the_manifest_and_the_index_say_reused(tmp_path, ext, torches):
    result = check_reuse(ext.wheel, torch=None, torch_wheel=torches["same"])
    out = tmp_path / "wheelhouse"
    dest = place_reused(result, ext.wheel, out, catalogue=None)
    assert dest == out / "pkg-0.1.0" / "torch2.12" / "cu130" / ext.wheel.name
    manifest = json.loads((dest.parent / "manifest.json").read_text())
    [(cell, entry)] = manifest["cells"].items()
    assert cell == f"pkg-0_1_0-torch2_12-cu130-py{fx.PY[2:]}"
    assert entry["reused_from"] == {"torch": "2.11", "checked_against": "2.12.0", "symbols": "ok",
                                    "import": "skipped", "gpu_check": "skipped"}
    assert entry["torch"] == "2.12.0" and entry["wheel"] == ext.wheel.name and entry["verify"]["ok"]
    # Placed again: the same bytes are recorded again, nothing refused.
    assert place_reused(result, ext.wheel, out, catalogue=None) == dest
    write_index(out, say=lambda _: None)
    page = (out / "index.html").read_text()
    assert 'data-imagegen-reused="built for torch 2.11, checked against torch 2.12.0"' in page
    assert "(reused: built for torch 2.11, checked against torch 2.12.0)" in page
    listing = json.loads((out / "simple" / "pkg" / "index.json").read_text())
    assert listing["files"][0]["_imagegen_reused"] == "built for torch 2.11, checked against torch 2.12.0"


def test_a_wheel_that_is_not_reusable_is_never_placed(tmp_path, ext, torches):
    result = check_reuse(ext.wheel, torch=None, torch_wheel=torches["no-alpha"])
    with pytest.raises(NotReusableError, match="not placed"):
        place_reused(result, ext.wheel, tmp_path / "wh", catalogue=None)
    assert not (tmp_path / "wh").exists()


def test_another_wheel_of_that_name_in_the_way_is_refused(tmp_path, ext, torches):
    result = check_reuse(ext.wheel, torch=None, torch_wheel=torches["same"])
    folder = tmp_path / "wh" / "pkg-0.1.0" / "torch2.12" / "cu130"
    folder.mkdir(parents=True)
    (folder / ext.wheel.name).write_bytes(b"another wheel")
    with pytest.raises(RefusedError, match="another wheel of the same name"):
        place_reused(result, ext.wheel, tmp_path / "wh", catalogue=None)
    assert not (folder / "manifest.json").exists()
