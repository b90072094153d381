"""Who may act on the dashboard: nobody unless credentials are configured, and never with weak ones.

Settings (or the environment variables of the same name): ``PC_DASHBOARD_TOKEN`` (an operator token, sent by the
page as ``Authorization: Bearer <token>``), ``PC_DASHBOARD_USER`` and ``PC_DASHBOARD_PASSWORD`` (HTTP basic
authentication). Without any of them the dashboard is read-only. Reading never needs credentials; every action
(a POST) needs valid ones and the page's CSRF token (docs/dashboard.md).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

MIN_SECRET = 12  # characters of a token or password, at least
# Defaults that scanners try first; refused whatever their length.
WEAK = {"admin", "password", "root", "changeme", "secret", "123456", "12345678", "123456789012", "dashboard",
        "scrapyd", "operator", "administrator", "passwordpassword"}


class CredentialsError(ValueError):
    """Raised if the configured credentials are incomplete or weak; the message names the setting."""


class Refused(Exception):
    """Raised if a request carries credentials that do not match (answered 401)."""


def _configured(settings: Any, name: str) -> str | None:
    value = settings.get(name) if settings is not None else None
    return str(value) if value else (os.environ.get(name) or None)


def _check_secret(name: str, value: str, user: str | None = None) -> None:
    if len(value) < MIN_SECRET or value.lower() in WEAK or (user is not None and value.lower() == user.lower()):
        raise CredentialsError(f"{name}: expected at least {MIN_SECRET} characters, not a default like "
                               "admin/admin and not the user name (try: python -c 'import secrets; "
                               "print(secrets.token_urlsafe(24))')")


@dataclass(frozen=True)
class Auth:
    token: str | None = None
    user: str | None = None
    password: str | None = None
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @classmethod
    def from_settings(cls, settings: Any) -> Auth:
        token = _configured(settings, "PC_DASHBOARD_TOKEN")
        user = _configured(settings, "PC_DASHBOARD_USER")
        password = _configured(settings, "PC_DASHBOARD_PASSWORD")
        if bool(user) != bool(password):
            raise CredentialsError("PC_DASHBOARD_USER and PC_DASHBOARD_PASSWORD: expected both or neither")
        if token:
            _check_secret("PC_DASHBOARD_TOKEN", token)
        if user and password:
            if user.lower() in WEAK and password.lower() in WEAK:
                raise CredentialsError("PC_DASHBOARD_USER / PC_DASHBOARD_PASSWORD: default credentials such as "
                                      "admin/admin are refused")
            _check_secret("PC_DASHBOARD_PASSWORD", password, user)
        return cls(token, user, password)

    @property
    def actions_enabled(self) -> bool:
        return bool(self.token or self.user)

    @property
    def methods(self) -> list[str]:
        return [m for m, on in (("token", self.token), ("basic", self.user)) if on]

    def principal(self, authorization: bytes | None) -> str | None:
        """The operator a request's ``Authorization`` header names (None without one); raises :class:`Refused` for
        credentials that do not match, or a scheme that is not configured."""
        if not authorization:
            return None
        scheme, _, value = authorization.decode("latin-1").partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.token:
            if hmac.compare_digest(value.encode(), self.token.encode()):
                return "token"
        elif scheme.lower() == "basic" and self.user and self.password:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise Refused("malformed basic credentials") from None
            if hmac.compare_digest(user.encode(), self.user.encode()) and \
                    hmac.compare_digest(password.encode(), self.password.encode()):
                return user
        raise Refused("credentials refused")

    def csrf_ok(self, header: bytes | None) -> bool:
        return header is not None and hmac.compare_digest(header, self.csrf.encode())
