"""A hostile SDS client speaking raw HTTP/2 (no gRPC library, so it can send half a message):
STREAMS streams on one connection each send a valid first request, read the response, then
start a second gRPC message whose 5-byte prefix declares DECLARED bytes and send SEND bytes of
it, never finishing it. An agent that buffers such messages up to gRPC's 4 MiB default can be
made to hold gigabytes by one uid (fresh-eyes review of issue 27, finding 1); one that bounds
request messages ends each stream at once.

    sds_partial.py SOCKET STREAMS DECLARED SEND

Prints one JSON line: how many streams got their first response, and how many were ended by
the agent (trailers with END_STREAM, or RST_STREAM) within 10 s of the oversized prefix.
"""

import json
import socket
import struct
import sys
import time

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 1, 4, 1
PATH = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets"


def frame(kind, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload


def literal(name, value):
    """An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    name, value = name.encode(), value.encode()
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def headers():
    fields = [(":method", "POST"), (":scheme", "http"), (":path", PATH),
              (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
    return b"".join(literal(k, v) for k, v in fields)


def first_request():
    node = base_pb2.Node(id="attacker", cluster="attacker")
    node.user_agent_build_version.version.major_number = 1
    node.user_agent_build_version.version.minor_number = 30
    req = discovery_pb2.DiscoveryRequest(
        node=node, resource_names=["default"],
        type_url="type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret")
    body = req.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


class Frames:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def next(self, deadline):
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                chunk = self.sock.recv(65536)
            except (socket.timeout, OSError):
                return None
            if not chunk:
                return ("EOF", 0, 0, b"")
            self.buf += chunk
        n = int.from_bytes(self.buf[:3], "big")
        f = (self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF, self.buf[9:9 + n])
        self.buf = self.buf[9 + n:]
        return f


def read_until(s, frames, done, answered, ended, ids):
    """Reads frames for up to 10 s until done(): streams that got a DATA frame go to
    `answered`, streams the agent ended (trailers with END_STREAM, or RST_STREAM) to `ended`;
    SETTINGS and PING are acknowledged."""
    deadline = time.time() + 10
    while not done() and time.time() < deadline:
        f = frames.next(deadline)
        if f is None or f[0] == "EOF":
            return
        kind, flags, sid, payload = f
        if kind == SETTINGS and not flags & ACK:
            s.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            s.sendall(frame(PING, ACK, 0, payload))
        elif kind == DATA and sid in ids:
            answered.add(sid)
        elif (kind == HEADERS and flags & END_STREAM) or kind == RST:
            ended.add(sid)


def main():
    path, streams, declared, send = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    assert streams <= 16, "one connection's worth of streams"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    # A large receive window, so flow control never stops the agent's responses.
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 2**31 - 1))
              + frame(WINDOW, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
    frames = Frames(s)
    ids = [1 + 2 * i for i in range(streams)]
    for sid in ids:
        s.sendall(frame(HEADERS, END_HEADERS, sid, headers()) + frame(DATA, 0, sid, first_request()))
    answered, ended = set(), set()
    read_until(s, frames, lambda: len(answered) >= streams, answered, ended, ids)
    # The oversized, never finished second message: its prefix and SEND bytes, all streams
    # together within the agent's initial connection window (65,535 bytes), so that nothing
    # but the declared size can be why a stream ends.
    send = min(send, 60000 // streams)
    part = b"\x00" + struct.pack(">I", declared) + b"\x0a" + b"A" * max(0, send - 6)
    for sid in ids:
        if sid not in ended:
            s.sendall(frame(DATA, 0, sid, part))
    read_until(s, frames, lambda: len(ended) >= streams, answered, ended, ids)
    print(json.dumps({"streams": streams, "answered": len(answered), "ended": len(ended)}), flush=True)


if __name__ == "__main__":
    main()
