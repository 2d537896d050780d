"""The kiln/1 line protocol: splitting, quoting and the typed views of server lines.

This module does no I/O. It follows docs/PROTOCOL.md ("Line syntax"): a line is a verb
(1..16 letters A-Z), then positional words and ``key=value`` pairs separated by spaces;
values are bare printable-ASCII words or double-quoted strings with the escapes
``\\" \\\\ \\n \\r \\t \\xHH \\uXXXX``, which must be valid UTF-8 after unescaping.

The same splitter reads client and server lines: :func:`split_line` is strict by
default (exactly the server's rules); clients call it with ``strict=False``, which
accepts more than 4 positional words or 288 pairs and decodes a string that is not valid
UTF-8 with replacement characters instead of failing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import KilnAuthError, KilnError

__all__ = [
    "PROTOCOL_VERSION",
    "LineError",
    "Line",
    "Token",
    "Usage",
    "Health",
    "HelloInfo",
    "Result",
    "split_line",
    "quote",
    "unquote",
    "is_bare",
    "format_value",
    "format_float",
    "valid_id",
    "build_hello",
    "build_gen",
    "build_cancel",
    "GEN_KEYS",
    "parse_hello_reply",
    "parse_tok",
    "parse_end",
    "parse_err",
    "parse_health",
    "parse_stats",
    "parse_number",
    "unstuff_body",
    "stuff_body",
]

PROTOCOL_VERSION = "kiln/1"

VERB_MAX = 16
KEY_MAX = 32
ID_MAX = 64
MAX_POS = 4
MAX_MSGS = 256  # messages of a GEN conversation (system= user= assistant=)
MAX_KV = 32 + MAX_MSGS  # 32 pairs, and room for the messages
#: The roles of a conversation's messages, each sent as a key of its own name.
ROLES = ("system", "user", "assistant")


class LineError(ValueError):
    """A line that breaks the protocol's syntax.

    Attributes:
        col: the 1-based byte offset of the problem in the line, or 0 when it concerns
            the whole line.
        problem: the message without the column prefix.
    """

    def __init__(self, problem: str, col: int = 0) -> None:
        self.col = col
        self.problem = problem
        super().__init__("col %d: %s" % (col, problem) if col else problem)


# ---------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Line:
    """A split line: its verb, positional words and key=value pairs, in order.

    Strings are unescaped. ``quoted`` holds, for each positional word and each pair's
    value, whether it was a quoted string (same order: positional words first).
    """

    verb: str
    pos: Tuple[str, ...] = ()
    kv: Tuple[Tuple[str, str], ...] = ()
    pos_quoted: Tuple[bool, ...] = ()
    kv_quoted: Tuple[bool, ...] = ()

    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:
        """The value of the first ``key=``, or ``default``."""
        for k, v in self.kv:
            if k == key:
                return v
        return default

    def get_all(self, key: str) -> List[str]:
        """The values of every ``key=`` (keys may repeat, e.g. ``stop``)."""
        return [v for k, v in self.kv if k == key]

    def as_dict(self) -> Dict[str, str]:
        """The pairs as a dict (the first value of a repeated key wins)."""
        d: Dict[str, str] = {}
        for k, v in self.kv:
            d.setdefault(k, v)
        return d


@dataclass(frozen=True)
class Token:
    """One ``TOK`` line: text that is safe to show, for one sample of a request.

    ``token_id`` and ``logprob`` are set only when the request asked for ``logprobs``.
    One Token may carry the text of several model tokens (see the protocol).
    """

    text: str
    sample: int = 0
    token_id: Optional[int] = None
    logprob: Optional[float] = None


@dataclass(frozen=True)
class Usage:
    """The ``END`` line of a request (or of one of its samples)."""

    reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    e2e_ms: float = 0.0
    sample: int = 0


@dataclass(frozen=True)
class Health:
    """The reply to ``HEALTH``."""

    live: bool
    ready: bool
    level: int
    running: int
    waiting: int
    draining: bool


@dataclass(frozen=True)
class HelloInfo:
    """The server's ``OK kiln/1 ...`` reply to HELLO."""

    model: str
    ctx: int
    session: int
    role: str


@dataclass
class Result:
    """The outcome of a finished generation.

    ``text`` and ``usage`` are those of sample 0; ``texts`` and ``usages`` hold every
    sample (one entry when ``n`` is 1). ``tokens`` lists the TOK lines received, of
    every sample, in order. ``id`` is the request id of the attempt that succeeded.
    """

    text: str
    usage: Usage
    texts: List[str] = field(default_factory=list)
    usages: List[Usage] = field(default_factory=list)
    tokens: List[Token] = field(default_factory=list)
    id: str = ""

    def __str__(self) -> str:
        return self.text


# ---------------------------------------------------------------------------- splitting

_SCAN_KEY = re.compile(rb'[^ "=]*')
_WORD = re.compile(rb"[^ ]*")
_BARE_OK = re.compile(rb"[\x21\x23-\x3c\x3e-\x7e]+\Z")
_KEY_OK = re.compile(rb"[a-z][a-z0-9_]*\Z")
_QUOTED_SPECIAL = re.compile(rb'["\\\x00-\x1f\x7f]')
_HEX = b"0123456789abcdefABCDEF"
_SIMPLE_ESC = {ord('"'): b'"', ord("\\"): b"\\", ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}


def _bad_byte(c: int, col: int, where: str) -> LineError:
    if c < 0x20 or c == 0x7F:
        return LineError("control byte 0x%02x" % c, col)
    if c >= 0x80:
        return LineError("non-ASCII byte 0x%02x outside a quoted string" % c, col)
    return LineError("unexpected '%s' %s" % (chr(c), where), col)


def _hex_at(b: bytes, i: int, ndig: int) -> int:
    if len(b) - i < ndig:
        return -1
    chunk = b[i : i + ndig]
    if any(ch not in _HEX for ch in chunk):
        return -1
    return int(chunk, 16)


def _quoted(b: bytes, i: int, strict: bool) -> Tuple[str, int]:
    """The quoted string whose opening quote is at b[i]: (text, index after it)."""
    n = len(b)
    open_col = i + 1
    i += 1
    out = bytearray()
    while True:
        m = _QUOTED_SPECIAL.search(b, i)
        if m is None:
            raise LineError("unterminated string", open_col)
        at = m.start()
        out += b[i:at]
        c = b[at]
        if c == 0x22:  # closing quote
            i = at + 1
            break
        if c != 0x5C:
            raise LineError("control byte 0x%02x in string (escape it)" % c, at + 1)
        if at + 1 >= n:
            raise LineError("unterminated string", open_col)
        e = b[at + 1]
        simple = _SIMPLE_ESC.get(e)
        if simple is not None:
            out += simple
            i = at + 2
        elif e == ord("x"):
            v = _hex_at(b, at + 2, 2)
            if v < 0:
                raise LineError("bad escape \\x (needs two hex digits)", at + 1)
            if v == 0:
                raise LineError("\\x00 is not allowed (strings cannot hold NUL)", at + 1)
            out.append(v)
            i = at + 4
        elif e == ord("u"):
            v = _hex_at(b, at + 2, 4)
            if v < 0:
                raise LineError("bad escape \\u (needs four hex digits)", at + 1)
            if v == 0:
                raise LineError("\\u0000 is not allowed (strings cannot hold NUL)", at + 1)
            if 0xD800 <= v <= 0xDFFF:
                raise LineError(
                    "\\u%04X is a surrogate (write the character as UTF-8)" % v, at + 1
                )
            out += chr(v).encode("utf-8")
            i = at + 6
        elif 0x20 < e < 0x7F:
            raise LineError("bad escape \\%s" % chr(e), at + 1)
        else:
            raise LineError("bad escape (byte 0x%02x after \\)" % e, at + 1)
    if i < n and b[i] != 0x20:
        raise LineError("expected a space after the closing quote", i + 1)
    try:
        text = bytes(out).decode("utf-8")
    except UnicodeDecodeError as exc:
        if strict:
            raise LineError("invalid UTF-8 in string", open_col) from exc
        text = bytes(out).decode("utf-8", errors="replace")
    return text, i


def _bare(b: bytes, i: int) -> Tuple[str, int]:
    m = _WORD.match(b, i)
    assert m is not None
    word = m.group(0)
    if not _BARE_OK.match(word):
        for k, c in enumerate(word):
            if c == 0x22:
                raise LineError("'\"' inside a bare word (quote the whole value)", i + k + 1)
            if c == 0x3D:
                raise LineError("'=' inside a bare value (quote the value)", i + k + 1)
            if c < 0x21 or c > 0x7E:
                raise _bad_byte(c, i + k + 1, "in word")
    return word.decode("ascii"), m.end()


def _value(b: bytes, i: int, strict: bool) -> Tuple[str, bool, int]:
    if b[i] == 0x22:
        s, j = _quoted(b, i, strict)
        return s, True, j
    s, j = _bare(b, i)
    return s, False, j


def _key(word: bytes, at: int) -> str:
    if not word:
        raise LineError("empty key", at + 1)
    if not _KEY_OK.match(word) or len(word) > KEY_MAX:
        for k, c in enumerate(word):
            if k == KEY_MAX:
                raise LineError("key too long (max %d bytes)" % KEY_MAX, at + k + 1)
            if 0x41 <= c <= 0x5A:
                raise LineError("key must be lower case", at + k + 1)
            if k == 0 and (0x30 <= c <= 0x39 or c == 0x5F):
                raise LineError("key must start with a letter a-z", at + k + 1)
            if not (0x61 <= c <= 0x7A or 0x30 <= c <= 0x39 or c == 0x5F):
                raise _bad_byte(c, at + k + 1, "in key")
    return word.decode("ascii")


def split_line(line: Union[bytes, bytearray, str], *, strict: bool = True) -> Line:
    """Split one protocol line (a trailing ``\\n`` and ``\\r`` are ignored).

    Raises :class:`LineError` (a ``ValueError``) naming the column of the problem.
    ``strict=False`` lifts the limits of 4 positional words and 288 pairs and decodes
    strings that are not valid UTF-8 with U+FFFD instead of failing.
    """
    if isinstance(line, str):
        try:
            b = line.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LineError("not valid Unicode (lone surrogate)") from exc
    else:
        b = bytes(line)
    if b.endswith(b"\n"):
        b = b[:-1]
    if b.endswith(b"\r"):
        b = b[:-1]
    n = len(b)
    i = 0
    while i < n and b[i] == 0x20:
        i += 1
    if i == n:
        raise LineError("empty line")
    m = _WORD.match(b, i)
    assert m is not None
    verb_b = m.group(0)
    for k, c in enumerate(verb_b):
        if 0x61 <= c <= 0x7A:
            raise LineError("verb must be upper case", i + k + 1)
        if not 0x41 <= c <= 0x5A:
            raise _bad_byte(c, i + k + 1, "in verb (letters A-Z only)")
        if k == VERB_MAX:
            raise LineError("verb too long (max %d letters)" % VERB_MAX, i + k + 1)
    i = m.end()
    pos: List[str] = []
    posq: List[bool] = []
    kv: List[Tuple[str, str]] = []
    kvq: List[bool] = []
    while True:
        while i < n and b[i] == 0x20:
            i += 1
        if i == n:
            break
        start = i
        e = _SCAN_KEY.match(b, i)
        assert e is not None
        eq = e.end()
        if eq < n and b[eq] == 0x3D:  # key=value
            if strict and len(kv) == MAX_KV:
                raise LineError("too many key=value pairs (max %d)" % MAX_KV, start + 1)
            key = _key(b[i:eq], i)
            i = eq + 1
            if i == n or b[i] == 0x20:
                raise LineError('empty value (write "" for an empty string)', eq + 1)
            val, q, i = _value(b, i, strict)
            kv.append((key, val))
            kvq.append(q)
        else:
            if strict and len(pos) == MAX_POS:
                raise LineError("too many positional words (max %d)" % MAX_POS, start + 1)
            val, q, i = _value(b, i, strict)
            pos.append(val)
            posq.append(q)
    return Line(verb_b.decode("ascii"), tuple(pos), tuple(kv), tuple(posq), tuple(kvq))


def unquote(word: Union[str, bytes], *, strict: bool = True) -> str:
    """The text of one quoted string word (``'"a\\\\nb"'`` -> ``"a\\nb"``)."""
    b = word.encode("utf-8") if isinstance(word, str) else bytes(word)
    if not b.startswith(b'"'):
        raise LineError("not a quoted string", 1)
    text, end = _quoted(b, 0, strict)
    if end != len(b):
        raise LineError("text after the closing quote", end + 1)
    return text


# ---------------------------------------------------------------------------- writing


def _quote_table() -> Dict[int, str]:
    t: Dict[int, str] = {c: "\\x%02x" % c for c in range(1, 0x20)}
    t[0x7F] = "\\x7f"
    t[ord("\n")] = "\\n"
    t[ord("\r")] = "\\r"
    t[ord("\t")] = "\\t"
    t[ord('"')] = '\\"'
    t[ord("\\")] = "\\\\"
    return t


_QUOTE = _quote_table()


def quote(s: str, *, ascii_only: bool = False) -> str:
    """``s`` as a quoted protocol string.

    Escapes ``"`` ``\\`` LF CR TAB as ``\\" \\\\ \\n \\r \\t`` and other control
    characters and DEL as ``\\xHH``; other text passes as UTF-8. With ``ascii_only``,
    characters up to U+FFFF are written ``\\uXXXX`` and those above as ``\\xHH`` bytes
    of their UTF-8, so the result is pure ASCII.

    Raises ValueError for a NUL character or a lone surrogate (no protocol string can
    hold them).
    """
    if not isinstance(s, str):
        raise TypeError("quote() needs a str, not %s" % type(s).__name__)
    if "\x00" in s:
        raise ValueError("a protocol string cannot hold NUL (U+0000)")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("not valid Unicode (lone surrogate at %d)" % exc.start) from exc
    body = s.translate(_QUOTE)
    if ascii_only and not body.isascii():
        parts: List[str] = []
        for ch in body:
            o = ord(ch)
            if o < 0x80:
                parts.append(ch)
            elif o <= 0xFFFF:
                parts.append("\\u%04x" % o)
            else:
                parts.append("".join("\\x%02x" % x for x in ch.encode("utf-8")))
        body = "".join(parts)
    return '"' + body + '"'


def is_bare(s: str) -> bool:
    """True when ``s`` can be sent as a bare word (printable ASCII, no ``"`` or ``=``)."""
    return bool(s) and s.isascii() and _BARE_OK.match(s.encode("ascii")) is not None


def format_float(x: float) -> str:
    """A float as the protocol writes numbers (finite, decimal, no ``+`` sign in front)."""
    v = float(x)
    if not math.isfinite(v):
        raise ValueError("%r is not a finite number" % (x,))
    if v == 0.0:
        return "0"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def format_value(v: Union[str, int, float, bool]) -> str:
    """A value as a word: booleans ``0``/``1``, numbers bare, strings bare or quoted."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return v if is_bare(v) else quote(v)
    raise TypeError("cannot send a %s as a protocol value" % type(v).__name__)


_ID_OK = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


def valid_id(s: str) -> bool:
    """True for a request id the protocol accepts (1..64 of ``A-Z a-z 0-9 _ . : -``)."""
    return isinstance(s, str) and _ID_OK.match(s) is not None


def build_hello(token: str) -> str:
    """``HELLO kiln/1 token=...`` (without the newline)."""
    return "HELLO %s token=%s" % (PROTOCOL_VERSION, format_value(token))


def build_cancel(request_id: str) -> str:
    """``CANCEL <id>`` (without the newline)."""
    if not valid_id(request_id):
        raise ValueError("not a valid request id: %r" % (request_id,))
    return "CANCEL " + request_id


#: The optional keys of GEN and how their values are written: ``bool``, ``int``,
#: ``float``, ``str`` or ``stops`` (a string or a list of up to 4).
GEN_KEYS: Mapping[str, str] = {
    "chat": "bool",
    "system": "str",
    "max_tokens": "int",
    "temperature": "float",
    "top_p": "float",
    "top_k": "int",
    "min_p": "float",
    "repeat_penalty": "float",
    "repeat_last_n": "int",
    "presence_penalty": "float",
    "frequency_penalty": "float",
    "seed": "int",
    "n": "int",
    "stop": "stops",
    "logprobs": "bool",
    "ignore_eos": "bool",
    "messages": "messages",  # the conversation form (build_gen)
}


def _message_words(messages: object) -> List[str]:
    """``role="content"`` words of a conversation, in order (GEN's conversation form)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...}")
    if not 1 <= len(messages) <= MAX_MSGS:
        raise ValueError("messages must hold 1..%d messages" % MAX_MSGS)
    words = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or set(m) != {"role", "content"}:
            raise TypeError("messages[%d] must be {'role': ..., 'content': ...}" % i)
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ValueError("messages[%d]: role must be one of %s" % (i, ", ".join(ROLES)))
        if not isinstance(content, str):
            raise TypeError("messages[%d]: content must be a str" % i)
        words.append("%s=%s" % (role, quote(content)))
    return words


def build_gen(request_id: str, prompt: Optional[str], params: Mapping[str, object]) -> str:
    """A GEN line (without the newline).

    ``params`` maps GEN keys (see :data:`GEN_KEYS`) to values; ``None`` values are left
    out, so that the server's defaults apply. Values are checked for their type only:
    ranges are the server's to judge (it answers ``400 bad_request``).

    ``params["messages"]``, a list of ``{"role": "system"|"user"|"assistant",
    "content": str}``, sends a conversation instead of a prompt (``prompt`` None, no
    ``system``): one ``role="content"`` key per message in order, with ``chat=1``. The
    order rules (system first, user last) are the server's to judge.
    """
    if not valid_id(request_id):
        raise ValueError("not a valid request id: %r" % (request_id,))
    messages = params.get("messages")
    words = ["GEN", "id=" + request_id]
    if messages is not None:
        if prompt is not None:
            raise ValueError("give a prompt or messages, not both")
        if params.get("system") is not None:
            raise ValueError("with messages, the system message is messages[0]")
        if params.get("chat") is not None and not params.get("chat"):
            raise ValueError("messages need chat (the model's template renders them)")
        words += _message_words(messages)
        if params.get("chat") is None:
            words.append("chat=1")
    elif not isinstance(prompt, str):
        raise TypeError("prompt must be a str, not %s" % type(prompt).__name__)
    else:
        words.append("prompt=" + quote(prompt))
    for key, value in params.items():
        if key == "messages":
            continue
        kind = GEN_KEYS.get(key)
        if kind is None:
            raise TypeError("unknown GEN parameter %r" % key)
        if value is None:
            continue
        if kind == "bool":
            if not isinstance(value, (bool, int)) or value not in (0, 1):
                raise TypeError("%s must be a bool" % key)
            words.append("%s=%d" % (key, int(bool(value))))
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError("%s must be an int" % key)
            words.append("%s=%d" % (key, value))
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError("%s must be a number" % key)
            words.append("%s=%s" % (key, format_float(value)))
        elif kind == "str":
            if not isinstance(value, str):
                raise TypeError("%s must be a str" % key)
            words.append("%s=%s" % (key, quote(value)))
        else:  # stops
            if isinstance(value, str):
                stops: Sequence[object] = [value]
            elif isinstance(value, (list, tuple)):
                stops = list(value)
            else:
                raise TypeError("stop must be a str or a list of str")
            for s in stops:
                if not isinstance(s, str):
                    raise TypeError("stop must be a str or a list of str")
                words.append("stop=" + quote(s))
    return " ".join(words)


# ---------------------------------------------------------------------------- reading


def parse_number(s: str) -> Union[int, float]:
    """A protocol number: an int when it has no fraction or exponent, else a float."""
    try:
        if re.match(r"-?[0-9]+\Z", s):
            return int(s)
        v = float(s)
    except ValueError:
        raise LineError("not a number: %r" % s) from None
    return v


def _int(line: Line, key: str, default: int = 0) -> int:
    v = line.get(key)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise LineError("%s %s=%r is not an integer" % (line.verb, key, v)) from None


def _float(line: Line, key: str, default: float = 0.0) -> float:
    v = line.get(key)
    if v is None:
        return default
    try:
        return float(v)
    except ValueError:
        raise LineError("%s %s=%r is not a number" % (line.verb, key, v)) from None


def _ensure(line: Line, verb: str, npos: int) -> None:
    if line.verb != verb:
        raise LineError("expected %s, got %s" % (verb, line.verb))
    if len(line.pos) < npos:
        raise LineError("%s needs %d positional words" % (verb, npos))


def parse_tok(line: Line) -> Tuple[str, Token]:
    """``TOK <id> "<text>" [sample=i] [token=N logprob=F]`` -> (id, Token)."""
    _ensure(line, "TOK", 2)
    tid = line.get("token")
    lp = line.get("logprob")
    return line.pos[0], Token(
        text=line.pos[1],
        sample=_int(line, "sample"),
        token_id=int(tid) if tid is not None else None,
        logprob=float(lp) if lp is not None else None,
    )


def parse_end(line: Line) -> Tuple[str, Usage]:
    """``END <id> reason=... prompt_tokens=... ...`` -> (id, Usage)."""
    _ensure(line, "END", 1)
    return line.pos[0], Usage(
        reason=line.get("reason") or "",
        prompt_tokens=_int(line, "prompt_tokens"),
        completion_tokens=_int(line, "completion_tokens"),
        cached_tokens=_int(line, "cached_tokens"),
        ttft_ms=_float(line, "ttft_ms"),
        tpot_ms=_float(line, "tpot_ms"),
        e2e_ms=_float(line, "e2e_ms"),
        sample=_int(line, "sample"),
    )


def parse_err(line: Line) -> KilnError:
    """``ERR <id or -> <code> <slug> [key=value...] [msg="..."]`` -> a KilnError
    (a :class:`~kiln.errors.KilnAuthError` for 401). ``request_id`` is None for ``-``."""
    _ensure(line, "ERR", 2)
    try:
        code = int(line.pos[1])
    except ValueError:
        raise LineError("ERR code %r is not a number" % line.pos[1]) from None
    slug = line.pos[2] if len(line.pos) > 2 else ""
    rid: Optional[str] = line.pos[0] if line.pos[0] != "-" else None
    ra = line.get("retry_after_ms")
    retry: Optional[int] = None
    if ra is not None:
        try:
            retry = int(ra)
        except ValueError:
            retry = None
    cls = KilnAuthError if code == 401 else KilnError
    return cls(
        line.get("msg") or slug or "error %d" % code,
        code=code,
        slug=slug or None,
        request_id=rid,
        retry_after_ms=retry,
        fields=line.as_dict(),
    )


def parse_hello_reply(line: Line) -> HelloInfo:
    """``OK kiln/1 model="..." ctx=N session=N role=...`` -> HelloInfo. An ERR line
    raises the server's error (:class:`~kiln.errors.KilnAuthError` for 401)."""
    if line.verb == "ERR":
        raise parse_err(line)
    _ensure(line, "OK", 1)
    if line.pos[0] != PROTOCOL_VERSION:
        raise LineError("the server speaks %s, not %s" % (line.pos[0], PROTOCOL_VERSION))
    return HelloInfo(
        model=line.get("model") or "",
        ctx=_int(line, "ctx"),
        session=_int(line, "session"),
        role=line.get("role") or "",
    )


def parse_health(line: Line) -> Health:
    """``HEALTH live=1 ready=1 level=0 running=N waiting=N draining=0`` -> Health."""
    _ensure(line, "HEALTH", 0)
    return Health(
        live=_int(line, "live") != 0,
        ready=_int(line, "ready") != 0,
        level=_int(line, "level"),
        running=_int(line, "running"),
        waiting=_int(line, "waiting"),
        draining=_int(line, "draining") != 0,
    )


def parse_stats(line: Line) -> Dict[str, Union[int, float]]:
    """``STATS key=number ...`` -> {key: int or float}. Values that are not numbers
    are left out."""
    _ensure(line, "STATS", 0)
    out: Dict[str, Union[int, float]] = {}
    for k, v in line.kv:
        try:
            out[k] = parse_number(v)
        except LineError:
            continue
    return out


def unstuff_body(lines: Iterable[str]) -> str:
    """The text of a multi-line body (METRICS, CONFIG) from its lines, without the
    final ``.`` line: one leading ``.`` is removed from lines that start with one
    (dot-stuffing), and every line ends in ``\\n``."""
    out = [ln[1:] if ln.startswith(".") else ln for ln in lines]
    return "".join(ln + "\n" for ln in out)


def stuff_body(text: str) -> List[str]:
    """The inverse of :func:`unstuff_body`: the lines to send for ``text``, ending with
    the ``.`` line (used by tests and fake servers)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [("." + ln if ln.startswith(".") else ln) for ln in lines] + ["."]
