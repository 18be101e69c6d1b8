"""The peer wire format: versioned JSON frames, validated strictly at the boundary.

Every frame is one JSON object ``{"v": 1, "type": ..., <fields>}`` in a
websocket text message. :func:`parse` accepts exactly the fields its type
declares (all of them, nothing more), each checked for type and bounds; a
frame over :data:`MAX_FRAME_BYTES`, bad UTF-8, duplicate keys, ``NaN``, an
unknown type or version all raise :class:`FrameError` before anything
reads the frame's meaning. Pure: no sockets.

Data frames: ``deliver``, ``ack``, ``read``, ``stop``, ``result``, ``error``.
Control frames: ``challenge``, ``hello``, ``welcome`` (the handshake),
``pair``, ``paired`` (pairing), ``ping``, ``pong``, and ``refused``, the server's
signed refusal that ends a handshake or a live link, preceded in a handshake by
``committed`` when the link's upgrade named the rows it carries (:data:`IN_FLIGHT_HEADER`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .errors import FrameError
from .grants import SIGNED_REFUSALS

VERSION = 1
MAX_FRAME_BYTES = 64 * 1024
"""Largest frame accepted or sent, in UTF-8 bytes."""

TEXT_LIMIT = 20_000
"""Longest message text in a ``deliver`` frame (the ``agent_send`` limit)."""


def is_blank(text: str) -> bool:
    """Is ``text`` no message at all: empty, or nothing but whitespace?

    A peer's ``deliver`` of such a text is rejected, as a local send (``agent_send``,
    ``rt.post``) is refused by ``actors.validation.require_message``: one rule, kept in
    step by a test (the pure modules of two layers cannot share one function)."""
    return not text.strip()

ERROR_CODES = ("bad_frame", "rate_limited", "rejected", "forbidden", "unavailable", "internal")
"""``error`` codes; ``rejected`` is terminal for the message it names. A ``forbidden``
error that ends a handshake carries the :class:`~.grants.Refusal` code as its message;
a sender retries it, since nothing proves who sent it (``refused`` does)."""

REFUSED_REASONS = tuple(sorted(r.value for r in SIGNED_REFUSALS))
"""The refusals a server signs: what the grant says of the token."""

Check = Callable[[Any], bool]


def _pattern(regex: str) -> Check:
    compiled = re.compile(regex)
    return lambda v: isinstance(v, str) and compiled.fullmatch(v) is not None


def _storable(v: str) -> bool:
    # Lone surrogates cannot be stored as UTF-8 and PostgreSQL text refuses NUL.
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in v


def _text(lo: int, hi: int) -> Check:
    return lambda v: isinstance(v, str) and lo <= len(v) <= hi and _storable(v)


DEVICE_NAME_LIMIT = 128
"""Characters in a device's name (the ``pair`` frame's, and its column)."""


def is_device_name(value: object) -> bool:
    """A name shown to people: at most :data:`DEVICE_NAME_LIMIT` printable characters, no
    escape sequences, line breaks or direction overrides that would rewrite a terminal."""
    return isinstance(value, str) and value.isprintable() and _text(0, DEVICE_NAME_LIMIT)(value)


def _nullable(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _one_of(*values: str) -> Check:
    return lambda v: isinstance(v, str) and v in values


MESSAGE_ID = _pattern(r"[A-Za-z0-9_.:-]{1,200}")
REQ = _pattern(r"[A-Za-z0-9_-]{1,64}")
DEVICE_ID = _pattern(r"[0-9a-f]{12}")
NONCE = _pattern(r"[A-Za-z0-9_-]{22,86}")
PUBLIC_KEY = _pattern(r"[A-Za-z0-9_-]{43}")
SIGNATURE = _pattern(r"[A-Za-z0-9_-]{86}")
TOKEN = _pattern(r"kbt_[A-Za-z0-9_-]{43}")

IN_FLIGHT_LIMIT = 64
"""Message ids a link's upgrade names at most (a sender's window)."""
IN_FLIGHT_BYTES = 4096
"""Longest :data:`IN_FLIGHT_HEADER` value: well inside a server's header line limit."""
IN_FLIGHT_HEADER = "Kinbox-In-Flight"
"""The upgrade request's header naming, space-separated, the ids of the rows the sender
carries on this link (rows it may have sent before and heard no ack of). A server that
refuses the handshake then says, signed, which of them it has committed (``committed``):
the sender acknowledges those, and fails only the rest. A server of an earlier version
ignores the header, and a sender that sends none never gets a ``committed`` frame."""


def _message_ids(values: object) -> bool:
    return (isinstance(values, list) and len(values) <= IN_FLIGHT_LIMIT
            and all(MESSAGE_ID(v) for v in values) and len(set(values)) == len(values))


def in_flight_header(ids: list[str]) -> tuple[str, ...]:
    """The ids, from the first, that :data:`IN_FLIGHT_HEADER` names: as many as fit its
    bounds (a row left out is failed by a refusal, as before there was a header)."""
    named: list[str] = []
    size = -1
    for mid in ids[:IN_FLIGHT_LIMIT]:
        size += len(mid) + 1
        if size > IN_FLIGHT_BYTES:
            break
        named.append(mid)
    return tuple(named)


def parse_in_flight(value: str) -> tuple[str, ...]:
    """The ids an :data:`IN_FLIGHT_HEADER` names; :class:`FrameError` for anything off
    its format (over its bounds, a bad or repeated id)."""
    ids = value.split(" ") if value else []
    if len(value) > IN_FLIGHT_BYTES or not _message_ids(ids):
        raise FrameError("bad_header", IN_FLIGHT_HEADER)
    return tuple(ids)


@dataclass(frozen=True)
class Frame:
    """Base of every frame; ``TYPE`` is its wire name, ``CHECKS`` its fields' rules."""

    TYPE: ClassVar[str] = ""
    CHECKS: ClassVar[dict[str, Check]] = {}


@dataclass(frozen=True)
class Deliver(Frame):
    """A message for the receiver's ``suzent:<device>`` session (or a named one)."""

    TYPE = "deliver"
    CHECKS = {"id": MESSAGE_ID, "text": _text(1, TEXT_LIMIT),
              "session": _nullable(_text(1, 200))}
    id: str
    text: str
    session: str | None = None


@dataclass(frozen=True)
class Ack(Frame):
    """The receiver committed message ``id`` (a repeat gets the same ack)."""

    TYPE = "ack"
    CHECKS = {"id": MESSAGE_ID}
    id: str


@dataclass(frozen=True)
class Read(Frame):
    """Ask for the dedicated session's visible transcript."""

    TYPE = "read"
    CHECKS = {"req": REQ}
    req: str


@dataclass(frozen=True)
class Stop(Frame):
    """Ask the dedicated session's running turn to stop."""

    TYPE = "stop"
    CHECKS = {"req": REQ}
    req: str


@dataclass(frozen=True)
class Result(Frame):
    """The answer to ``read`` or ``stop`` number ``req``."""

    TYPE = "result"
    CHECKS = {"req": REQ, "status": _text(1, 32), "text": _text(0, 40_000)}
    req: str
    status: str
    text: str


@dataclass(frozen=True)
class Error(Frame):
    """Something was refused; ``id`` names the message when there is one."""

    TYPE = "error"
    CHECKS = {"id": _nullable(MESSAGE_ID), "code": _one_of(*ERROR_CODES),
              "message": _text(0, 1000)}
    id: str | None
    code: str
    message: str


@dataclass(frozen=True)
class Challenge(Frame):
    """Server's first frame: who it is and a fresh nonce to sign."""

    TYPE = "challenge"
    CHECKS = {"device_id": DEVICE_ID, "nonce": NONCE}
    device_id: str
    nonce: str


@dataclass(frozen=True)
class Hello(Frame):
    """Client's proof: its device id, its own nonce and its signature over both nonces."""

    TYPE = "hello"
    CHECKS = {"device_id": DEVICE_ID, "nonce": NONCE, "signature": SIGNATURE}
    device_id: str
    nonce: str
    signature: str


@dataclass(frozen=True)
class Welcome(Frame):
    """Server's proof, checked against the key the client pinned at pairing."""

    TYPE = "welcome"
    CHECKS = {"signature": SIGNATURE}
    signature: str


@dataclass(frozen=True)
class Pair(Frame):
    """Client redeems a pairing code and presents its public key. The code itself is not
    in it (see :mod:`.invite_code`): ``invite_key`` is the public key its secret seeds,
    ``invite_signature`` that key's signature over the transcript ``signature`` covers
    (the device key's), so whoever reads the frame learns nothing that pairs."""

    TYPE = "pair"
    CHECKS = {"invite_key": PUBLIC_KEY, "device_id": DEVICE_ID, "public_key": PUBLIC_KEY,
              "name": is_device_name, "nonce": NONCE, "signature": SIGNATURE,
              "invite_signature": SIGNATURE}
    invite_key: str
    device_id: str
    public_key: str
    name: str
    nonce: str
    signature: str
    invite_signature: str


@dataclass(frozen=True)
class Paired(Frame):
    """Server's grant: its public key and the bearer token, signed."""

    TYPE = "paired"
    CHECKS = {"device_id": DEVICE_ID, "public_key": PUBLIC_KEY, "token": TOKEN,
              "signature": SIGNATURE}
    device_id: str
    public_key: str
    token: str = field(repr=False)  # the device's credential: never in a repr
    signature: str


@dataclass(frozen=True)
class Ping(Frame):
    """Are you there? Answered by ``pong`` with the same ``req``."""

    TYPE = "ping"
    CHECKS = {"req": REQ}
    req: str


@dataclass(frozen=True)
class Pong(Frame):
    """The answer to ``ping``."""

    TYPE = "pong"
    CHECKS = {"req": REQ}
    req: str


@dataclass(frozen=True)
class Refused(Frame):
    """Server's signed refusal of a handshake, or of a live link whose grant closed,
    checked against the key the client pinned: the only refusal a sender takes as final
    (a stranger at the peer's URL, or a relay between the devices, cannot sign it)."""

    TYPE = "refused"
    CHECKS = {"reason": _one_of(*REFUSED_REASONS), "signature": SIGNATURE}
    reason: str
    signature: str


@dataclass(frozen=True)
class Committed(Frame):
    """Server, just before a handshake's ``refused``: which of the ids the upgrade named
    (:data:`IN_FLIGHT_HEADER`) it has committed. The refusal's signature covers them."""

    TYPE = "committed"
    CHECKS = {"ids": _message_ids}
    ids: list[str]


FRAME_TYPES: dict[str, type[Frame]] = {c.TYPE: c for c in (
    Deliver, Ack, Read, Stop, Result, Error, Challenge, Hello, Welcome, Pair, Paired, Ping,
    Pong, Refused, Committed)}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FrameError("duplicate_key", key)
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise FrameError("bad_json", f"{name} is not JSON")


def parse(data: bytes | str) -> Frame:
    """The frame in ``data``; :class:`FrameError` for anything off the format."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            raise FrameError("bad_utf8") from None
    elif isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
    else:
        raise FrameError("bad_type", type(data).__name__)
    if len(raw) > MAX_FRAME_BYTES:
        raise FrameError("too_large", f"{len(raw)} bytes > {MAX_FRAME_BYTES}")
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise FrameError("bad_utf8") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        raise FrameError("bad_json") from None
    if not isinstance(obj, dict):
        raise FrameError("not_object")
    version = obj.get("v")
    if type(version) is not int or version != VERSION:
        raise FrameError("bad_version", repr(version)[:20])
    kind = obj.get("type")
    cls = FRAME_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FrameError("unknown_type", repr(kind)[:40])
    expected = set(cls.CHECKS) | {"v", "type"}
    if set(obj) != expected:
        extra, missing = sorted(set(obj) - expected), sorted(expected - set(obj))
        raise FrameError("bad_keys", f"extra {extra[:5]}, missing {missing}")
    for name, check in cls.CHECKS.items():
        if not check(obj[name]):
            raise FrameError("bad_field", f"{cls.TYPE}.{name}")
    return cls(**{name: obj[name] for name in cls.CHECKS})


def shown(text: str, limit: int = 300) -> str:
    """Text a peer (or whatever answers at its address) sent, fit for a log line, a
    database column and a terminal: at most ``limit`` characters, anything unprintable
    (escape sequences, bidirectional overrides, line breaks) as ``\\x..`` escapes."""
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:limit])
    return out + ("..." if len(text) > limit else "")


def encode(frame: Frame) -> str:
    """The wire text of ``frame``; :class:`FrameError` if it breaks the format itself."""
    body = {"v": VERSION, "type": frame.TYPE, **{f.name: getattr(frame, f.name)
                                                 for f in fields(frame)}}
    for name, check in frame.CHECKS.items():
        if not check(body[name]):
            raise FrameError("bad_field", f"{frame.TYPE}.{name}")
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode("utf-8")) > MAX_FRAME_BYTES:
        raise FrameError("too_large", f"{frame.TYPE} frame over {MAX_FRAME_BYTES} bytes")
    return text
