#!/usr/bin/python3
"""A mesh tunnel client built from other implementations than ours: Python's ssl module (OpenSSL)
for mutual TLS and the `h2` package for HTTP/2.

    hbone_peer.py HOST:PORT CERT KEY CA TARGET FORWARDED LINE

Opens TLS 1.3 with the client certificate CERT/KEY, ALPN h2, no SNI, the server's certificate
verified against CA (no host name: a workload certificate names a SPIFFE ID), sends
`CONNECT TARGET` with `Forwarded: for="FORWARDED"`, and on 200 sends LINE and reads until two
lines came back. Prints one JSON object: status, the server's URI SANs, the bytes received.
"""
import json
import socket
import ssl
import sys

import h2.config
import h2.connection
import h2.events

addr, cert, key, ca, target, forwarded, line = sys.argv[1:8]
host, port = addr.rsplit(":", 1)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_REQUIRED
ctx.load_verify_locations(ca)
ctx.load_cert_chain(cert, key)
ctx.set_alpn_protocols(["h2"])
s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10))
out = {"alpn": s.selected_alpn_protocol()}
out["server_uris"] = [v for k, v in s.getpeercert().get("subjectAltName", ()) if k == "URI"]
# h2 4.1 checks its own requests for :path and :scheme, which a CONNECT has not (RFC 9113 8.5):
# that check alone is off.
conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8", validate_outbound_headers=False))
conn.initiate_connection()
sid = conn.get_next_available_stream_id()
conn.send_headers(sid, [(":method", "CONNECT"), (":authority", target), ("forwarded", f'for="{forwarded}"')])
s.sendall(conn.data_to_send())
status, data = None, b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    for ev in conn.receive_data(chunk):
        if isinstance(ev, h2.events.ResponseReceived):
            status = int(dict(ev.headers)[":status"])
            if status == 200:
                conn.send_data(sid, (line + "\n").encode())
        elif isinstance(ev, h2.events.DataReceived):
            data += ev.data
            conn.acknowledge_received_data(ev.flow_controlled_length, sid)
    s.sendall(conn.data_to_send())
    if (status is not None and status != 200) or data.count(b"\n") >= 2:
        break
out["status"] = status
out["data"] = data.decode(errors="replace")
print(json.dumps(out))
