"""No token of an object-store source leaves a failure's text, against SeaweedFS (the
other sources and the redactor: tests/integration/sources/test_secrets.py)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import ObjectStoreSource
from tests.integration.sources.test_secrets import (
    FAST,
    TOKEN,
    _fail,
    _loader_texts,
    _log_text,
    assert_hidden,
    exception_texts,
)
from tests.integration.sources.test_secrets import logfile as logfile  # a fixture


@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tokens=st.lists(TOKEN, min_size=3, max_size=3, unique=True))
def test_no_storage_option_leaves_an_object_store_failure(seaweed, logfile, tokens):
    """Refused credentials (key, secret, session token) show in no failure of a listing or a
    read, nor in the log records."""
    key, secret, token = tokens
    options = seaweed.storage_options | {"key": key, "secret": secret, "token": token}
    options["client_kwargs"] = {**options["client_kwargs"], "aws_session_token": token}
    start = logfile.stat().st_size
    with pytest.raises(FetchError) as listing:
        ObjectStoreSource("s3://testbucket/", storage_options=options, retry=FAST)
    source = ObjectStoreSource(["s3://testbucket/k"], storage_options=options, retry=FAST)
    loader = AsyncLoader(source, collate_fn=list)
    with contextlib.closing(loader):
        exc = _fail(loader)
    assert isinstance(exc, FetchError), exc
    texts = exception_texts(listing.value) + exception_texts(exc) + _loader_texts(loader)
    texts += [repr(source), _log_text(logfile, start)]
    assert_hidden(tokens, texts, "object store")
