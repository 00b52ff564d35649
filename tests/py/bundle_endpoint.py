#!/usr/bin/env python3
"""An independent SPIFFE bundle endpoint, in the standard library only (http.server and ssl),
for the federation end-to-end tests: Signet fetches a foreign trust domain's bundle from it.

    bundle_endpoint.py --cert C --key K --port-file F --doc-dir D

Serves HTTPS (ALPN http/1.1) on 127.0.0.1, on a port the system chooses, with the certificate
chain in PEM file C (leaf first) and its private key in PEM file K. Once listening it writes the
port number to F (written beside it and renamed, so a reader never sees half of it).

`GET /` answers 200 with the bytes of D/current.json as they are at that request (the file is
re-read every time, so a test swaps documents by renaming a new file over it), with
Content-Type application/json; 404 when the file is absent; any other path is 404 too. The
script writes the documents neither itself nor checks them: the Rust tests do.

It prints nothing to stdout; a failed request or handshake is one line on stderr. SIGTERM (or
SIGINT) stops it with exit status 0.
"""

import argparse
import http.server
import os
import signal
import ssl
import sys

# A client that connects and says nothing is dropped after this many seconds.
_IO_TIMEOUT = 10


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cert", required=True, help="PEM certificate chain, leaf first")
    p.add_argument("--key", required=True, help="PEM private key of the leaf")
    p.add_argument("--port-file", required=True, help="where the chosen port is written")
    p.add_argument("--doc-dir", required=True, help="directory holding current.json")
    return p.parse_args(argv)


def _handler(doc_dir):
    document = os.path.join(doc_dir, "current.json")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "bundle-endpoint"
        sys_version = ""
        timeout = _IO_TIMEOUT

        def setup(self):
            # The TLS handshake runs here, on the request's own thread, not in accept().
            self.request.settimeout(_IO_TIMEOUT)
            self.request.do_handshake()
            super().setup()

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path != "/":
                self._send(404, b"not found\n", "text/plain")
                return
            try:
                with open(document, "rb") as f:
                    body = f.read()
            except FileNotFoundError:
                self._send(404, b"no current.json\n", "text/plain")
                return
            self._send(200, body, "application/json")

        def _send(self, status, body, content_type):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        print(f"bundle_endpoint: {client_address[0]}:{client_address[1]}: {err!r}",
              file=sys.stderr, flush=True)


def _write_port(path, port):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def main(argv):
    args = _parse_args(argv)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(args.cert, args.key)
    ctx.set_alpn_protocols(["http/1.1"])

    server = _Server(("127.0.0.1", 0), _handler(args.doc_dir), bind_and_activate=True)
    server.socket = ctx.wrap_socket(server.socket, server_side=True,
                                    do_handshake_on_connect=False)

    def stop(_signum, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _write_port(args.port_file, server.server_address[1])
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ssl.SSLError) as e:
        print(f"bundle_endpoint: {e}", file=sys.stderr)
        sys.exit(1)
