"""imagegen.finish.symbols on real shared objects compiled here (tests/unit/elf_fixtures.py): both
readers (pyelftools, nm/readelf) say the same DT_NEEDED, undefined, weak and exported symbols, the
version of a libc reference names its library, and a file that is no ELF, too large or out of time is
refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from imagegen.errors import Unreadable
from imagegen.finish import symbols
from imagegen.finish.symbols import demangle, read_links
from imagegen.untrusted import Deadline

from tests.unit import elf_fixtures as fx


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("elf")
    torch = fx.torch_lib(root / "torch")
    ext = fx.extension(root / "ext", torch, calls=("alpha", "beta", "dispose"))
    return torch, ext


def test_pyelftools_and_nm_read_the_same(built):
    torch, ext = built
    assert symbols.has_pyelftools() and shutil.which("nm") and shutil.which("readelf"), \
        "pyelftools (the publish extra) and binutils are both needed to compare the readers"
    for path in (ext.so, torch / "torch" / "lib" / "libc10.so", torch / "torch" / "lib" / "libtorch_cuda.so"):
        a = read_links(path, deadline=Deadline(60), reader="elftools")
        b = read_links(path, deadline=Deadline(60), reader="nm")
        assert a.needed == b.needed
        assert set(a.undefined) == set(b.undefined)
        assert a.weak_undefined == b.weak_undefined
        assert a.exports == b.exports


def test_what_an_extension_needs_and_exports(built):
    torch, ext = built
    links = read_links(ext.so, deadline=Deadline(60), reader="elftools")
    assert links.needed[0] == "libc10.so"
    assert "_ZN3c105alphaEv" in links.undefined and links.undefined["_ZN3c105alphaEv"] is None  # torch's: unversioned
    assert "beta" in links.undefined
    assert fx.STD_DISPOSE in links.undefined and links.undefined[fx.STD_DISPOSE] is None  # bound to the stand-in
    assert "nobody_defines_this" in links.weak_undefined and "nobody_defines_this" not in links.undefined
    assert "PyInit__ext" in links.exports
    lib = read_links(torch / "torch" / "lib" / "libc10.so", deadline=Deadline(60), reader="elftools")
    assert {"_ZN3c105alphaEv", "beta", "_ZN3c105gammaEv", fx.STD_DISPOSE} <= lib.exports


def test_a_versioned_reference_names_its_library(tmp_path):
    src = tmp_path / "v.c"
    src.write_text("#include <string.h>\n#include <stdio.h>\nint f(const char *s) { printf(\"%s\", s); return strlen(s); }\n")
    fx.gcc("-shared", "-fPIC", "-o", tmp_path / "libv.so", src, cwd=tmp_path)
    elftools = read_links(tmp_path / "libv.so", deadline=Deadline(60), reader="elftools")
    assert elftools.undefined["printf"] == "libc.so.6"
    nm = read_links(tmp_path / "libv.so", deadline=Deadline(60), reader="nm")
    assert nm.undefined["printf"].startswith("GLIBC_")  # nm knows the version, not its library


@pytest.mark.parametrize("reader", ["elftools", "nm"])
def test_what_is_not_a_shared_object_is_refused_in_one_line(tmp_path, reader):
    text = tmp_path / "libnot.so"
    text.write_text("INPUT(-lc)\n")  # a linker script under a library's name
    with pytest.raises(Unreadable, match="not an ELF shared object"):
        read_links(text, deadline=Deadline(60), reader=reader)
    truncated = tmp_path / "libcut.so"
    truncated.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + b"\x03\x00")
    with pytest.raises(Unreadable, match="not a readable ELF shared object"):
        read_links(truncated, deadline=Deadline(60), reader=reader)


def test_reads_are_bounded_in_size_and_time(built, monkeypatch):
    torch, ext = built
    with pytest.raises(Unreadable, match="within the 0 s"):
        read_links(ext.so, deadline=Deadline(0), reader="elftools")
    monkeypatch.setattr(symbols, "MAX_ELF_BYTES", 1024)
    with pytest.raises(Unreadable, match="larger than"):
        read_links(ext.so, deadline=Deadline(60), reader="nm")
    monkeypatch.setattr(symbols, "MAX_ELF_BYTES", 4 << 30)
    monkeypatch.setattr(symbols, "MAX_SYMBOLS", 3)
    for reader in ("elftools", "nm"):
        with pytest.raises(Unreadable, match="more than the 3"):
            read_links(torch / "torch" / "lib" / "libc10.so", deadline=Deadline(60), reader=reader)


def test_without_either_reader_it_says_what_to_install(built, monkeypatch):
    _, ext = built
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(Unreadable, match="pip install pyelftools"):
        read_links(ext.so, deadline=Deadline(60), reader="nm")


def test_demangle():
    assert demangle(["_ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE", "beta"],
                    deadline=Deadline(60)) == {
        "_ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE":
            "c10::impl::cow::materialize_cow_storage(c10::StorageImpl&)",
        "beta": "beta"}


def test_demangle_without_cxxfilt_keeps_the_names(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert demangle(["_ZN3c105alphaEv"], deadline=Deadline(60)) == {"_ZN3c105alphaEv": "_ZN3c105alphaEv"}


def test_an_empty_file_path_is_unreadable(tmp_path: Path):
    with pytest.raises(Unreadable, match="cannot be read"):
        read_links(tmp_path / "missing.so", deadline=Deadline(60))
