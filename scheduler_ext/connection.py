"""Redis connections: scrapy-redis's connection handling, with the settings this extension needs on top.

Reads ``REDIS_URL`` and ``REDIS_PARAMS`` exactly as scrapy-redis does (``rediss://`` URLs and passwords
included). Responses are decoded to ``str``: everything scheduler_ext stores is UTF-8 JSON, never pickle.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.connection import parse_url
from scrapy.settings import BaseSettings, Settings
from scrapy_redis.connection import get_redis_from_settings

from .exceptions import ConfigurationError, ServiceUnavailable, shortened

# Short timeouts: the node calls Redis from the reactor thread, so a call must fail fast rather than hang.
# surrogateescape: an entry that is not UTF-8 (a pickle pushed by hand) still reads, as text the decoders refuse
# and that encodes back to the same bytes (scheduler_ext.store explains why).
_PARAMS = {"decode_responses": True, "encoding_errors": "surrogateescape", "socket_timeout": 5,
           "socket_connect_timeout": 5, "health_check_interval": 30}


_URL_FORM = "redis://HOST:PORT/DB (or rediss://HOST:PORT/DB, unix:///PATH)"


def redis_from_settings(settings: BaseSettings | dict[str, Any] | None = None) -> redis.Redis:
    """A Redis client built the scrapy-redis way; our decoding and timeouts unless REDIS_PARAMS overrides them.

    Raises ConfigurationError naming the setting if ``REDIS_URL`` is malformed or ``REDIS_PARAMS`` is not a dict.
    """
    if not isinstance(settings, BaseSettings):
        settings = Settings(settings or {})
    url = settings.get("REDIS_URL")
    if url:  # scrapy-redis ignores an empty one, and so falls back to its REDIS_HOST / REDIS_PORT defaults
        check_redis_url(url)
    merged = settings.copy()
    merged.frozen = False  # a private copy: the crawler's own settings stay frozen
    params = dict(_PARAMS)
    try:
        params.update(settings.getdict("REDIS_PARAMS"))
    # Not JSON, JSON of another shape, or nested past the parser's recursion limit.
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigurationError(f"REDIS_PARAMS: expected a dict (JSON object) of redis-py client options, "
                                 f"got {shortened(settings.get('REDIS_PARAMS'))}") from exc
    merged.set("REDIS_PARAMS", params)
    return get_redis_from_settings(merged)


def check_redis_url(url: Any, name: str = "REDIS_URL") -> None:
    """Raise ConfigurationError naming the setting ``name`` unless ``url`` is a Redis URL redis-py can use.

    The message shows the URL with its password masked.

    >>> check_redis_url("redis://:s3cret@127.0.0.1:6379/0")
    >>> try:
    ...     check_redis_url("redis://:s3cret@h:99999999/0")
    ... except ConfigurationError as exc:
    ...     print(str(exc).split(", got ")[1])
    'redis://:***@h:99999999/0' (Port out of range 0-65535)
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"{name}: expected a string {_URL_FORM}, got {shortened(url)}")
    if not url.lower().startswith(("redis://", "rediss://", "unix://")):
        raise ConfigurationError(f"{name}: expected {_URL_FORM}, got {shortened(mask_url(url))}")
    try:
        parse_url(url)
        parts = urlsplit(url)
    except ValueError as exc:  # a port that is not a number or out of range, a bad query value, a bad IPv6 host
        raise ConfigurationError(f"{name}: expected {_URL_FORM}, got {shortened(mask_url(url))} ({exc})") from exc
    if parts.scheme.lower() == "unix":
        problem = "" if parts.path else "no socket path"
    else:  # redis-py would silently use database 0 for a path that is not a number ('²' too, which isdigit takes)
        db = parts.path.strip("/")
        problem = "" if not db or (db.isascii() and db.isdigit()) else f"database {db!r} is not a number"
    if problem:
        raise ConfigurationError(f"{name}: expected {_URL_FORM}, got {shortened(mask_url(url))} ({problem})")


def mask_url(url: str) -> str:
    """``url`` with its password (everything between ``user:`` and the last ``@``) replaced by ``***``, for output
    and logs.

    >>> mask_url("mongodb://pc:s3cret@m1.example,m2.example/?replicaSet=rs0")
    'mongodb://pc:***@m1.example,m2.example/?replicaSet=rs0'
    >>> mask_url("redis://:s3c@ret@127.0.0.1:6379/0"), mask_url("redis://127.0.0.1:6379/0")
    ('redis://:***@127.0.0.1:6379/0', 'redis://127.0.0.1:6379/0')
    """
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@]*):.*@", r"\1:***@", url, flags=re.IGNORECASE)



def describe(client: redis.Redis) -> str:
    """The URL-like address of a client, without its password, for messages."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


def ensure_reachable(client: redis.Redis) -> None:
    """Raise ServiceUnavailable, naming the server, if Redis does not answer a PING."""
    try:
        client.ping()
    except redis.RedisError as exc:  # connection refused, timeout, auth failure: all mean "cannot use it"
        raise ServiceUnavailable(f"Redis at {describe(client)} does not answer: {exc}") from exc


# What Redis answers when it refuses who we are (no password, wrong password, an ACL user without the rights).
_REFUSED = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid username-password", "Authentication required")


def check_credentials(settings: BaseSettings | dict[str, Any] | None = None) -> None:
    """Raise ConfigurationError, naming the server, if Redis refuses this process's credentials.

    A process that starts with the wrong password would otherwise run on, retrying every loop with backoff as if
    Redis were down. A Redis that does not answer at all is not an error here: the loops wait for it.
    """
    client = redis_from_settings(settings)
    try:
        client.ping()
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
        raise ConfigurationError(f"Redis at {describe(client)} refused the credentials: {exc} "
                                 "(set the password or ACL user in REDIS_URL or REDIS_PARAMS)") from exc
    except redis.ResponseError as exc:  # NOAUTH and friends arrive as plain error replies on some versions
        if any(word in str(exc) for word in _REFUSED):
            raise ConfigurationError(f"Redis at {describe(client)} refused the credentials: {exc} "
                                     "(set the password or ACL user in REDIS_URL or REDIS_PARAMS)") from exc
        raise
    except redis.ConnectionError:  # not reachable now: the node's and the control's loops wait for it
        pass
    finally:
        client.close()
