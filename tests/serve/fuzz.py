"""Malformed bodies against `deltascope serve`: every answer must be a 4xx with an OpenAI error
body, and the server must keep answering (tests/serve.rs runs it).

usage: python fuzz.py HOST PORT COUNT
"""
import http.client
import json
import random
import sys

host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
values = [None, True, -1, 0, 1e308, -1e308, 10 ** 30, "x", "", [], {}, [1, "a"], {"a": {"b": []}}, "\u0000", 3.5]
fields = ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
          "stop", "logprobs", "top_logprobs", "stream", "stream_options", "n", "tools", "response_format",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "thinking_budget", "chat_template_kwargs",
          "reasoning_budget_message", "model", "prompt"]


def bodies():
    yield b""
    yield b"{"
    yield b"null"
    yield b"[]"
    yield b"\xff\xfe{}"
    yield b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'
    yield ("[" * 5000 + "]" * 5000).encode()
    yield json.dumps({"messages": [{"role": "user", "content": {"deep": [[[[[[[[[[[[]]]]]]]]]]]]}}]}).encode()
    yield json.dumps({"messages": [{"role": "user"}] * 3, "max_tokens": 0}).encode()
    while True:
        b = json.loads(json.dumps(good))
        for _ in range(rng.randint(1, 3)):
            f = rng.choice(fields)
            b[f] = rng.choice(values)
        if rng.random() < 0.3:
            b["messages"] = [{"role": rng.choice(["user", "tool", 5, None]), "content": rng.choice(values)}]
        # A few bodies are valid by chance: those are checked apart (they must be 200).
        yield json.dumps(b).encode()


statuses = {}
for i, body in zip(range(count), bodies()):
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    c = http.client.HTTPConnection(host, port, timeout=120)
    c.request("POST", path, body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    statuses[r.status] = statuses.get(r.status, 0) + 1
    if r.status == 200:
        continue  # a valid body by chance (streamed or not): answered normally
    if not 400 <= r.status < 500:
        print(json.dumps({"failed": f"status {r.status}", "body": body[:300].decode("utf-8", "replace"),
                          "answer": data[:300].decode("utf-8", "replace")}))
        sys.exit(1)
    err = json.loads(data).get("error", {})
    if not err.get("message") or "type" not in err:
        print(json.dumps({"failed": "not an OpenAI error body", "answer": data[:300].decode()}))
        sys.exit(1)
c = http.client.HTTPConnection(host, port, timeout=30)
c.request("GET", "/health")
ok = c.getresponse().status == 200
print(json.dumps({"ok": ok, "statuses": statuses}))
sys.exit(0 if ok and sum(v for k, v in statuses.items() if k >= 400) >= count // 2 else 1)
