"""SPDY/3.1 as Kubernetes speaks it (``Upgrade: SPDY/3.1``: kubectl, the API server and crictl
to a kubelet or a runtime's streaming server): the frames, the header block compression and a
small asyncio session.

No well-kept Python library speaks SPDY, so this is written from the SPDY/3 draft and from what
moby/spdystream (the Go implementation client-go and the kubelet use) does on the wire:

- Frames: a control frame is ``1 | version(15) | type(16) | flags(8) | length(24) | data``;
  a data frame is ``0 | stream-id(31) | flags(8) | length(24) | data``. Control frames:
  SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE.
  A control frame of an unknown type is skipped, as the draft says.
- Header blocks (``count(32)`` then ``len(32) name len(32) value`` pairs; several values of one
  name joined with NUL; names lower case) are zlib-compressed with SPDY/3's dictionary, with
  ONE compression context per direction for the whole connection, each block ending in a sync
  flush (Go's ``zlib.Writer.Flush``).
- Flow control: spdystream does not enforce windows; it neither sends WINDOW_UPDATE nor waits
  for it, and ignores SETTINGS and WINDOW_UPDATE. This session does the same (it parses both
  and ignores them); back pressure is TCP's: as spdystream's frame handler blocks on a
  stream's unbuffered channel, the session stops reading the connection while a stream holds
  more than ``STREAM_BUFFER`` unread bytes.
- Streams: the client's IDs are odd, the server's even; a SYN_STREAM is answered by a
  SYN_REPLY (no headers) as the kubelet's ``httpstream/spdy`` does when it accepts a stream;
  FIN (on DATA, SYN_STREAM, SYN_REPLY or HEADERS) half-closes the sender's side; RST_STREAM
  ends both; PING from the peer is echoed; GOAWAY ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "DICTIONARY", "DataFrame", "Frame", "FrameCodec", "GoAway", "Headers", "HeadersFrame",
    "Ping", "RstStream", "Session", "Settings", "SpdyError", "SpdyStream", "SynReply",
    "SynStream", "WindowUpdate",
]

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = (
    1, 2, 3, 4, 6, 7, 8, 9)
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_CLEAR_SETTINGS = 0x01
MAX_DATA = (1 << 24) - 1
STREAM_BUFFER = 1 << 20  # unread bytes a stream may hold before the session stops reading
# RST_STREAM status codes
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, CANCEL, INTERNAL_ERROR = 1, 2, 3, 5, 6

_WORDS = (  # "200 OK" is the one entry with a space in it
    "options head post put delete trace accept accept-charset accept-encoding accept-language "
    "accept-ranges age allow authorization cache-control connection content-base "
    "content-encoding content-language content-length content-location content-md5 "
    "content-range content-type date etag expect expires from host if-match if-modified-since "
    "if-none-match if-range if-unmodified-since last-modified location max-forwards pragma "
    "proxy-authenticate proxy-authorization range referer retry-after server te trailer "
    "transfer-encoding upgrade user-agent vary via warning www-authenticate method get status",
    "200 OK",
    "version HTTP/1.1 url public set-cookie keep-alive origin")
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504"
    "505203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, "
    "Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")


def _build() -> bytes:
    words = [w for part in _WORDS for w in ([part] if part == "200 OK" else part.split())]
    return b"".join(struct.pack(">I", len(w)) + w.encode() for w in words) + _TAIL.encode()


# SPDY/3's header compression dictionary (draft 3, section 2.6.10.1): 1423 bytes
DICTIONARY = _build()

Headers = dict[str, list[str]]


class SpdyError(Exception):
    """A protocol violation; the session ends with GOAWAY(PROTOCOL_ERROR)."""


@dataclass
class DataFrame:
    stream_id: int
    data: bytes = b""
    fin: bool = False


@dataclass
class SynStream:
    stream_id: int
    headers: Headers
    associated_id: int = 0
    priority: int = 0
    fin: bool = False
    unidirectional: bool = False


@dataclass
class SynReply:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    fin: bool = False


@dataclass
class RstStream:
    stream_id: int
    status: int


@dataclass
class Settings:
    entries: list[tuple[int, int, int]] = field(default_factory=list)  # (flags, id, value)
    clear: bool = False


@dataclass
class Ping:
    ping_id: int


@dataclass
class GoAway:
    last_good_id: int
    status: int = 0


@dataclass
class HeadersFrame:
    stream_id: int
    headers: Headers
    fin: bool = False


@dataclass
class WindowUpdate:
    stream_id: int
    delta: int


Frame = (DataFrame | SynStream | SynReply | RstStream | Settings | Ping | GoAway | HeadersFrame
         | WindowUpdate)


def encode_header_block(headers: Headers) -> bytes:
    out = bytearray(struct.pack(">I", len(headers)))
    for name, values in headers.items():
        key, value = name.lower().encode(), "\x00".join(values).encode()
        out += struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value
    return bytes(out)


def decode_header_block(block: bytes) -> Headers:
    try:
        (count,), pos = struct.unpack_from(">I", block), 4
        headers: Headers = {}
        for _ in range(count):
            (n,) = struct.unpack_from(">I", block, pos)
            name = block[pos + 4:pos + 4 + n].decode()
            pos += 4 + n
            (n,) = struct.unpack_from(">I", block, pos)
            value = block[pos + 4:pos + 4 + n].decode()
            if len(block) < pos + 4 + n:
                raise SpdyError("truncated header block")
            pos += 4 + n
            if name != name.lower():
                raise SpdyError(f"header name {name!r} is not lower case")
            if name in headers:
                raise SpdyError(f"header {name!r} appears twice")
            headers[name] = value.split("\x00")
    except (struct.error, UnicodeDecodeError) as exc:
        raise SpdyError(f"bad header block: {exc}") from None
    return headers


class FrameCodec:
    """One side's framer: encodes what it sends, decodes what it receives (``feed``), each
    direction with its own zlib context for the connection's life."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(9, zdict=DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._buf = bytearray()

    # -- encoding ---------------------------------------------------------------------------

    def _headers(self, headers: Headers) -> bytes:
        block = encode_header_block(headers)
        return self._deflate.compress(block) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def _control(kind: int, flags: int, body: bytes) -> bytes:
        return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(body)) + body

    def encode(self, frame: Frame) -> bytes:
        if isinstance(frame, DataFrame):
            if not 0 < frame.stream_id < 1 << 31 or len(frame.data) > MAX_DATA:
                raise SpdyError("invalid data frame")
            flags = FLAG_FIN if frame.fin else 0
            return struct.pack(">II", frame.stream_id,
                               (flags << 24) | len(frame.data)) + frame.data
        if isinstance(frame, SynStream):
            flags = (FLAG_FIN if frame.fin else 0) | (
                FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
            body = struct.pack(">IIBB", frame.stream_id, frame.associated_id,
                               (frame.priority & 7) << 5, 0) + self._headers(frame.headers)
            return self._control(SYN_STREAM, flags, body)
        if isinstance(frame, SynReply):
            return self._control(SYN_REPLY, FLAG_FIN if frame.fin else 0,
                                 struct.pack(">I", frame.stream_id)
                                 + self._headers(frame.headers))
        if isinstance(frame, HeadersFrame):
            return self._control(HEADERS, FLAG_FIN if frame.fin else 0,
                                 struct.pack(">I", frame.stream_id)
                                 + self._headers(frame.headers))
        if isinstance(frame, RstStream):
            return self._control(RST_STREAM, 0, struct.pack(">II", frame.stream_id,
                                                             frame.status))
        if isinstance(frame, Settings):
            body = struct.pack(">I", len(frame.entries)) + b"".join(
                struct.pack(">II", (flags << 24) | ident, value)
                for flags, ident, value in frame.entries)
            return self._control(SETTINGS, FLAG_CLEAR_SETTINGS if frame.clear else 0, body)
        if isinstance(frame, Ping):
            return self._control(PING, 0, struct.pack(">I", frame.ping_id))
        if isinstance(frame, GoAway):
            return self._control(GOAWAY, 0, struct.pack(">II", frame.last_good_id,
                                                         frame.status))
        if isinstance(frame, WindowUpdate):
            return self._control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id,
                                                                frame.delta))
        raise TypeError(f"not a SPDY frame: {frame!r}")

    # -- decoding ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        """The whole frames ``data`` completes (a partial one waits for more)."""
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= 8:
            word, flags_len = struct.unpack_from(">II", self._buf)
            length = flags_len & 0xFFFFFF
            if len(self._buf) < 8 + length:
                break
            body = bytes(self._buf[8:8 + length])
            del self._buf[:8 + length]
            flags = flags_len >> 24
            if not word & 0x80000000:
                frames.append(DataFrame(word, body, bool(flags & FLAG_FIN)))
                continue
            version, kind = (word >> 16) & 0x7FFF, word & 0xFFFF
            if version != VERSION:
                raise SpdyError(f"unsupported SPDY version {version}")
            frame = self._control_frame(kind, flags, body)
            if frame is not None:
                frames.append(frame)
        return frames

    def _inflate_headers(self, block: bytes) -> Headers:
        try:
            return decode_header_block(self._inflate.decompress(block))
        except zlib.error as exc:
            raise SpdyError(f"header block does not decompress: {exc}") from None

    def _control_frame(self, kind: int, flags: int, body: bytes) -> Frame | None:
        fin = bool(flags & FLAG_FIN)
        try:
            if kind == SYN_STREAM:
                sid, assoc, prio = struct.unpack_from(">IIB", body)
                return SynStream(sid & 0x7FFFFFFF, self._inflate_headers(body[10:]),
                                 assoc & 0x7FFFFFFF, prio >> 5, fin,
                                 bool(flags & FLAG_UNIDIRECTIONAL))
            if kind in (SYN_REPLY, HEADERS):
                (sid,) = struct.unpack_from(">I", body)
                headers = self._inflate_headers(body[4:])
                return (SynReply(sid & 0x7FFFFFFF, headers, fin) if kind == SYN_REPLY
                        else HeadersFrame(sid & 0x7FFFFFFF, headers, fin))
            if kind == RST_STREAM:
                sid, status = struct.unpack_from(">II", body)
                return RstStream(sid & 0x7FFFFFFF, status)
            if kind == SETTINGS:
                (count,) = struct.unpack_from(">I", body)
                entries = []
                for i in range(count):
                    word, value = struct.unpack_from(">II", body, 4 + 8 * i)
                    entries.append((word >> 24, word & 0xFFFFFF, value))
                return Settings(entries, bool(flags & FLAG_CLEAR_SETTINGS))
            if kind == PING:
                return Ping(struct.unpack_from(">I", body)[0])
            if kind == GOAWAY:
                last, status = struct.unpack_from(">II", body)
                return GoAway(last & 0x7FFFFFFF, status)
            if kind == WINDOW_UPDATE:
                sid, delta = struct.unpack_from(">II", body)
                return WindowUpdate(sid & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        except struct.error:
            raise SpdyError(f"control frame of type {kind} is too short") from None
        return None  # an unknown control frame type: ignored


# -- the session --------------------------------------------------------------------------------


class SpdyStream:
    """One stream of a session: ``read`` (b"" once the peer half-closed or reset it),
    ``write``, ``close`` (our half-close: FIN), ``reset``."""

    def __init__(self, session: Session, stream_id: int, headers: Headers) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self._data: asyncio.Queue[bytes] = asyncio.Queue()
        self._buffered = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self.remote_closed = False
        self.local_closed = False
        self.replied = asyncio.Event()

    def header(self, name: str) -> str:
        return (self.headers.get(name.lower()) or [""])[0]

    def _remote_fin(self) -> None:
        if not self.remote_closed:
            self.remote_closed = True
            self._data.put_nowait(b"")
        self._drained.set()  # nothing more will be waited for

    def _put(self, data: bytes) -> None:
        self._data.put_nowait(data)
        self._buffered += len(data)
        if self._buffered > STREAM_BUFFER:
            self._drained.clear()

    async def read(self) -> bytes:
        if self.remote_closed and self._data.empty():
            return b""
        chunk = await self._data.get()
        if not chunk:
            self._data.put_nowait(b"")  # later reads see the end too
        self._buffered -= len(chunk)
        if self._buffered <= STREAM_BUFFER:
            self._drained.set()
        return chunk

    async def write(self, data: bytes) -> None:
        if self.local_closed or self.session.closed:
            raise ConnectionResetError(f"SPDY stream {self.id} is closed")
        for start in range(0, len(data), 32 * 1024):
            await self.session.send(DataFrame(self.id, data[start:start + 32 * 1024]))

    async def close(self) -> None:
        if not self.local_closed:
            self.local_closed = True
            with contextlib.suppress(ConnectionError):
                await self.session.send(DataFrame(self.id, b"", fin=True))

    async def reset(self, status: int = CANCEL) -> None:
        self.local_closed = True
        self._remote_fin()
        with contextlib.suppress(ConnectionError):
            await self.session.send(RstStream(self.id, status))


class Session:
    """A SPDY session over a connected (reader, writer) pair (after the HTTP 101).

    ``run()`` reads frames until the connection ends or GOAWAY; the peer's new streams are
    answered with a SYN_REPLY and queued for ``accept()``; ``open()`` creates a stream of ours
    and waits for its SYN_REPLY."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 server: bool,
                 on_frame: Callable[[Frame], None] | None = None) -> None:
        self._reader, self._writer = reader, writer
        self._codec = FrameCodec()
        self._next_id = 2 if server else 1
        self._ping_parity = 0 if server else 1  # our own pings' parity
        self._streams: dict[int, SpdyStream] = {}
        self._incoming: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._last_received = 0
        self._on_frame = on_frame
        self.closed = False
        self.went_away = asyncio.Event()

    async def send(self, frame: Frame) -> None:
        if self.closed:
            raise ConnectionResetError("the SPDY session is closed")
        async with self._lock:  # header compression state: frames go out in encoding order
            self._writer.write(self._codec.encode(frame))
            await self._writer.drain()

    async def accept(self) -> SpdyStream | None:
        """The peer's next stream; None once the session ended."""
        return await self._incoming.get()

    async def open(self, headers: Headers, fin: bool = False) -> SpdyStream:
        sid = self._next_id
        self._next_id += 2
        stream = SpdyStream(self, sid, headers)
        self._streams[sid] = stream
        if fin:
            stream.local_closed = True
        await self.send(SynStream(sid, headers, fin=fin))
        await stream.replied.wait()
        return stream

    async def run(self) -> None:
        try:
            while not self.went_away.is_set():
                data = await self._reader.read(64 * 1024)
                if not data:
                    break
                for frame in self._codec.feed(data):
                    if self._on_frame is not None:
                        self._on_frame(frame)
                    await self._handle(frame)
        except SpdyError:
            with contextlib.suppress(ConnectionError):
                await self.send(GoAway(self._last_received, 1))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.went_away.set()
            for stream in self._streams.values():
                stream._remote_fin()
                stream.replied.set()
            self._incoming.put_nowait(None)

    async def _handle(self, frame: Frame) -> None:
        if isinstance(frame, DataFrame):
            stream = self._streams.get(frame.stream_id)
            if stream is None or stream.remote_closed:
                return
            if frame.data:
                stream._put(frame.data)
            if frame.fin:
                stream._remote_fin()
            elif not stream._drained.is_set():
                await stream._drained.wait()  # back pressure: stop reading the connection
        elif isinstance(frame, SynStream):
            if frame.stream_id in self._streams or frame.stream_id <= self._last_received \
                    or frame.stream_id % 2 == self._next_id % 2:
                await self.send(RstStream(frame.stream_id, PROTOCOL_ERROR))
                return
            self._last_received = frame.stream_id
            stream = SpdyStream(self, frame.stream_id, frame.headers)
            self._streams[frame.stream_id] = stream
            if frame.fin:
                stream._remote_fin()
            await self.send(SynReply(frame.stream_id))
            stream.replied.set()
            self._incoming.put_nowait(stream)
        elif isinstance(frame, SynReply | HeadersFrame):
            stream = self._streams.get(frame.stream_id)
            if stream is not None:
                stream.replied.set()
                if frame.fin:
                    stream._remote_fin()
        elif isinstance(frame, RstStream):
            stream = self._streams.get(frame.stream_id)
            if stream is not None:
                stream.local_closed = True
                stream._remote_fin()
                stream.replied.set()
        elif isinstance(frame, Ping):
            if frame.ping_id % 2 != self._ping_parity:
                await self.send(frame)
        elif isinstance(frame, GoAway):
            self.went_away.set()
        # SETTINGS and WINDOW_UPDATE: ignored, as spdystream does

    async def close(self, wait_for_peer: float = 5.0) -> None:
        """GOAWAY, then wait (bounded) for the peer to close its end, then close ours."""
        if self.closed:
            return
        with contextlib.suppress(ConnectionError):
            await self.send(GoAway(self._last_received, 0))
        self.closed = True
        with contextlib.suppress(Exception):
            if self._writer.can_write_eof():
                self._writer.write_eof()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(self.went_away.wait(), wait_for_peer)
        self._writer.close()
