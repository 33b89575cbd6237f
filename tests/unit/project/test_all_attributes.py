"""The public surface: what `asyncloader` exports is exactly its __all__."""

import asyncloader


def test_all_lists_every_public_name_and_only_those():
    """__all__ is sorted, each name exists, and no other public name is exported."""
    assert asyncloader.__all__ == sorted(asyncloader.__all__)
    for name in asyncloader.__all__:
        assert hasattr(asyncloader, name), name
    public = {
        name
        for name, value in vars(asyncloader).items()
        if not name.startswith("_")
        and (callable(value) or not isinstance(value, type(asyncloader)))
    }
    assert public == set(asyncloader.__all__)
