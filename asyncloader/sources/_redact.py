"""Keeps credentials out of reprs, logs and error messages.

A URL is shown without its password and with every query value replaced by ``***`` (presigned
URLs carry their signature and credential there). Secret values a source was given (a
password in a URL, a query value, a storage option such as ``secret``, a header such as
``Authorization``) are collected in a :class:`Redactor` that scrubs any text before it is
shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

_HIDDEN = "***"
_MIN_SECRET = 4  # shorter values would scrub ordinary words out of messages
_SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "auth", "credential", "sig")


def redact_url(url: str) -> str:
    """``url`` without userinfo password and with query values hidden."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, has_password, _ = user.partition(":")
        netloc = f"{name}:{_HIDDEN}@{host}" if has_password else f"{name}@{host}"
    query = "&".join(f"{k}={_HIDDEN}" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def url_secrets(url: str) -> list[str]:
    """The secret parts of ``url``: its password and its query values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [v for _, v in parse_qsl(parts.query, keep_blank_values=True)]
    if parts.password:
        found.append(parts.password)
    return found


def looks_secret(name: str) -> bool:
    """Whether an option or header called ``name`` holds a credential."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def option_secrets(options: Mapping[str, Any]) -> list[str]:
    """String values, at any depth, of ``options`` whose names look secret."""
    found: list[str] = []
    for name, value in options.items():
        if isinstance(value, Mapping):
            found += option_secrets(value)
        elif isinstance(value, str) and looks_secret(str(name)):
            found.append(value)
        elif isinstance(value, str) and "://" in value:
            found += url_secrets(value)
    return found


class Redactor:
    """Replaces known secret values in text with ``***``.

    Args:
        secrets: Values never to show; those shorter than 4 characters are ignored.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)

    def extended(self, secrets: Iterable[str]) -> Redactor:
        """A new Redactor hiding these values too (per URL, so none holds every URL's)."""
        extra = [s for s in secrets if len(s) >= _MIN_SECRET]
        if not extra:
            return self
        return Redactor([*self._secrets, *extra])

    def holds_secret(self, text: str) -> bool:
        """Whether ``text`` contains a secret value."""
        return any(secret in text for secret in self._secrets)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _HIDDEN)
        return text

    def __repr__(self) -> str:
        return f"Redactor(<{len(self._secrets)} secrets>)"
