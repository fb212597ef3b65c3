"""Slow and idle clients are cut off (tests/serve.rs runs the server with --timeout 1).

usage: python slow_client.py HOST PORT
A client that sends half a request head and stops, and one that stays connected idle after a
request (keep-alive), must both see the server close the connection within a few timeouts;
a body that stops half-way gets 408; the server still answers afterwards. Prints one JSON line.
"""
import json
import socket
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])


def closed_after(sock, seconds=10):
    """Seconds until the server closes the connection (reads to EOF), or None."""
    sock.settimeout(seconds)
    start = time.time()
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return round(time.time() - start, 2), data
            data += chunk
    except (socket.timeout, TimeoutError):
        return None, data
    except ConnectionResetError:
        return round(time.time() - start, 2), data


half = socket.create_connection((host, port))
half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
half_closed, _ = closed_after(half)
assert half_closed is not None, "a half-sent request head held its connection"

idle = socket.create_connection((host, port))
idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
idle_closed, answer = closed_after(idle)
assert answer.startswith(b"HTTP/1.1 200"), answer
assert idle_closed is not None, "an idle keep-alive connection was held"

body = socket.create_connection((host, port))
body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{\"messages\": [")
_, answer = closed_after(body)
status = answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/1.1") else answer.decode(errors="replace")
assert status == "408", answer

ok = socket.create_connection((host, port))
ok.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
_, answer = closed_after(ok)
assert answer.startswith(b"HTTP/1.1 200"), answer
print(json.dumps({"half_head_closed_s": half_closed, "idle_closed_s": idle_closed, "stalled_body": status}))
