"""Exceptions raised by the kiln client.

Every error the client raises is a :class:`KilnError`. Errors the server sent (``ERR``
lines) carry the protocol's ``code`` and ``slug``; errors of the connection itself
(unreachable, lost, TLS) have ``code`` ``None`` and a more specific class.
"""

from __future__ import annotations

from typing import Dict, Optional

__all__ = [
    "KilnError",
    "KilnAuthError",
    "KilnConnectionError",
    "KilnTLSError",
    "KilnTimeoutError",
    "KilnProtocolError",
]


class KilnError(Exception):
    """An error from the server (an ``ERR`` line) or from the client.

    Attributes:
        code: the protocol's error code (400, 401, 503, ...), or ``None`` for errors
            that did not come from an ``ERR`` line.
        slug: the error's name (``"overloaded"``, ``"bad_request"`` ...) or ``None``.
        msg: the human text (the ``msg`` of the ``ERR`` line, or the client's).
        request_id: the request the error belongs to, or ``None``.
        retry_after_ms: for ``503 overloaded``, how long the server asks to wait.
        fields: every key=value of the ``ERR`` line, as sent.
    """

    def __init__(
        self,
        msg: str,
        *,
        code: Optional[int] = None,
        slug: Optional[str] = None,
        request_id: Optional[str] = None,
        retry_after_ms: Optional[int] = None,
        fields: Optional[Dict[str, str]] = None,
    ) -> None:
        self.code = code
        self.slug = slug
        self.msg = msg
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms
        self.fields: Dict[str, str] = dict(fields or {})
        super().__init__(msg)

    def __str__(self) -> str:
        parts = []
        if self.code is not None:
            parts.append(str(self.code))
        if self.slug:
            parts.append(self.slug)
        head = " ".join(parts)
        if self.request_id:
            head = (head + " " if head else "") + "(request %s)" % self.request_id
        if self.retry_after_ms is not None:
            head += " retry_after_ms=%d" % self.retry_after_ms
        if head and self.msg:
            return "%s: %s" % (head, self.msg)
        return head or self.msg

    def __repr__(self) -> str:
        return "%s(code=%r, slug=%r, msg=%r, request_id=%r)" % (
            type(self).__name__,
            self.code,
            self.slug,
            self.msg,
            self.request_id,
        )

    def copy(self) -> "KilnError":
        """A new exception of the same class with the same attributes."""
        e = self.__class__.__new__(self.__class__)
        KilnError.__init__(
            e,
            self.msg,
            code=self.code,
            slug=self.slug,
            request_id=self.request_id,
            retry_after_ms=self.retry_after_ms,
            fields=self.fields,
        )
        return e


class KilnAuthError(KilnError):
    """The server refused the HELLO (``ERR - 401 unauthorized``): a wrong token."""


class KilnConnectionError(KilnError):
    """The server could not be reached, or the connection was lost."""


class KilnTLSError(KilnConnectionError):
    """The TLS handshake failed (wrong CA, host name mismatch, client certificate
    refused ...). The message holds the ssl module's reason."""


class KilnTimeoutError(KilnError):
    """The server sent nothing for a request within the client's ``timeout``."""


class KilnProtocolError(KilnError):
    """The server sent something that is not the kiln protocol (a malformed or overlong
    line). The connection is closed when this happens."""
