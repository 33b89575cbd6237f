"""ParquetSource over ``s3://``, against SeaweedFS (the rest: tests/integration/sources/
test_parquet.py)."""

from __future__ import annotations

from asyncloader.sources import ParquetSource
from tests.helpers.columnar import parquet_set, rows
from tests.integration.sources.test_parquet import GROUP, SIZES, TOTAL, stream
from tests.servers import BUCKET, put_objects


def test_object_store(seaweed):
    objects = {f"parquet/{name}": data for name, data in parquet_set(SIZES, GROUP).items()}
    put_objects(seaweed, objects)
    urls = [f"s3://{BUCKET}/{key}" for key in objects]
    source = ParquetSource(urls, storage_options=seaweed.storage_options, columns=["id", "text"])
    got = stream(source)
    assert got == [{"id": r["id"], "text": r["text"]} for r in rows(0, TOTAL)]
