"""FileSource: local files through aiofiles, ranges, directories, permanent local errors."""

import pytest

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import FileSource, Skipped


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
