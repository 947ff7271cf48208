"""SPDY/3.1 framing (podvisor.common.spdy): every frame round-trips, header blocks share one
zlib context per direction, partial input waits, bad input is a clear SpdyError, and a session
pair talks over a real socket pair."""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib

import pytest

from podvisor.common import spdy


def test_dictionary_is_spdy3s() -> None:
    # draft 3's dictionary: 1423 bytes; zlib names a dictionary by its Adler-32
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert b"\x00\x00\x00\x06200 OK\x00\x00\x00\x07version" in spdy.DICTIONARY
    assert spdy.DICTIONARY.endswith(b"utf-,*,enq=0.")


FRAMES: list[spdy.Frame] = [
    spdy.SynStream(1, {"streamtype": ["error"], "x": ["a", "b"]}, priority=3, fin=True),
    spdy.SynReply(1, {}),
    spdy.SynReply(3, {"k": ["v"]}, fin=True),
    spdy.HeadersFrame(5, {"port": ["8080"]}),
    spdy.DataFrame(1, b"hello"),
    spdy.DataFrame(3, b"", fin=True),
    spdy.RstStream(7, spdy.CANCEL),
    spdy.Settings([(0, 7, 65536), (1, 4, 100)], clear=True),
    spdy.Ping(1),
    spdy.GoAway(9, 0),
    spdy.WindowUpdate(1, 4096),
]


def test_every_frame_round_trips_in_one_stream_of_bytes() -> None:
    sender, receiver = spdy.FrameCodec(), spdy.FrameCodec()
    wire = b"".join(sender.encode(f) for f in FRAMES)
    assert receiver.feed(wire) == FRAMES


def test_partial_input_waits_for_the_rest() -> None:
    sender, receiver = spdy.FrameCodec(), spdy.FrameCodec()
    wire = b"".join(sender.encode(f) for f in FRAMES)
    got: list[spdy.Frame] = []
    for i in range(len(wire)):  # one byte at a time
        got += receiver.feed(wire[i:i + 1])
    assert got == FRAMES


def test_wire_layout() -> None:
    codec = spdy.FrameCodec()
    assert codec.encode(spdy.DataFrame(3, b"ab", fin=True)) == b"\x00\x00\x00\x03\x01\x00\x00\x02ab"
    assert codec.encode(spdy.Ping(2)) == b"\x80\x03\x00\x06\x00\x00\x00\x04\x00\x00\x00\x02"
    assert codec.encode(spdy.RstStream(5, 3)) == (b"\x80\x03\x00\x03\x00\x00\x00\x08"
                                                  b"\x00\x00\x00\x05\x00\x00\x00\x03")
    syn = codec.encode(spdy.SynStream(1, {"streamType": ["stdout"]}, priority=2,
                                      unidirectional=True))
    version, kind, flags_len = struct.unpack(">HHI", syn[:8])
    assert (version, kind, flags_len >> 24) == (0x8003, 1, spdy.FLAG_UNIDIRECTIONAL)
    assert struct.unpack(">IIBB", syn[8:18]) == (1, 0, 2 << 5, 0)
    # the header block: deflated with the dictionary, names lower-cased, sync-flushed
    block = zlib.decompressobj(zdict=spdy.DICTIONARY).decompress(syn[18:])
    assert block == (b"\x00\x00\x00\x01" b"\x00\x00\x00\x0astreamtype" b"\x00\x00\x00\x06stdout")


def test_header_contexts_persist_across_frames() -> None:
    """The second block depends on the first's zlib state: a fresh decoder cannot read it."""
    sender = spdy.FrameCodec()
    first = sender.encode(spdy.SynStream(1, {"streamtype": ["stdin"]}))
    second = sender.encode(spdy.SynStream(3, {"streamtype": ["stdin"]}))
    in_order = spdy.FrameCodec()
    assert in_order.feed(first + second)[1] == spdy.SynStream(3, {"streamtype": ["stdin"]})
    with pytest.raises(spdy.SpdyError):
        spdy.FrameCodec().feed(second)


@pytest.mark.parametrize("wire, why", [
    (b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01", "version"),
    (b"\x80\x03\x00\x06\x00\x00\x00\x02\x00\x00", "too short"),
    (b"\x80\x03\x00\x02\x00\x00\x00\x08\x00\x00\x00\x01garbage!", "decompress"),
])
def test_bad_input_is_a_clear_error(wire: bytes, why: str) -> None:
    with pytest.raises(spdy.SpdyError, match=why):
        spdy.FrameCodec().feed(wire)


def test_unknown_control_frames_are_skipped() -> None:
    unknown = b"\x80\x03\x00\x0a\x00\x00\x00\x02zz"
    assert spdy.FrameCodec().feed(unknown + spdy.FrameCodec().encode(spdy.Ping(1))) == \
        [spdy.Ping(1)]


def test_header_block_rules() -> None:
    upper = spdy.encode_header_block({"a": ["1"]}).replace(b"\x01a", b"\x01A")
    with pytest.raises(spdy.SpdyError, match="lower case"):
        spdy.decode_header_block(upper)
    twice = b"\x00\x00\x00\x02" + (b"\x00\x00\x00\x01a\x00\x00\x00\x011") * 2
    with pytest.raises(spdy.SpdyError, match="twice"):
        spdy.decode_header_block(twice)
    assert spdy.decode_header_block(spdy.encode_header_block({"v": ["x", "y"]})) == \
        {"v": ["x", "y"]}


def test_session_pair_streams_ping_and_goaway() -> None:
    async def run() -> None:
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_connection(sock=a)
        rb, wb = await asyncio.open_connection(sock=b)
        seen: list[spdy.Frame] = []
        echoed = {1: asyncio.Event(), 2: asyncio.Event()}

        def watch(frame: spdy.Frame) -> None:
            seen.append(frame)
            if isinstance(frame, spdy.Ping):
                echoed[frame.ping_id].set()
        server = spdy.Session(ra, wa, server=True, on_frame=watch)
        client = spdy.Session(rb, wb, server=False, on_frame=watch)
        tasks = [asyncio.ensure_future(server.run()), asyncio.ensure_future(client.run())]
        stream = await client.open({"streamtype": ["stdin"]})
        assert stream.id == 1
        peer = await server.accept()
        assert peer is not None and peer.header("streamType") == "stdin"
        await stream.write(b"x" * 100_000)
        await stream.close()
        got = b""
        while chunk := await peer.read():
            got += chunk
        assert got == b"x" * 100_000
        await peer.write(b"back")
        await peer.close()
        assert await stream.read() == b"back" and await stream.read() == b""
        await client.send(spdy.Ping(1))
        await server.send(spdy.Ping(2))
        # each side echoes the other's ping (odd: the client's, even: the server's)
        await echoed[1].wait()
        await echoed[2].wait()
        await asyncio.gather(server.close(), client.close())
        await asyncio.gather(*tasks)
        assert seen.count(spdy.Ping(1)) == 2 and seen.count(spdy.Ping(2)) == 2
        assert any(isinstance(f, spdy.GoAway) for f in seen)
        wb.close()
    asyncio.run(run())


def test_a_stream_nobody_reads_stops_the_session_reading() -> None:
    """Back pressure: past STREAM_BUFFER unread bytes the session reads no more frames (the
    sender is held by TCP), then everything arrives intact once the stream is read."""
    async def run() -> None:
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_connection(sock=a)
        rb, wb = await asyncio.open_connection(sock=b)
        server = spdy.Session(ra, wa, server=True)
        client = spdy.Session(rb, wb, server=False)
        tasks = [asyncio.ensure_future(server.run()), asyncio.ensure_future(client.run())]
        stream = await client.open({"streamtype": ["stdin"]})
        peer = await server.accept()
        assert peer is not None
        payload = bytes(range(256)) * (3 * spdy.STREAM_BUFFER // 256)

        async def send() -> None:
            await stream.write(payload)
            await stream.close()
        sender = asyncio.ensure_future(send())
        while peer._buffered <= spdy.STREAM_BUFFER:
            await asyncio.sleep(0)
        for _ in range(100):  # let the loop run; the session must not read on
            await asyncio.sleep(0)
        assert peer._buffered <= spdy.STREAM_BUFFER + 64 * 1024 and not sender.done()
        got = b""
        while chunk := await peer.read():
            got += chunk
        assert got == payload
        await sender
        await asyncio.gather(server.close(), client.close())
        await asyncio.gather(*tasks)
        wb.close()
    asyncio.run(run())
