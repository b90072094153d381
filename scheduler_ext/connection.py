"""Redis connections: scrapy-redis's connection handling, with the settings this extension needs on top.

Reads ``REDIS_URL`` and ``REDIS_PARAMS`` exactly as scrapy-redis does (``rediss://`` URLs and passwords
included). Responses are decoded to ``str``: everything scheduler_ext stores is UTF-8 JSON, never pickle.
"""

from __future__ import annotations

from typing import Any

import redis
from scrapy.settings import BaseSettings, Settings
from scrapy_redis.connection import get_redis_from_settings

from .exceptions import ConfigurationError, ServiceUnavailable

# Short timeouts: the node calls Redis from the reactor thread, so a call must fail fast rather than hang.
# surrogateescape: an entry that is not UTF-8 (a pickle pushed by hand) still reads, as text the decoders refuse
# and that encodes back to the same bytes (scheduler_ext.store explains why).
_PARAMS = {"decode_responses": True, "encoding_errors": "surrogateescape", "socket_timeout": 5,
           "socket_connect_timeout": 5, "health_check_interval": 30}


def redis_from_settings(settings: BaseSettings | dict[str, Any] | None = None) -> redis.Redis:
    """A Redis client built the scrapy-redis way; our decoding and timeouts unless REDIS_PARAMS overrides them."""
    if not isinstance(settings, BaseSettings):
        settings = Settings(settings or {})
    merged = settings.copy()
    merged.frozen = False  # a private copy: the crawler's own settings stay frozen
    params = dict(_PARAMS)
    params.update(settings.getdict("REDIS_PARAMS"))
    merged.set("REDIS_PARAMS", params)
    return get_redis_from_settings(merged)


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
