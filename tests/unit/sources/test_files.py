"""FileSource: local files through aiofiles, ranges, directories, permanent local errors."""

import asyncio
import contextlib
import os

import pytest

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import FileSource, Retry, Skipped
from asyncloader.sources._files import FileClient
from asyncloader.sources._retry import Permanent, Transient


def write(tmp_path, n):
    paths = []
    for i in range(n):
        path = tmp_path / f"sub{i % 2}" / f"f{i:03d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(bytes([i]) * (100 + i))
        paths.append(path)
    return paths


def bodies(loader):
    return [body for batch in loader for body in batch]


def test_item_is_the_bytes_of_its_file(tmp_path):
    """Item i is the content of paths[i], in sampler order."""
    paths = write(tmp_path, 12)
    got = bodies(AsyncLoader(FileSource(paths), batch_size=5, collate_fn=list))
    assert got == [p.read_bytes() for p in paths]


def test_a_directory_becomes_its_files_sorted(tmp_path):
    """A directory argument lists its files recursively in sorted path order."""
    paths = sorted(write(tmp_path, 6), key=str)
    source = FileSource(tmp_path)
    assert source.targets == [str(p) for p in paths] and len(source) == 6


def test_ranges_and_size_limit(tmp_path):
    """(path, offset, length) reads those bytes; a file over max_object_size is refused."""
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(200)))
    source = FileSource([(str(path), 50, 10), str(path)], max_object_size=100)
    with pytest.raises(FetchError, match="over max_object_size=100"):
        bodies(AsyncLoader(source, batch_size=2, collate_fn=list))
    ranged = FileSource([(str(path), 50, 10)])
    assert bodies(AsyncLoader(ranged, collate_fn=list)) == [bytes(range(50, 60))]


def test_missing_file_fails_at_once_or_is_skipped(tmp_path):
    """A missing file is permanent (1 attempt); with on_error='skip' it is a Skipped marker."""
    paths = [*write(tmp_path, 2), tmp_path / "missing"]
    with pytest.raises(FetchError, match=r"missing: gave up after 1 attempt.*FileNotFoundError"):
        bodies(AsyncLoader(FileSource(paths), batch_size=3, collate_fn=list))
    source = FileSource(paths, on_error="skip", max_skipped=1)
    got = bodies(AsyncLoader(source, batch_size=3, collate_fn=list))
    assert isinstance(got[2], Skipped) and got[2].index == 2 and source.skipped == 1


# Only regular files are read, and never past the size fstat reported.


@contextlib.contextmanager
def released(fifo):
    """On exit, wakes a reader blocked opening ``fifo`` (it then reads its end), so that a
    failing test cannot leave a thread stuck in open() for good."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # ENXIO: no reader is waiting
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path):
    """open() of a FIFO blocks until a writer comes, and a device has no size: neither is
    read. The refusal is permanent (one attempt), ranged or not, streamed or not."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    with released(fifo):
        for paths in ([fifo], [(fifo, 0, 10)], ["/dev/null"]):
            loader = AsyncLoader(FileSource(paths), collate_fn=list, timeout=5)
            with pytest.raises(FetchError, match=r"gave up after 1 attempt.*not a regular file"):
                bodies(loader)

        async def stream():
            return [chunk async for chunk in FileClient(None).stream(fifo, 0, {})]

        with pytest.raises(Permanent, match="not a regular file"):
            asyncio.run(asyncio.wait_for(stream(), 10))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_a_file_longer_than_its_stat_size_is_not_read_past_it():
    """A file that holds more than fstat said (here /proc's, whose size reads 0; or a file
    growing as it is read) fails as transient once more than that size is read, so
    max_object_size holds: at most its size + 1 byte is read."""
    reads = []

    async def read():
        client = FileClient(10)
        try:
            await client.read("/proc/self/status", None, None)
        except Transient as exc:
            reads.append(str(exc))

    asyncio.run(read())
    assert reads and "changed size while read" in reads[0]
    source = FileSource(["/proc/self/status"], retry=Retry(attempts=2, backoff=0.01))
    with pytest.raises(FetchError, match=r"gave up after 2 attempt.*changed size while read"):
        bodies(AsyncLoader(source, collate_fn=list))
