"""Hostile HTTP replies against both HTTP readers: HTTPSource (whole bodies) and ShardedSource
over http:// (streams resumed by Range).

A seeded matrix of cases, each a script of replies for one URL of a session's two servers:
lying lengths, gzip bombs, trickles, redirect loops and chains, redirects to another origin,
5xx storms (with malformed Retry-After values), stalls, resets, clean cuts, chunked and
close-delimited bodies cut at every tar block boundary, objects rewritten between a cut and
the resumed range. Every case must end within a second with one of:

- ``ok``: the object or shard delivered, byte for byte;
- ``error``: a FetchError naming the URL (and, for a failure inside a stream's body, the byte);
- ``skipped``: under ``on_error="skip"``, a Skipped marker, or a shard's samples counted out.

Never a hang, an exception of another type, a wrong sample, or a secret header sent to the
other origin. Each case states which outcomes it allows.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import pytest

from asyncloader import FetchError
from asyncloader.sources import HTTPSource, Retry, ShardedSource, Skipped
from tests.helpers import make_shard
from tests.servers import Faults, FaultyHTTPServer

TIMEOUT = 0.1
RETRY = Retry(attempts=None, backoff=0.001, max_backoff=0.01, deadline=0.3)
LIMIT = 1 << 20
SECRETS = {"Authorization": "Bearer fuzz-token", "X-Api-Key": "fuzz-key-1", "Cookie": "s=fuzzc"}
BODY = random.Random(0).randbytes(3000)
SHARD = make_shard((f"k{i}", {"txt": f"k{i}".encode(), "bin": bytes([i]) * 700}) for i in range(3))
SHARD_V2 = make_shard(
    (f"k{i}", {"txt": f"k{i}".encode(), "bin": bytes([9]) * 700}) for i in range(3)
)
BOMB = bytes(4 << 20)  # ~4 KiB gzipped
ALWAYS = 200  # a script longer than any retrying: the fault for good


@dataclass
class Case:
    """One URL's script of replies and the outcomes allowed."""

    id: str
    kind: str  # "map" (HTTPSource) or "stream" (ShardedSource)
    script: list[str]
    allowed: frozenset[str]
    body: bytes = b""
    skip: bool = False
    rewrite: bool = False  # the object changes after the first reply
    faults: dict = field(default_factory=dict)


def case(id: str, kind: str, script: list[str], allowed: set[str], **kw) -> Case:
    body = kw.pop("body", BODY if kind == "map" else SHARD)
    return Case(f"{kind}-{id}", kind, list(script), frozenset(allowed), body, **kw)


def cut_offsets(kind: str) -> list[int]:
    """Every tar block boundary (and either side) and a seeded few between; fewer for a map
    body, which has no structure."""
    size = len(BODY if kind == "map" else SHARD)
    rng = random.Random(kind)
    edges = {b + d for b in range(512, size, 512) for d in (-1, 0, 1)}
    offsets = sorted({0, 1, size - 1} | edges | {rng.randrange(size) for _ in range(8)})
    if kind == "map":
        offsets = sorted({0, 1, 511, 512, 513, 1500, size - 1} | set(offsets[::6]))
    return offsets


def cuts(kind: str) -> list[Case]:
    """Resets, clean cuts and cut chunks; close-delimited bodies (a map body's end cannot be
    verified: refused; a tar's can)."""
    offsets = cut_offsets(kind)
    closed = {"error"} if kind == "map" else {"ok"}
    out = [case(f"{how}@{at}", kind, [f"{how}:{at}"], {"ok"})
           for at in offsets for how in ("reset", "truncate")]  # fmt: skip
    for at in offsets[::4]:
        out.append(case(f"chunked-cut@{at}", kind, [f"chunked-cut:{at}", "chunked"], {"ok"}))
        out.append(case(f"close@{at}", kind, [f"close:{at}", "close"] * 3, closed))
    out += [
        case("close-whole", kind, ["close"], closed),
        case("chunked", kind, ["chunked"], {"ok"}),
    ]
    if kind == "stream":  # a map body short but framed so is another object, not a lie
        out.append(case("short", kind, ["short"], {"ok"}))
    return out


def lies(kind: str) -> list[Case]:
    """Lying lengths, gzip (a bomb over max_object_size), trickles, a stall."""
    out = []
    for d in (-1, -100, 1, 1000):
        out.append(case(f"length{d:+d}", kind, [f"length:{d}"], {"ok", "error"}))
        out.append(case(f"length{d:+d}-always", kind, [f"length:{d}"] * ALWAYS, {"ok", "error"}))
    return [
        *out,
        case("gzip", kind, ["gzip"], {"ok"}),
        case("gzip-bomb", kind, ["gzip"] * ALWAYS, {"error"}, body=BOMB),
        case("trickle-once", kind, ["trickle:0.01"], {"ok"}),
        case("trickle-always", kind, ["trickle:0.01"] * ALWAYS, {"error"}),
        case("stall-once", kind, ["stall"], {"ok"}),
    ]


def storms(kind: str) -> list[Case]:
    """5xx and 429 storms, Retry-After values RFC 9110 does not allow, a 404."""
    out = [case(f"503x{n}", kind, ["503"] * n, {"ok"}) for n in (1, 3, 10)]
    for after in ("²", "-1", "1e9", "99999999999", "Wed, 21 Oct 2015 07:28:00 GMT", "soon"):
        out.append(case(f"503-retry-after={after}", kind, [f"503:{after}"] * 3, {"ok"}))
    return [
        *out,
        case("503-always", kind, ["503"] * ALWAYS, {"error"}),
        case("429-always", kind, ["429"] * ALWAYS, {"error"}),
        case("storm-mixed", kind, ["503", "reset:7", "429", "truncate:600", "503"], {"ok"}),
        case("404", kind, ["404"], {"error"}),
    ]


def redirects(kind: str) -> list[Case]:
    """Chains and loops, on the origin and to the other server (OTHER: its URL)."""
    return [
        case("redirect-chain", kind, [f"redirect:/{kind}-redirect-chain"] * 3, {"ok"}),
        case("redirect-loop", kind, [f"redirect:/{kind}-redirect-loop"] * ALWAYS, {"error"}),
        case("redirect-other-origin", kind, ["redirect:OTHER"], {"ok"}),
        case("redirect-other-loop", kind, ["redirect:OTHER"] * ALWAYS, {"error"}),
    ]


def skips(kind: str) -> list[Case]:
    return [
        case("skip-404", kind, ["404"], {"skipped"}, skip=True),
        case("skip-bomb", kind, ["gzip"] * ALWAYS, {"skipped"}, skip=True, body=BOMB),
        case("skip-reset", kind, ["reset:900"], {"ok"}, skip=True),
    ]


def rewrites() -> list[Case]:
    """The shard rewritten (same size) after a cut: refused, however the server shows it."""
    cut = ["truncate:3000"]
    last_modified = {"etag": False, "last_modified": True}
    return [
        case("rewritten-etag", "stream", cut, {"error"}, rewrite=True),
        case("rewritten-no-if-match", "stream", cut, {"error"}, rewrite=True,
             faults={"if_match": False}),
        case("rewritten-last-modified", "stream", cut, {"error"}, rewrite=True,
             faults=last_modified),
        case("unchanged-last-modified", "stream", cut, {"ok"}, faults=last_modified),
    ]  # fmt: skip


def cases() -> list[Case]:
    families = (cuts, lies, storms, redirects, skips)
    return [c for kind in ("map", "stream") for family in families for c in family(kind)] + (
        rewrites()
    )


CASES = cases()


@pytest.fixture(scope="module")
def servers():
    """The server the cases' URLs name, and another origin (another port) for redirects."""
    with FaultyHTTPServer({}) as main, FaultyHTTPServer({}) as other:
        yield main, other


def skip_options(case: Case, most: int) -> dict:
    return {"on_error": "skip", "max_skipped": most} if case.skip else {}


async def run_map(case: Case, url: str) -> str:
    source = HTTPSource([url], timeout=TIMEOUT, retry=RETRY, headers=SECRETS, max_object_size=LIMIT,
                        **skip_options(case, 1))  # fmt: skip
    try:
        got = await source[0]
    finally:
        await source.aclose()
    if isinstance(got, Skipped):
        assert source.skipped == 1 and got.target == url
        return "skipped"
    assert got == case.body, "a wrong body was delivered"
    return "ok"


async def run_stream(case: Case, url: str) -> str:
    source = ShardedSource([url], samples_per_shard=[3], shuffle=False, timeout=TIMEOUT,
                           retry=RETRY, headers=SECRETS, max_object_size=LIMIT,
                           **skip_options(case, 3))  # fmt: skip
    try:
        got = [(s["__key__"], s["bin"]) async for s in source]
    finally:
        await source.aclose()
    if case.skip and source.skipped:
        assert source.skipped == 3 - len(got)
        return "skipped"
    assert got == [(f"k{i}", bytes([i]) * 700) for i in range(3)], "a wrong sample"
    return "ok"


def outcome_of(case: Case, url: str) -> str:
    """What the source made of the case: ``ok``, ``skipped`` or ``error`` (a FetchError
    naming the URL, and the byte for a failure inside a body)."""
    run = run_map if case.kind == "map" else run_stream
    try:
        return asyncio.run(asyncio.wait_for(run(case, url), 5.0))
    except FetchError as exc:
        assert exc.target == url and url in str(exc)
        assert exc.attempts >= 1 and exc.reason
        inside = ("changed", "too slow", "truncated body")
        assert "byte" in exc.cause or not any(word in exc.cause for word in inside), exc.cause
        return "error"


def set_up(case: Case, main: FaultyHTTPServer, other: FaultyHTTPServer) -> str:
    """Scripts both servers for the case's path; its URL."""
    path = case.id
    script = [s.replace("OTHER", other.url(path)) for s in case.script]
    main.set_faults(Faults(script={path: script}, stall=5.0, **case.faults))
    other.set_faults(Faults(script={path: list(script)}, stall=5.0))
    main.objects[path] = other.objects[path] = case.body
    if case.rewrite:
        main.on_request = lambda r: r.path == path and main.objects.update({path: SHARD_V2})
    return main.url(path)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_reply_is_delivered_exactly_or_fails_as_fetch_error(servers, case):
    main, other = servers
    url = set_up(case, main, other)
    began = time.monotonic()
    try:
        outcome = outcome_of(case, url)
    finally:
        main.on_request = None
    elapsed = time.monotonic() - began
    leaked = [r.headers for r in other.requests if r.path == case.id and SECRETS.keys() & r.headers]
    assert not leaked, f"secret headers went to another origin: {leaked}"
    assert outcome in case.allowed, f"{outcome}, expected {sorted(case.allowed)}"
    assert elapsed < 1.0, f"took {elapsed:.2f}s"


def test_the_matrix_reaches_every_outcome_for_both_readers():
    """For each reader and each outcome, some case allows that outcome alone: as every case
    must end in an outcome it allows, each one is reached, whatever runs and in which order."""
    forced = {(case.kind, *case.allowed) for case in CASES if len(case.allowed) == 1}
    readers, outcomes = ("map", "stream"), ("ok", "error", "skipped")
    assert forced == {(kind, outcome) for kind in readers for outcome in outcomes}
