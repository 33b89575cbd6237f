"""Sources: what a dataset may be, and (later) ready-made remote and local sources."""

from asyncloader.sources._kinds import AsyncMapSource, MapSource, SourceKind, source_kind

__all__ = ["AsyncMapSource", "MapSource", "SourceKind", "source_kind"]
