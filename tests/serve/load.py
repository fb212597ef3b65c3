"""A bounded load test of `deltascope serve` (tests/serve.rs runs it against --max-queue 8).

usage: python load.py HOST PORT CLIENTS
Every CLIENTS-th client in four disconnects after a few frames. Every request must end as
completed (saw data: [DONE]), disconnected (by us), or rejected (503 with Retry-After); none
may hang. Then the server must still answer, and /metrics must add up to what we saw.
Prints one JSON line; exits non-zero on a failed check.
"""
import http.client
import json
import sys
import threading
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
results = [None] * n


def client(i):
    body = json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 7?"}], "max_tokens": 48,
                       "stream": True, "stream_options": {"include_usage": True}})
    try:
        c = http.client.HTTPConnection(host, port, timeout=300)
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status == 503:
            results[i] = ("rejected", r.getheader("Retry-After"), json.loads(r.read()))
            return
        if r.status != 200:
            results[i] = ("status", r.status, r.read().decode())
            return
        frames = 0
        usage = None
        for line in r:
            line = line.strip()
            if not line:
                continue
            frames += 1
            if i % 4 == 3 and frames == 3:
                c.sock.close()
                results[i] = ("disconnected", frames)
                return
            if line == b"data: [DONE]":
                results[i] = ("completed", frames, usage)
                return
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        results[i] = ("truncated", frames)
    except Exception as e:  # noqa: BLE001 - reported, never swallowed
        results[i] = ("exception", repr(e))


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


base = metrics()
threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
start = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=600)
hung = sum(t.is_alive() for t in threads)
kinds = {}
for r in results:
    k = r[0] if r else "hung"
    kinds[k] = kinds.get(k, 0) + 1


def fail(what):
    print(json.dumps({"failed": what, "kinds": kinds, "results": results}, default=str))
    sys.exit(1)


if hung:
    fail(f"{hung} clients hung")
bad = [r for r in results if r[0] not in ("completed", "disconnected", "rejected")]
if bad:
    fail(f"unexpected outcomes: {bad}")
if any(r[0] == "rejected" and (r[1] is None or r[2]["error"]["code"] != "queue_full") for r in results):
    fail("a 503 without Retry-After or the queue_full code")


# The server notices a disconnect at its next frame: wait for the counters to settle.
want_done = kinds.get("completed", 0) + kinds.get("disconnected", 0)
for _ in range(100):
    now = metrics()
    m = {k: v - base.get(k, 0) if k.endswith("_total") or "_total{" in k else v for k, v in now.items()}
    finished = sum(v for k, v in m.items() if k.startswith("deltascope_request_success_total"))
    if finished >= want_done and m.get("deltascope_num_requests_running", 1) == 0:
        break
    time.sleep(0.1)
stop = m.get('deltascope_request_success_total{finished_reason="stop"}', 0) + m.get(
    'deltascope_request_success_total{finished_reason="length"}', 0)
abort = m.get('deltascope_request_success_total{finished_reason="abort"}', 0)
if stop != kinds.get("completed", 0):
    fail(f"metrics: {stop} finished stop/length, clients saw {kinds.get('completed', 0)} complete")
if abort != kinds.get("disconnected", 0):
    fail(f"metrics: {abort} aborted, clients disconnected {kinds.get('disconnected', 0)}")
if m.get("deltascope_requests_rejected_total", 0) != kinds.get("rejected", 0):
    fail("metrics: rejected count")
# Tokens are counted as made: the completed requests' usage, plus what the cut-short ones made.
done_usage = [r[2] for r in results if r[0] == "completed"]
if any(u is None for u in done_usage):
    fail("a completed stream without its usage frame")
for field, name in (("completion_tokens", "generation_tokens"), ("prompt_tokens", "prompt_tokens")):
    seen = sum(u[field] for u in done_usage)
    counted = m.get(f"deltascope_{name}_total", 0)
    if counted < seen or (kinds.get("disconnected", 0) == 0 and counted != seen):
        fail(f"metrics: {name} {counted}, the completed clients' usage says {seen}")
if m.get("deltascope_num_requests_waiting") != 0:
    fail("metrics: requests still waiting")
c = http.client.HTTPConnection(host, port, timeout=30)
c.request("GET", "/health")
if c.getresponse().status != 200:
    fail("the server stopped answering")
print(json.dumps({"ok": True, "kinds": kinds, "seconds": round(time.time() - start, 1),
                  "generation_tokens": m.get("deltascope_generation_tokens_total")}))
