"""Files and folders that appear complete or not at all: written under a temporary name
in the same folder (the same file system), then renamed over the target."""

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Union

PathLike = Union[str, Path]


def relax_permissions(path: Path) -> None:
    """Give a mkstemp/mkdtemp result (private, 0600/0700) the permissions a plain
    open/mkdir would have had."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` for a writer (``torch.save``,
    ``fig.savefig``, ...); renamed to ``path`` if the block succeeds, removed if not,
    so ``path`` keeps its old content on error. The temporary name keeps the suffix,
    for writers that choose a format by it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        relax_permissions(tmp)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_atomic(path: PathLike, data: Union[str, bytes]) -> Path:
    """Write text (UTF-8) or bytes to ``path`` atomically."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(path)


def write_json(path: PathLike, obj, indent: int = 2) -> Path:
    """``obj`` as JSON (one trailing newline), atomically."""
    return write_atomic(path, json.dumps(obj, indent=indent) + "\n")


@contextlib.contextmanager
def building_dir(target: PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to ``target``; it becomes ``target`` only if the
    block succeeds. A previous ``target`` is replaced only once the new folder is
    complete; a failure (or Ctrl-C) removes the temporary folder, so nothing
    half-written ever carries the target's name."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        relax_permissions(tmp)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not target.exists():
        os.rename(tmp, target)
        return
    # swap: the old folder aside (under a hidden name), then the new one in
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / target.name)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old / target.name, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
