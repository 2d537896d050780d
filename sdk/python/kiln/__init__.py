"""kiln: a client for kilnd, the kiln inference server (protocol kiln/1 over TLS).

Blocking::

    from kiln import Client
    c = Client("127.0.0.1", 8443, "TOKEN", "ca.crt")
    print(c.generate("What is the capital of France?", temperature=0).text)

asyncio::

    from kiln.aio import AsyncClient   # also kiln.AsyncClient

See :class:`Client` and :class:`kiln.aio.AsyncClient`; the wire format lives in
:mod:`kiln.protocol` (docs/PROTOCOL.md in the kiln repository is the specification).
"""

from .aio import AsyncClient, AsyncStream
from .client import Client, Stream
from .errors import (
    KilnAuthError,
    KilnConnectionError,
    KilnError,
    KilnProtocolError,
    KilnTimeoutError,
    KilnTLSError,
)
from .protocol import Health, HelloInfo, Result, Token, Usage

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Stream",
    "AsyncClient",
    "AsyncStream",
    "Result",
    "Token",
    "Usage",
    "Health",
    "HelloInfo",
    "KilnError",
    "KilnAuthError",
    "KilnConnectionError",
    "KilnTLSError",
    "KilnTimeoutError",
    "KilnProtocolError",
    "__version__",
]
