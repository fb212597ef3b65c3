"""A request waiting in the queue is cancelled by disconnecting (tests/serve.rs, --max-queue 1).

usage: python queue_cancel.py HOST PORT
A streams a long generation and holds the engine; B (not streaming) waits in the queue, the one
place there is; B's client closes its socket. Then the place must be free again (C is admitted,
not refused with 503), B must never run (the finished-request counters count A and C only), and
C must run as soon as A's client leaves. Prints one JSON line; exits non-zero on a failed check.
"""
import http.client
import json
import socket
import sys
import threading
import time

host, port = sys.argv[1], int(sys.argv[2])


def metrics():
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        vals[name] = float(value)
    return vals


def wait_for(what, check, seconds=20):
    end = time.time() + seconds
    while time.time() < end:
        m = metrics()
        if check(m):
            return m
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}: {metrics()}")


def body(text, max_tokens, stream, **extra):
    b = {"messages": [{"role": "user", "content": text}], "stream": stream, **extra}
    if max_tokens is not None:
        b["max_tokens"] = max_tokens
    return json.dumps(b)


# A: holds the engine, streaming, until we close it (past EOS, up to the whole context).
a = http.client.HTTPConnection(host, port, timeout=60)
a.request("POST", "/v1/chat/completions", body("Count to a thousand.", None, True, ignore_eos=True),
          {"Content-Type": "application/json"})
ra = a.getresponse()
assert ra.status == 200, ra.status
ra.readline()  # the first frame: A is running
leave_a = threading.Event()
a_frames = [0]


def read_a():
    # A reads as a streaming client does (a client that stops reading lets the kernel's socket
    # buffers take the frames, and the engine runs ahead of it), until told to leave.
    while not leave_a.is_set():
        if not ra.readline():
            return
        a_frames[0] += 1
    a.sock.shutdown(socket.SHUT_RDWR)
    a.sock.close()


reader = threading.Thread(target=read_a)
reader.start()
wait_for("A running", lambda m: m.get("deltascope_num_requests_running") == 1)

# B: waits in the queue's one place, then its client goes away.
b = socket.create_connection((host, port))
payload = body("What is 2 + 2?", 16, False).encode()
b.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
wait_for("B waiting", lambda m: m.get("deltascope_num_requests_waiting") == 1)
# While B waits the queue is full: another request is refused.
full = http.client.HTTPConnection(host, port, timeout=30)
full.request("POST", "/v1/chat/completions", body("hi", 4, False), {"Content-Type": "application/json"})
refused = full.getresponse()
refused.read()
assert refused.status == 503, f"a full queue must refuse, got {refused.status}"
b.close()
t_closed = time.time()
m = wait_for("B to leave the queue", lambda m: m.get("deltascope_num_requests_waiting") == 0)
left_after = time.time() - t_closed

# C: admitted now (B's place is free), waits for A.
c = http.client.HTTPConnection(host, port, timeout=120)
c.request("POST", "/v1/chat/completions", body("What is 3 + 4?", 16, False), {"Content-Type": "application/json"})
wait_for("C waiting", lambda m: m.get("deltascope_num_requests_waiting") == 1)
leave_a.set()
reader.join()
rc = c.getresponse()
assert rc.status == 200, f"C was refused or failed: {rc.status} {rc.read()}"
done = json.loads(rc.read())
assert done["choices"][0]["finish_reason"] in ("stop", "length"), done

m = wait_for("the counters", lambda m: m.get("deltascope_num_requests_running") == 0)
finished = {k: v for k, v in m.items() if k.startswith("deltascope_request_success_total")}
total = sum(finished.values())
assert total == 2, f"A and C finished, B never ran; the counters say {finished}"
assert m.get('deltascope_request_success_total{finished_reason="abort"}') == 1, finished
# A's tokens count although A was cut short (counted as made, as vLLM does).
assert m.get("deltascope_generation_tokens_total", 0) > 16, m.get("deltascope_generation_tokens_total")
assert m.get("deltascope_requests_rejected_total") == 1, m.get("deltascope_requests_rejected_total")
# B is counted as a request whose client left the queue (and only B).
assert m.get("deltascope_requests_left_queue_total") == 1, m.get("deltascope_requests_left_queue_total")
print(json.dumps({"b_left_queue_s": round(left_after, 3), "finished": finished, "a_frames": a_frames[0],
                  "generated": m.get("deltascope_generation_tokens_total"), "c": done["choices"][0]["finish_reason"]}))
