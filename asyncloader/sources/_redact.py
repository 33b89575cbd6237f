"""Keeps credentials out of reprs, logs and error messages.

Two rules, applied to any text before it is shown:

- by shape: every URL in the text loses its user-info (user and password) and fragment, and
  each of its query values is shown as ``***``, whatever the encoding;
- by value: the secrets a source was given (a query value or user-info of its URLs, a
  credential header, a storage option) are hidden wherever they occur, in every encoding
  they can take: raw or decoded, percent-encoded with any set of safe characters, with
  upper- or lower-case hex, form-encoded (a space as ``+``), double-encoded; with their parts
  (``AccountKey=`` of a connection string, ``sig=`` of a SAS token, the credential after
  ``Bearer``), the runs of 8 or more letters and digits of a base64-looking secret, and the
  Basic authorization a URL's user-info becomes.

A :class:`Redactor` applies both. Each one is registered with
:func:`asyncloader._base.redaction.register_redactor`, so the loader passes every failure's
text through it too (the last line of defence); :func:`redact_exception` scrubs an
exception and its chain.
"""

from __future__ import annotations

import base64
import functools
import logging
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

from asyncloader._base import (
    RedactingFilter,
    redact_exception,
    redact_text,
    register_redactor,
)

__all__ = [
    "Redactor",
    "header_secrets",
    "hide_urls",
    "looks_secret",
    "option_secrets",
    "redact_exception",
    "redact_text",
    "redact_url",
    "url_secrets",
]

_HIDDEN = "***"
_MIN_SECRET = 4  # shorter values would scrub ordinary words out of messages
_MIN_PIECE = 8  # runs of letters and digits of a base64-looking secret, hidden alone
_SECRET_WORDS = (
    "key",
    "secret",
    "token",
    "password",
    "passwd",
    "pwd",
    "auth",
    "credential",
    "sig",
    "cookie",
    "connection_string",
)
# A URL in running text; it ends before trailing punctuation (``url.`` or ``'url':``).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>\\`]*[^\s'\"<>\\`.,:;!?)\]}]")
_BASE64ISH = re.compile(r"[A-Za-z0-9+/_\-]+=*")
# Never percent-encoded by any common encoder (``~`` is, by some: Java's URLEncoder).
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._")
_ANCHOR = re.compile(r"[A-Za-z0-9\-._]+")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_PIECE = re.compile(rf"[A-Za-z0-9]{{{_MIN_PIECE},}}")
_ITEMS = re.compile(r"[\s;&,]+")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9\-]*")

# The library's loggers show each record through the live redactors.
logging.getLogger("asyncloader.sources").addFilter(RedactingFilter())


def _hide_query(query: str) -> str:
    items = (item.partition("=") for item in query.split("&") if item)
    return "&".join(f"{name}={_HIDDEN}" if eq else _HIDDEN for name, eq, _ in items)


def redact_url(url: str) -> str:
    """``url`` without its user-info (user and password shown as ``***``) and fragment, each
    query value shown as ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{_HIDDEN}:{_HIDDEN}@{host}" if ":" in user else f"{_HIDDEN}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, _hide_query(parts.query), ""))


def _hide_url(match: re.Match[str]) -> str:
    url = match[0]
    try:
        parts = urlsplit(url)
    except ValueError:
        return _HIDDEN
    if "@" in parts.netloc or parts.query or parts.fragment:
        return redact_url(url)
    return url  # nothing to hide: left exactly as it was


def hide_urls(text: str) -> str:
    """``text`` with every URL in it as :func:`redact_url` shows it."""
    return _URL.sub(_hide_url, text) if "://" in text else text


def url_secrets(url: str) -> list[str]:
    """The secret parts of ``url``: its query values, fragment, user-info (user, password and
    the Basic authorization made of them), as written in ``url``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [value if eq else name for name, eq, value in _pairs(parts.query, "&")]
    if parts.fragment:
        found += [parts.fragment, *(value for _, _, value in _pairs(parts.fragment, "&"))]
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        found += [user, password]
        for pair in {f"{user}:{password}", f"{unquote(user)}:{unquote(password)}"}:
            found.append(base64.b64encode(pair.encode()).decode())
    return [s for s in found if s]


def _pairs(text: str, sep: str) -> list[tuple[str, str, str]]:
    return [item.strip().partition("=") for item in text.split(sep) if item.strip()]


def looks_secret(name: str) -> bool:
    """Whether an option or header called ``name`` holds a credential."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def header_secrets(headers: Mapping[str, str]) -> list[str]:
    """The values of credential headers (Authorization, Cookie, X-Api-Key...), each cookie's
    value, and the secret parts of URLs in other headers."""
    found: list[str] = []
    for name, value in headers.items():
        if looks_secret(name):
            found.append(value)
            if "cookie" in name.lower():
                found += [v for _, eq, v in _pairs(value, ";") if eq]
        elif "://" in value:
            found += url_secrets(value)
    return found


def option_secrets(options: Mapping[str, Any], hidden: bool = False) -> list[str]:
    """String values, at any depth, of ``options`` whose names (or an enclosing mapping's)
    look secret (``key``, ``secret``, ``token``, ``client_kwargs``' ``aws_session_token``,
    ``connection_string``, ``sas_token``, ``account_key``, ``cookies``...), and the secret
    parts of URLs among the others."""
    found: list[str] = []
    for name, value in options.items():
        found += _option_values(value, hidden or looks_secret(str(name)))
    return found


def _option_values(value: Any, hidden: bool) -> list[str]:
    if isinstance(value, Mapping):
        return option_secrets(value, hidden)
    if isinstance(value, list | tuple | set | frozenset):
        return [s for item in value for s in _option_values(item, hidden)]
    if isinstance(value, bytes) and hidden:
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return []
    urls = url_secrets(value) if "://" in value else []
    return [value, *urls] if hidden else urls


def _items(secret: str) -> set[str]:
    """The parts of a ``secret`` made of several (``Bearer <token>``, ``k=v;k=v``, ``k=v&k=v``):
    each part but an authorization scheme, and the values of the parts named like secrets."""
    items = [item for item in _ITEMS.split(secret) if item]
    if len(items) < 2:
        return set()
    if _SCHEME.fullmatch(items[0]):
        items = items[1:]  # an authorization scheme (Bearer, Basic): not itself secret
    found = set(items)
    for name, eq, value in (item.partition("=") for item in items):
        if eq and looks_secret(name):
            found |= {value, unquote(value), unquote_plus(value)}
    return found


def _parts(secret: str) -> set[str]:
    """``secret`` and its parts that may be shown alone, each decoded and re-encoded."""
    found: set[str] = set()
    for value in {secret, *_items(secret)}:
        found |= {value, unquote(value), unquote_plus(value), quote(value, safe="")}
    for value in list(found):
        if _BASE64ISH.fullmatch(value):
            found.update(p for p in _PIECE.findall(value) if _looks_random(p))
    return {s for s in found if len(s) >= _MIN_SECRET}


def _looks_random(piece: str) -> bool:
    """Mixes letters and digits, or both cases: not a word (``asyncloader`` of a key named
    ``asyncloader-test`` would scrub the library's own notes)."""
    kinds = (str.isdigit, str.islower, str.isupper)
    return sum(any(kind(c) for c in piece) for kind in kinds) >= 2


@functools.lru_cache(maxsize=4096)
def _char_pattern(char: str) -> str:
    """``char`` or its percent-encoding (either case of hex; a space also as ``+``)."""
    if char in _UNRESERVED:
        return re.escape(char)
    encoded = "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    hexed = "".join(f"[{c}{c.lower()}]" if c.isalpha() else re.escape(c) for c in encoded)
    plus = r"|\+" if char == " " else ""
    return f"(?:{re.escape(char)}|{hexed}{plus})"


def _escape_pattern(escape: str) -> str:
    """A ``%HH`` already in a secret: either case of hex, or itself percent-encoded."""
    return "(?:%|%25)" + "".join(f"[{c.upper()}{c.lower()}]" for c in escape[1:])


@functools.lru_cache(maxsize=1024)
def _matcher(secret: str) -> tuple[str, re.Pattern[str]]:
    """The longest run of ``secret``'s unreserved characters (in every encoding of it, so a
    text without it cannot show it), and the pattern matching ``secret`` in every
    percent-encoding: any set of safe characters, either case of hex."""
    anchor = max(_ANCHOR.findall(_ESCAPE.sub(" ", secret)), key=len, default="")
    parts, start = [], 0
    for escape in _ESCAPE.finditer(secret):
        parts += [_char_pattern(c) for c in secret[start : escape.start()]]
        parts.append(_escape_pattern(escape[0]))
        start = escape.end()
    parts += [_char_pattern(c) for c in secret[start:]]
    return anchor, re.compile("".join(parts))


class Redactor:
    """Hides known secret values, in every encoding, and the credentials of any URL.

    Args:
        secrets: Values never to show; those shorter than 4 characters are ignored (the
            credentials of URLs are hidden whatever their length).
    """

    def __init__(self, secrets: Iterable[str] = (), parent: Redactor | None = None) -> None:
        found: set[str] = set()
        for secret in secrets:
            if isinstance(secret, str) and len(secret) >= _MIN_SECRET:
                found |= _parts(secret)
        self._secrets = sorted(found, key=len, reverse=True)
        self._parent = parent
        register_redactor(self)

    def extended(self, secrets: Iterable[str]) -> Redactor:
        """A new Redactor hiding these values too (per URL, so none holds every URL's)."""
        extra = [s for s in secrets if len(s) >= _MIN_SECRET]
        return Redactor(extra, parent=self) if extra else self

    def holds_secret(self, text: str) -> bool:
        """Whether ``text`` shows a secret value or a URL's credentials."""
        return self(text) != text

    def _hide_values(self, text: str) -> str:
        if self._parent is not None:
            text = self._parent._hide_values(text)
        for secret in self._secrets:  # the longest first
            anchor, pattern = _matcher(secret)
            if anchor in text:
                text = pattern.sub(_HIDDEN, text)
        return text

    def __call__(self, text: str) -> str:
        return hide_urls(self._hide_values(text))

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        register_redactor(self)  # in the process it arrives in, as in the one it left

    def __repr__(self) -> str:
        return f"Redactor(<{len(self._secrets)} secrets>)"
