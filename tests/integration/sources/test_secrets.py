"""Credentials never leave a source failure, in any encoding.

Tokens drawn by hypothesis (URL-special characters, one of ``+/=`` always among them) are put
where credentials sit: query values (percent-encoded, form-encoded, lower-case hex), the
user-info's user and password, credential headers, storage options. Each error path (404,
reset, timeout, too many redirects, invalid URL, oversize, skip) is run through a loader, in
the training process and with the fetch in worker processes (the traceback text crosses
processes), and every string that leaves is searched for every encoding of every token: the
exception, its notes, args and attributes, its cause/context chain (aiohttp's request_info
included), the traceback text, ``skip_log``, ``report()``, ``state_dict()``, reprs, Skipped
markers and asyncloader's log records at DEBUG (of the worker processes too). Then the
redactor alone, over many more tokens: every encoding, every header and storage option, the
exception chain, the Failure carried to the training process, the log filter.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import pickle
import re
import string
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from asyncloader import AsyncLoader, FetchError
from asyncloader._base.failure import Failure
from asyncloader.errors import RedactedError, RemoteTraceback
from asyncloader.sources import HTTPSource, Retry, ShardedSource
from asyncloader.sources._redact import (
    Redactor,
    header_secrets,
    hide_urls,
    option_secrets,
    redact_exception,
    redact_url,
    url_secrets,
)
from tests.helpers.depth import scaled
from tests.servers import Faults, FaultyHTTPServer

_URL_SPECIAL = "+/=&?#%@:;, !$'()*[]~\"<>\\^`{|}"
_ALPHABET = string.ascii_letters + string.digits + _URL_SPECIAL
_CORE = st.text(alphabet=_ALPHABET, min_size=1, max_size=12)
#: A token: URL-special characters, one of ``+/=`` always among them; the fixed ends keep it
#: from occurring by chance in ordinary text (a port, a path).
TOKEN = st.builds(lambda a, mid, b: f"Tk{a}{mid}{b}Zq", _CORE, st.sampled_from("+/="), _CORE)
#: Errors that end a fetch, once a token is hidden: raised quickly, never retried for long.
FAST = Retry(attempts=2, backoff=0.001, max_backoff=0.001, deadline=None)
PATHS = ("missing", "reset", "stall", "loop", "invalid", "big")


def _lower_hex(text: str) -> str:
    return re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), text)


def encodings(token: str) -> set[str]:
    """``token`` raw and percent-encoded (quote, quote_plus, with and without ``/`` safe), in
    both cases of hex."""
    forms = {token}
    for safe in ("", "/"):
        forms |= {quote(token, safe=safe), quote_plus(token, safe=safe)}
    return forms | {_lower_hex(f) for f in forms}


def exception_texts(exc: BaseException) -> list[str]:
    """Every string reachable from ``exc``: its rendering, and for each exception of its
    chain (causes, contexts, group members) its message, repr, args, notes and attributes."""
    texts = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        texts += [str(e), repr(e), repr(e.args), *getattr(e, "__notes__", ())]
        texts += [f"{name}={value!r}" for name, value in vars(e).items()]
        info = getattr(e, "request_info", None)  # aiohttp: the request's URL and headers
        if info is not None:
            texts += [repr(info), str(getattr(info, "real_url", ""))]
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
        todo += [e.__cause__, e.__context__]
    return texts


def assert_hidden(tokens: list[str], texts: list[str], where: str, extra: set[str] = frozenset()):
    forms = set().union(*(encodings(t) for t in tokens)) | set(extra)
    for text in texts:
        for form in forms:
            assert form not in text, f"{where}: {form!r} shown in {text[:2000]!r}"


class RedirectLoop:
    """An aiohttp app on 127.0.0.1 whose every path redirects to itself, query included."""

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location=str(request.rel_url))

    def __enter__(self) -> RedirectLoop:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

        async def start() -> None:
            assert self._runner is not None
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = self._runner.addresses[0][1]

        self._loop.run_until_complete(start())
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-redirects")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._runner is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


@dataclass
class Servers:
    faulty: FaultyHTTPServer
    redirects: RedirectLoop

    def arm(self) -> None:
        """Every request for ``reset`` is reset mid-body, for ``stall`` stalls (for 2 s)."""
        many = 1000
        self.faulty.set_faults(
            Faults(script={"reset": ["reset"] * many, "stall": ["stall"] * many}, stall=2.0)
        )

    def base(self, path: str) -> str:
        if path == "loop":
            return f"127.0.0.1:{self.redirects.port}/{path}"
        if path == "invalid":
            return f"127.0.0.1:99999/{path}"  # a port out of range: aiohttp's InvalidURL
        return f"127.0.0.1:{self.faulty.port}/{path}"


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    objects = {"reset": b"r" * 512, "big": b"b" * 4096, "stall": b"s" * 16}
    with FaultyHTTPServer(objects) as faulty, RedirectLoop() as redirects:
        yield Servers(faulty, redirects)


class AppendHandler(logging.Handler):
    """Writes each record with one unbuffered ``write`` to a file opened for appending: safe
    across a fork (a FileHandler's buffer lock, held by a thread at the fork, would stay
    held in the child for good)."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.DEBUG)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, record: logging.LogRecord) -> None:
        os.write(self.fd, (self.format(record) + "\n").encode("utf-8", "replace"))

    def close(self) -> None:
        os.close(self.fd)
        super().close()


@pytest.fixture(scope="module")
def logfile(tmp_path_factory) -> Iterator[Path]:
    """asyncloader's log records at DEBUG, of this process and of the workers it forks, in a
    file. (Other libraries' own DEBUG records are theirs: botocore's print signed headers.)"""
    path = tmp_path_factory.mktemp("secrets") / "records.log"
    path.touch()
    handler = AppendHandler(path)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("asyncloader")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield path
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
        handler.close()


@dataclass
class Secrets:
    """Where each drawn token goes: each place has its own, so each is tested alone."""

    security_token: str  # X-Amz-Security-Token query value, quote(safe="")
    sig: str  # sig query value, quote_plus, lower-case hex
    user: str
    password: str
    bearer: str  # Authorization: Bearer (aiohttp refuses it together with a user-info)
    cookie: str
    api_key: str
    userinfo: bool

    @property
    def tokens(self) -> list[str]:
        shown = [self.security_token, self.sig, self.cookie, self.api_key]
        return shown + ([self.user, self.password] if self.userinfo else [self.bearer])

    @property
    def basic(self) -> set[str]:
        """The Authorization header aiohttp makes of the user-info."""
        pair = f"{self.user}:{self.password}".encode()
        return {base64.b64encode(pair).decode()} if self.userinfo else set()

    def url(self, servers: Servers, path: str) -> str:
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@"
        query = (
            f"X-Amz-Security-Token={quote(self.security_token, safe='')}"
            f"&sig={_lower_hex(quote_plus(self.sig))}"
        )
        return f"http://{auth if self.userinfo else ''}{servers.base(path)}?{query}"

    def headers(self) -> dict[str, str]:
        headers = {"Cookie": f"session={self.cookie}", "X-Api-Key": self.api_key}
        if not self.userinfo:
            headers["Authorization"] = f"Bearer {self.bearer}"
        return headers


def _secrets(toks: list[str], userinfo: bool) -> Secrets:
    """A user name holds no ``:`` (Basic authorization could not say where it ends)."""
    toks[2] = toks[2].replace(":", "")
    return Secrets(*toks, userinfo=userinfo)


SECRETS = st.builds(
    _secrets,
    st.lists(TOKEN, min_size=7, max_size=7, unique=True),
    st.booleans(),
)


def _source(secrets: Secrets, servers: Servers, **kwargs) -> HTTPSource:
    urls = [secrets.url(servers, path) for path in PATHS]
    return HTTPSource(
        urls, headers=secrets.headers(), timeout=0.25, retry=FAST, max_object_size=1024, **kwargs
    )


def _fail(loader: AsyncLoader) -> BaseException:
    with pytest.raises(Exception) as info:
        for _ in loader:
            pass
    return info.value


def _loader_texts(loader: AsyncLoader) -> list[str]:
    return [repr(loader.skip_log), loader.report(), repr(loader.state_dict())]


def _log_text(logfile: Path, start: int) -> str:
    with open(logfile, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        return f.read()


def _run_paths(secrets: Secrets, servers: Servers, workers: int) -> list[tuple[str, list[str]]]:
    """Each error path once, raised; then all of them skipped (by the loader, then the
    source); then a sharded stream's 404. Returns ``(where, texts)`` to search."""
    found: list[tuple[str, list[str]]] = []
    source = _source(secrets, servers)
    order = [0]
    # timeout: a batch that never comes fails the example, its workers reaped, rather than
    # hanging until pytest-timeout interrupts it and leaves them to the tests after.
    opts = {
        "num_workers": workers,
        "fetch_in_workers": workers > 0,
        "collate_fn": list,
        "timeout": 60,
    }
    loader = AsyncLoader(source, sampler=order, persistent_workers=workers > 0, **opts)
    with contextlib.closing(loader):
        for i, path in enumerate(PATHS):
            order[0] = i
            exc = _fail(loader)
            assert isinstance(exc, FetchError), (path, exc)
            # With workers, the failure and its traceback text crossed a process boundary.
            assert isinstance(exc.__cause__, RemoteTraceback) == (workers > 0), path
            found.append((path, exception_texts(exc) + _loader_texts(loader)))
    found.append(("source", [repr(source), str(source.targets)]))
    skipping = AsyncLoader(source, on_error="skip", max_skipped=len(PATHS), **opts)
    with contextlib.closing(skipping):
        assert [b for b in skipping] == []
        assert len(skipping.skip_log) == len(PATHS)
        found.append(("loader skip", _loader_texts(skipping)))
    own = _source(secrets, servers, on_error="skip", max_skipped=len(PATHS))
    marked = AsyncLoader(own, **opts)
    with contextlib.closing(marked):
        batches = list(marked)
        found.append(("source skip", [repr(batches), repr(own.skip_log), repr(own)]))
    shards = ShardedSource(
        [secrets.url(servers, "missing")], headers=secrets.headers(), retry=FAST, timeout=0.25
    )
    sharded = AsyncLoader(shards, **opts)
    with contextlib.closing(sharded):
        exc = _fail(sharded)
        assert isinstance(exc, FetchError), exc
        found.append(("sharded", exception_texts(exc) + _loader_texts(sharded) + [repr(shards)]))
    return found


@pytest.mark.parametrize("workers", [0, 2])
@settings(
    max_examples=scaled(4),
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: 2 s an example
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(secrets=SECRETS)
def test_no_token_leaves_any_error_path(servers, logfile, workers, secrets):
    """No encoding of any token appears in anything a failure leaves behind."""
    servers.arm()
    start = logfile.stat().st_size
    found = _run_paths(secrets, servers, workers)
    records = _log_text(logfile, start)
    assert "retrying" in records and "skipped" in records  # the records are all there
    found.append(("log records", [records]))
    for where, texts in found:
        assert_hidden(secrets.tokens, texts, where, secrets.basic)


# --- The redactor alone: every encoding, every place, fast enough for many examples. ---

ANY_TOKEN = TOKEN | st.builds(lambda a, b: f"Tk{a}+{b}Zq", st.text(min_size=1), st.text(min_size=1))


def _yarl_value(token: str) -> str:
    """The query value as aiohttp's URL type writes it (its own set of safe characters)."""
    from yarl import URL

    return str(URL.build(scheme="http", host="h", query={"v": token})).partition("v=")[2]


@settings(max_examples=scaled(150), deadline=None)
@given(token=ANY_TOKEN)
def test_every_encoding_of_a_secret_is_hidden(token):
    """A secret is hidden raw, decoded, percent-encoded with any safe set and either case of
    hex (mixed too), form-encoded, double-encoded, and as yarl writes it."""
    redact = Redactor([token])
    forms = encodings(token) | {_yarl_value(token), quote(quote(token, safe=""), safe="")}
    mixed = re.sub("%[0-9A-F]{2}", lambda m: m[0][:2] + m[0][2].lower(), quote(token, safe=""))
    for form in forms | {mixed}:
        shown = redact(f"signature {form} does not match")
        assert form not in shown and "***" in shown, (form, shown)


@settings(max_examples=scaled(100), deadline=None)
@given(user=TOKEN, password=TOKEN, query=TOKEN)
def test_url_credentials_are_hidden_by_shape(user, password, query):
    """Any URL in any text loses its user-info (user and password) and query values, known
    or not; text without URL credentials is left exactly as it was."""
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}"
    url = f"https://{auth}@127.0.0.1:8/k?X-Amz-Signature={quote_plus(query)}&a"
    for text in (redact_url(url), hide_urls(f"GET {url}: 403"), Redactor()(f"url='{url}'")):
        assert_hidden([user, password, query], [text], "shape")
    assert redact_url(url) == "https://***:***@127.0.0.1:8/k?X-Amz-Signature=***&***"
    plain = "s3://bucket/a/b.tar failed at https://h/x, then HTTP://H/Y."
    assert hide_urls(plain) == plain


def test_url_secrets_include_the_user_info_and_its_basic_authorization():
    """The user, the password and the Basic authorization aiohttp makes of them."""
    found = url_secrets("https://us%2Ber:p%40ss@h/x?sig=a%2Bb&t=1")
    basic = base64.b64encode(b"us+er:p@ss").decode()
    assert {"us%2Ber", "p%40ss", basic, "a%2Bb", "1"} <= set(found)


def test_only_random_looking_runs_of_a_secret_are_hidden_alone():
    """A base64-looking secret's runs of 8+ letters and digits that mix digits or cases are
    hidden alone; a plain word inside a secret is not (the key ``asyncloader-test`` must not
    scrub every note the library writes while its source lives)."""
    redact = Redactor(["asyncloader-test", "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"])
    note = "asyncloader: stage=fetch batch=1 indices=[4]"
    assert redact(note) == note
    assert redact("key wJalrXUtnFEMI, then bPxRfiCY") == "key ***, then ***"
    assert redact("asyncloader-test") == "***"


HEADERS = [
    lambda t: {"Authorization": f"Bearer {t}"},
    lambda t: {"Proxy-Authorization": f"Basic {t}"},
    lambda t: {"Cookie": f"theme=dark; session={t}"},
    lambda t: {"X-Api-Key": t},
    lambda t: {"X-Amz-Security-Token": t},
    lambda t: {"X-Auth-Token": t},
]
OPTIONS = [
    lambda t: {"key": t},
    lambda t: {"secret": t},
    lambda t: {"token": t},
    lambda t: {"session_token": t},
    lambda t: {"client_kwargs": {"aws_secret_access_key": t, "endpoint_url": "http://h:9"}},
    lambda t: {"client_kwargs": {"aws_session_token": t}},
    lambda t: {"connection_string": f"AccountName=acct;AccountKey={t};EndpointSuffix=x.net"},
    lambda t: {"sas_token": f"sv=2022-11-02&ss=b&sig={quote(t, safe='')}"},
    lambda t: {"account_key": t},
    lambda t: {"client_kwargs": {"cookies": {"session": t}}},
    lambda t: {"client_kwargs": {"headers": {"Authorization": f"Bearer {t}"}}},
    lambda t: {"token": {"type": "service_account", "private_key": t}},
    lambda t: {"password": t},
    lambda t: {"client_kwargs": {"endpoint_url": f"http://u:{quote(t, safe='')}@h:9/"}},
]
_NO_SEPARATORS = string.ascii_letters + string.digits + "+/=-_.~%!$'()*@:?#[]"
PART_TOKEN = st.builds(
    lambda a, mid, b: f"Tk{a}{mid}{b}Zq",
    st.text(alphabet=_NO_SEPARATORS, min_size=1, max_size=12),
    st.sampled_from("+/="),
    st.text(alphabet=_NO_SEPARATORS, min_size=1, max_size=12),
)


@pytest.mark.parametrize("make", HEADERS + OPTIONS)
@settings(max_examples=scaled(25), deadline=None)
@given(token=PART_TOKEN)
def test_credential_headers_and_storage_options_are_hidden_alone(make, token):
    """The token inside each credential header and storage option is hidden even where a
    message shows it alone (a cookie's value, a connection string's AccountKey, a SAS
    token's sig, the credential after Bearer)."""
    given_ = make(token)
    found = header_secrets(given_) if make in HEADERS else option_secrets(given_)
    redact = Redactor(found)
    for form in encodings(token):
        assert form not in redact(f"refused {form}!"), form


def _aiohttp_error(url: str, token: str) -> BaseException:
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    headers = CIMultiDictProxy(CIMultiDict({"Authorization": f"Bearer {token}"}))
    info = aiohttp.RequestInfo(URL(url), "GET", headers, URL(url))
    return aiohttp.ClientResponseError(info, (), status=403, message="Forbidden")


class UserError(Exception):
    """A user's own exception, with an attribute and a custom constructor."""

    def __init__(self, message: str, where: object) -> None:
        super().__init__(message)
        self.where = where


def test_redact_exception_keeps_the_users_type_and_replaces_secret_links():
    """The exception caught keeps its type (its strings redacted); a link of its chain whose
    text or attributes (aiohttp's request_info) held a secret becomes a RedactedError with
    its type name and status; a link without one stays itself; a cycle ends."""
    token = "Tk+sEcReT/=Zq"
    url = f"http://127.0.0.1:1/k?sig={quote(token, safe='')}"
    harmless = FileNotFoundError("no such key")
    inner = _aiohttp_error(url, "bEaReRtOkEn")
    inner.__context__ = harmless
    top = UserError(f"decode of {url} failed", where={"url": url})
    top.add_note(f"note {quote_plus(token)}")
    top.__cause__ = inner
    harmless.__context__ = top  # a cycle
    redact = Redactor([token, "Bearer bEaReRtOkEn"])
    redact_exception(top, redact)
    assert type(top) is UserError and isinstance(top.where, str)
    assert_hidden([token, "bEaReRtOkEn"], exception_texts(top), "chain")
    link = top.__cause__
    assert isinstance(link, RedactedError) and link.status == 403
    assert link.type_name == "aiohttp.client_exceptions.ClientResponseError"
    assert link.__context__ is harmless and top.__suppress_context__
    assert pickle.loads(pickle.dumps(link)).type_name == link.type_name


def test_a_failure_and_its_traceback_text_pass_through_live_redactors():
    """While a source's redactor lives, a captured failure's exception, notes and traceback
    text are redacted, and so is what reaches the training process after pickling."""
    token = "Tk+fAiLuRe/=Zq"
    redact = Redactor([token])
    try:
        try:
            raise OSError(2, "no such file", f"/data/{token}")
        except OSError as exc:
            raise RuntimeError(f"read {quote(token, safe='')} failed") from exc
    except RuntimeError as exc:
        failure = Failure.capture(exc, "fetch", 3, [7], 7)
    back = pickle.loads(pickle.dumps(failure))
    assert type(back.exc) is RuntimeError and redact is not None
    texts = exception_texts(failure.exc) + exception_texts(back.exc) + [failure.tb, back.tb]
    assert_hidden([token], texts, "failure")
    assert "stage=fetch batch=3 index=7" in failure.tb


def test_log_records_of_the_library_pass_through_live_redactors(caplog):
    """A record on asyncloader's loggers shows no secret of a live redactor."""
    token = "Tk+lOgGeD/=Zq"
    redact = Redactor([token])
    caplog.set_level(logging.DEBUG, logger="asyncloader")
    for name in ("asyncloader", "asyncloader.sources"):
        logging.getLogger(name).debug("retrying %s: %s", "x", quote_plus(token))
    assert caplog.records and redact is not None
    assert_hidden([token], [caplog.text], "log")
