#!/usr/bin/env python3
"""An HTTP/3 client for the end-to-end tests, on aioquic (a QUIC and HTTP/3 stack we did not write).

Usage: h3client.py SPEC, SPEC being JSON:
  addr         "127.0.0.1:PORT"
  server_name  SNI and :authority (default "localhost")
  cafile       a CA to verify the server with; without it, no verification
  requests     [{method, path, headers: {name: value}, body: str, reset_after: bytes, stall_after: bytes,
               literal: bool}]
               (reset_after: stop and reset the stream once that many body bytes came; 0: right after
               the head; stall_after: once that many body bytes came, go deaf and mute for `stall_ms`:
               read no datagram, acknowledge nothing, send nothing, as a client that stopped reading;
               literal: encode the head here, as literals, with no size limit)
  stall_ms     how long a stalled client stays deaf and mute (default 5000)
  parallel     send every request at once (default: one after the other)
  zero_rtt     first fetch `prime` on a connection of its own to get a session ticket, then send
               `requests` on a resumed connection in early data, before the handshake completes
  hold_ms      with `parallel`, send nothing else (the handshake's end included) this long after the
               requests
  attack       instead of requests, misbehave on one connection and report how it ended:
               "data_before_headers", "decoder_flood", "encoder_flood", "over_stream_limit" (opens
               `streams` requests at once, default 300, whatever limit the server set),
               "stall_handshake" (sends its first Initial, then stays deaf and mute for `stall_ms`),
               "huge_reserved_frame" (a reserved frame announcing 2^40 bytes on the control stream, then
               `streams` MiB of it), "huge_headers" (a request whose HEADERS announces 2^40 bytes, then
               64 KiB of it; its answer waited for at most `streams` seconds); `requests` given with an
               attack are sent on the same connection after it, if it is still open
Prints JSON: {"results": [{status, headers, interim: [{status, headers}], length, sha256, ms, error}], "early_data_accepted",
"session_resumed", "closed": {"error_code", "reason"} or null, "flood_allowed": bytes the server let a
flood send, "attack_sent": bytes an attack sent, "attack_result": the answer to an attack's request}.
"""

import asyncio
import hashlib
import json
import ssl
import sys
import time

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection, HeadersState
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset

H3_REQUEST_CANCELLED = 0x10C


class H3(H3Connection):
    """aioquic's HTTP/3, but for HEAD: aioquic 1.2 checks a response's Content-Length against the DATA that
    came even for a HEAD request, whose response has none (RFC 9110 §9.3.2), and closes the connection.
    And for informational responses: aioquic 1.2 takes the HEADERS frame after a 103 for trailers (and
    refuses its `:status`), where RFC 9114 §4.1 has the final response follow any number of them."""

    def __init__(self, quic):
        super().__init__(quic)
        self.heads = set()

    def _check_content_length(self, stream):
        if stream.stream_id not in self.heads:
            super()._check_content_length(stream)

    def _handle_request_or_push_frame(self, frame_type, frame_data, stream, stream_ended):
        events = super()._handle_request_or_push_frame(frame_type, frame_data, stream, stream_ended)
        for event in events:
            if isinstance(event, HeadersReceived) and any(
                k == b":status" and v.startswith(b"1") for k, v in event.headers
            ):
                stream.headers_recv_state = HeadersState.INITIAL
        return events


class Client(QuicConnectionProtocol):
    # The connection being made, for its close when the handshake never completes.
    last = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Client.last = self
        self.h3 = H3(self._quic)
        self.streams = {}
        self.closed = None
        self.terminated = asyncio.Event()
        # Deaf and mute: datagrams are neither read nor sent.
        self.mute = False

    def datagram_received(self, data, addr):
        if not self.mute:
            super().datagram_received(data, addr)

    def transmit(self):
        if not self.mute:
            super().transmit()

    async def stall(self, ms):
        self.mute = True
        await asyncio.sleep(ms / 1000)
        self.mute = False

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.closed = {"error_code": event.error_code, "reason": event.reason_phrase}
            self.terminated.set()
            for stream in self.streams.values():
                stream.finish("connection closed")
            return
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            self.streams[event.stream_id].finish(f"stream reset {event.error_code}")
            return
        for h3_event in self.h3.handle_event(event):
            stream = self.streams.get(getattr(h3_event, "stream_id", None))
            if stream is not None:
                stream.on_event(self, h3_event)

    def request(self, spec):
        stream_id = self._quic.get_next_available_stream_id()
        if spec.get("method") == "HEAD":
            self.h3.heads.add(stream_id)
        authority = self.server_name
        headers = [
            (b":method", spec.get("method", "GET").encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", spec["path"].encode()),
        ] + [(k.lower().encode(), v.encode()) for k, v in spec.get("headers", {}).items()]
        body = spec.get("body")
        if spec.get("literal"):
            # Encoded here, field by field as literals: aioquic's encoder takes no section over 4 KiB.
            block = b"\x00\x00" + b"".join(literal_field(k, v) for k, v in headers)
            frame = encode_varint(1) + encode_varint(len(block)) + block
            self._quic.send_stream_data(stream_id, frame, end_stream=body is None)
            # aioquic learns of the stream from the answer.
            self.h3._get_or_create_stream(stream_id)
        else:
            self.h3.send_headers(stream_id, headers, end_stream=body is None)
        if body is not None:
            self.h3.send_data(stream_id, body.encode(), end_stream=True)
        stream = Stream(stream_id, spec.get("reset_after"), spec.get("stall_after"))
        self.streams[stream_id] = stream
        self.transmit()
        return stream


def encode_varint(n):
    for length, flag in ((1, 0), (2, 0x40), (4, 0x80), (8, 0xC0)):
        if n < 1 << (8 * length - 2):
            return (n | flag << (8 * length - 8)).to_bytes(length, "big")
    raise ValueError(n)


def prefixed_int(n, bits, flags):
    # QPACK's (HPACK's) integers: `bits` in the first byte beside `flags`, then 7 bits a byte.
    limit = (1 << bits) - 1
    if n < limit:
        return bytes([flags | n])
    out = [flags | limit]
    n -= limit
    while n >= 128:
        out.append(n % 128 | 128)
        n //= 128
    out.append(n)
    return bytes(out)


def literal_field(name, value):
    # Literal Field Line with Literal Name, no Huffman (RFC 9204 §4.5.6).
    return prefixed_int(len(name), 3, 0x20) + name + prefixed_int(len(value), 7, 0) + value


class Stream:
    def __init__(self, stream_id, reset_after, stall_after):
        self.stream_id = stream_id
        self.reset_after = reset_after
        self.stall_after = stall_after
        self.started = time.monotonic()
        self.status = None
        self.headers = []
        self.interim = []
        self.length = 0
        self.digest = hashlib.sha256()
        self.error = None
        self.done = asyncio.get_event_loop().create_future()

    def on_event(self, client, event):
        if isinstance(event, HeadersReceived):
            status = next((int(v) for k, v in event.headers if k == b":status"), None)
            if self.status is None and status is not None and status < 200:
                self.interim.append(
                    {
                        "status": status,
                        "headers": [[k.decode(), v.decode()] for k, v in event.headers if k != b":status"],
                    }
                )
            elif self.status is None:
                for k, v in event.headers:
                    if k == b":status":
                        self.status = int(v)
                    else:
                        self.headers.append([k.decode(), v.decode()])
        elif isinstance(event, DataReceived):
            self.length += len(event.data)
            self.digest.update(event.data)
        if self.reset_after is not None and self.status is not None and self.length >= self.reset_after:
            # As a browser cancels a request: stop the server's sending, reset our own side.
            client._quic.stop_stream(self.stream_id, H3_REQUEST_CANCELLED)
            client._quic.reset_stream(self.stream_id, H3_REQUEST_CANCELLED)
            client.transmit()
            self.finish("reset by client")
            return
        if self.stall_after is not None and self.status is not None and self.length >= self.stall_after:
            client.mute = True
            self.finish("stalled")
            return
        if event.stream_ended:
            self.finish(None)

    def finish(self, error):
        if not self.done.done():
            self.error = error
            self.done.set_result(None)

    def result(self):
        return {
            "status": self.status,
            "headers": self.headers,
            "interim": self.interim,
            "length": self.length,
            "sha256": self.digest.hexdigest(),
            "ms": round((time.monotonic() - self.started) * 1000, 3),
            "error": self.error,
        }


def configuration(spec, ticket_store):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.server_name = spec.get("server_name", "localhost")
    if spec.get("cafile"):
        config.load_verify_locations(spec["cafile"])
    else:
        config.verify_mode = ssl.CERT_NONE
    if ticket_store.get("ticket") is not None:
        config.session_ticket = ticket_store["ticket"]
    return config


async def run_requests(client, requests, parallel, timeout, hold_ms=0, stall_ms=5000):
    results = []
    if parallel:
        streams = [client.request(r) for r in requests]
        if hold_ms:
            # Nothing more goes out for a while, the handshake's end included: the server has the
            # requests in early data well before the handshake completes, whatever the machine's load.
            send = client.transmit
            client.transmit = lambda: None
            await asyncio.sleep(hold_ms / 1000)
            client.transmit = send
            client.transmit()
        await asyncio.wait([s.done for s in streams], timeout=timeout)
        results = streams
    else:
        for r in requests:
            stream = client.request(r)
            await asyncio.wait([stream.done], timeout=timeout)
            results.append(stream)
    for s in results:
        if not s.done.done():
            s.finish("timed out")
    if client.mute:
        # A request stalled the client: it stays so for the rest of `stall_ms`.
        await client.stall(stall_ms)
    return [s.result() for s in results]


async def send_paced(client, stream_id, mib):
    """Sends `mib` MiB of zeros on a stream as fast as the peer's flow control lets them go, holding at most
    a few MiB in aioquic's send buffer; returns once all of it left or the connection closed."""
    quic = client._quic
    chunk = bytes(1 << 20)
    for _ in range(mib):
        quic.send_stream_data(stream_id, chunk)
        client.transmit()
        while not client.terminated.is_set() and quic._streams[stream_id].sender._buffer_stop - quic._streams[stream_id].sender.highest_offset > 4 << 20:
            await asyncio.sleep(0.002)
            client.transmit()
    deadline = asyncio.get_running_loop().time() + 30
    while not client.terminated.is_set() and not quic._streams[stream_id].sender.buffer_is_empty:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.01)
        client.transmit()


async def attack(client, kind, count, stall_ms):
    quic = client._quic
    if kind == "stall_handshake":
        # The Initial with the ClientHello goes out, and nothing after it: the handshake never completes.
        client.transmit()
        await client.stall(stall_ms)
        return
    if kind == "data_before_headers":
        stream_id = quic.get_next_available_stream_id()
        # A DATA frame (type 0, length 3) where the request's HEADERS must come first.
        quic.send_stream_data(stream_id, b"\x00\x03abc", end_stream=True)
    elif kind in ("decoder_flood", "encoder_flood"):
        stream_id = client.h3._local_decoder_stream_id if kind == "decoder_flood" else client.h3._local_encoder_stream_id
        # Decoder: Insert Count Increment (0b00xxxxxx) for entries never inserted. Encoder: Insert With
        # Literal Name (0b01xxxxxx) into a dynamic table the server never allowed.
        instruction = b"\x01" if kind == "decoder_flood" else b"\x41a\x01b"
        # 4 MiB of them.
        chunk = instruction * (65536 // len(instruction))
        for _ in range(64):
            quic.send_stream_data(stream_id, chunk)
            client.transmit()
            await asyncio.sleep(0)
        await asyncio.sleep(1)
        # How much of it the server let come (its flow control credit on that stream).
        client.flood_allowed = quic._streams[stream_id].max_stream_data_remote
    elif kind == "over_stream_limit":
        # Past the limit the server granted: aioquic would hold the streams back, so it is told the limit
        # is larger than it is.
        quic._remote_max_streams_bidi = 1 << 20
        for _ in range(count):
            stream_id = quic.get_next_available_stream_id()
            client.h3.send_headers(
                stream_id,
                [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost"), (b":path", b"/")],
                end_stream=True,
            )
    elif kind == "huge_reserved_frame":
        # A reserved frame type (0x21, RFC 9114 §7.2.8) on the control stream announcing 2^40 bytes, then
        # `count` MiB of its payload: a server must skip it as it streams, not buffer it.
        stream_id = client.h3._local_control_stream_id
        quic.send_stream_data(stream_id, encode_varint(0x21) + encode_varint(1 << 40))
        await send_paced(client, stream_id, count)
        client.attack_sent = count << 20
        return
    elif kind == "huge_headers":
        # A request whose HEADERS frame announces 2^40 bytes, then 64 KiB of it: refused from the length.
        stream_id = quic.get_next_available_stream_id()
        client.h3._get_or_create_stream(stream_id)
        stream = Stream(stream_id, None, None)
        client.streams[stream_id] = stream
        quic.send_stream_data(stream_id, encode_varint(1) + encode_varint(1 << 40) + bytes(65536))
        client.transmit()
        try:
            await asyncio.wait_for(stream.done, timeout=count)
        except asyncio.TimeoutError:
            stream.finish("timed out")
        client.attack_result = stream.result()
        return
    else:
        raise SystemExit(f"unknown attack {kind}")
    client.transmit()
    try:
        await asyncio.wait_for(client.terminated.wait(), timeout=5)
    except asyncio.TimeoutError:
        pass


async def main():
    spec = json.loads(sys.argv[1])
    host, port = spec["addr"].rsplit(":", 1)
    port = int(port)
    timeout = spec.get("timeout", 30)
    tickets = {}

    def save_ticket(ticket):
        tickets["ticket"] = ticket

    out = {"results": [], "early_data_accepted": False, "session_resumed": False, "closed": None}
    if spec.get("zero_rtt"):
        async with connect(
            host,
            port,
            configuration=configuration(spec, tickets),
            create_protocol=Client,
            session_ticket_handler=save_ticket,
        ) as client:
            client.server_name = spec.get("server_name", "localhost")
            await run_requests(client, [{"path": spec.get("prime", "/")}], False, timeout)
            # The ticket comes after the handshake, usually with the first response.
            for _ in range(100):
                if "ticket" in tickets:
                    break
                await asyncio.sleep(0.01)
        if "ticket" not in tickets:
            raise SystemExit("no session ticket received")
    try:
        async with connect(
            host,
            port,
            configuration=configuration(spec, tickets),
            create_protocol=Client,
            session_ticket_handler=save_ticket,
            wait_connected=not spec.get("zero_rtt") and spec.get("attack") != "stall_handshake",
        ) as client:
            client.server_name = spec.get("server_name", "localhost")
            if spec.get("attack"):
                await attack(client, spec["attack"], spec.get("streams", 300), spec.get("stall_ms", 5000))
                out["attack_result"] = getattr(client, "attack_result", None)
                out["attack_sent"] = getattr(client, "attack_sent", None)
            if spec.get("attack") and client.closed is None and spec.get("requests"):
                # The same connection, after the attack.
                out["results"] = await run_requests(client, spec["requests"], False, timeout)
            elif not spec.get("attack"):
                out["results"] = await run_requests(
                    client,
                    spec.get("requests", []),
                    spec.get("parallel"),
                    timeout,
                    spec.get("hold_ms", 0),
                    spec.get("stall_ms", 5000),
                )
            tls = client._quic.tls
            out["early_data_accepted"] = bool(tls.early_data_accepted)
            out["session_resumed"] = bool(tls.session_resumed)
            out["closed"] = client.closed
            out["flood_allowed"] = getattr(client, "flood_allowed", None)
    except ConnectionError:
        # Closed before the handshake completed (refused).
        out["closed"] = Client.last.closed
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
