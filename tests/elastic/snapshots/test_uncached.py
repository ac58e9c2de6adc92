"""A snapshot part written around the page cache: the same bytes as a plain write, at
every size around the alignment and staging boundaries, on a disk and on a tmpfs, and
through the cache where the file system refuses uncached writes."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from elastic.snapshots import uncached
from elastic.snapshots.uncached import ALIGN, STAGING, UncachedFile

SIZES = [
    [0],
    [1],
    [ALIGN - 1],
    [ALIGN],
    [ALIGN + 1],
    [STAGING - 1],
    [STAGING],
    [STAGING + 1],
    [3, 2 * STAGING + 7, ALIGN, 1],  # pieces that straddle the staging buffer
]


@pytest.fixture(params=["disk", "tmpfs"])
def folder(request, tmp_path):
    if request.param == "disk":
        yield str(tmp_path)
        return
    path = os.path.join("/dev/shm", f"uncached-{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def write(path: str, pieces: list[bytes]) -> tuple[int, bool]:
    with UncachedFile(path) as f:
        for piece in pieces:
            f.write(memoryview(piece))
        f.flush()
        os.fsync(f.fileno())
        return f.tell(), f.direct


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "+".join(map(str, s)))
def test_the_file_holds_exactly_the_bytes_written(folder, sizes):
    pieces = [os.urandom(n) for n in sizes]
    path = os.path.join(folder, "part.bin")
    size, _ = write(path, pieces)
    assert size == sum(sizes)
    with open(path, "rb") as f:
        assert f.read() == b"".join(pieces)


def test_whole_blocks_go_around_the_cache_where_the_disk_takes_it(tmp_path):
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except OSError as exc:  # this file system has no O_DIRECT: nothing to check
        assert exc.errno == errno.EINVAL
        return
    _, direct = write(str(tmp_path / "part.bin"), [os.urandom(2 * STAGING)])
    assert direct


def test_a_file_system_that_refuses_uncached_writes_gets_the_same_bytes(tmp_path, monkeypatch):
    """Some file systems open with O_DIRECT and refuse the writes (EINVAL): the file is
    then written through the cache, from where the refused write began."""
    real_pwrite = os.pwrite

    def refusing(fd: int, data, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(uncached.os, "pwrite", refusing)
    pieces = [os.urandom(STAGING + 5), os.urandom(STAGING)]
    path = str(tmp_path / "part.bin")
    size, direct = write(path, pieces)
    assert not direct and size == 2 * STAGING + 5
    with open(path, "rb") as f:
        assert f.read() == b"".join(pieces)


def test_a_write_the_disk_refuses_for_another_reason_is_raised(tmp_path, monkeypatch):
    def full(fd: int, data, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(uncached.os, "pwrite", full)
    with pytest.raises(OSError) as raised, UncachedFile(str(tmp_path / "part.bin")) as f:
        f.write(os.urandom(STAGING))
    assert raised.value.errno == errno.ENOSPC
