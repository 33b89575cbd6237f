"""Row-oriented files read where they live: Parquet (``parquet``, reading ranges of a file
through ``ranges``) and JSON Lines (``jsonl``), both as sharded sources.

Imports: the standard library, ``asyncloader._base``, ``asyncloader.errors`` and the sources'
own modules; pyarrow and zstandard only when a file of theirs is read.
"""
