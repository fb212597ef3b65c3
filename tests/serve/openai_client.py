"""The official openai client against `deltascope serve` (tests/serve.rs runs it).

usage: python openai_client.py BASE_URL   (BASE_URL ends in /v1)
Prints one JSON line of what it saw; exits non-zero on the first failed check.
"""
import json
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0, timeout=120)
Q = [{"role": "user", "content": "Is 91 prime?"}]
out = {}


def check(cond, what):
    if not cond:
        print(json.dumps({"failed": what, "seen": out}, default=str))
        sys.exit(1)


# /v1/models
models = client.models.list()
out["models"] = [m.id for m in models.data]
check(len(out["models"]) == 1, "one model listed")
model = out["models"][0]

# Streaming, with usage: reasoning and answer in separate fields, one frame per token.
thinking, answer, frames, usage, ext, finish = "", "", 0, None, None, None
for chunk in client.chat.completions.create(model=model, messages=Q, max_tokens=600, stream=True,
                                            stream_options={"include_usage": True}):
    extra = chunk.model_extra or {}
    if chunk.usage is not None:
        usage, ext = chunk.usage, extra.get("deltascope")
    for c in chunk.choices:
        d = c.delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            thinking += r
            frames += 1
        if d.content:
            answer += d.content
            frames += 1
        if c.finish_reason:
            finish = c.finish_reason
out["stream"] = {"thinking": thinking, "answer": answer, "frames": frames, "finish": finish}
check(thinking and answer, "stream: both reasoning_content and content")
check("</think>" not in thinking + answer, "stream: no </think> tag in either field")
check(finish == "stop", "stream: finish_reason stop")
check(usage is not None and usage.completion_tokens_details.reasoning_tokens > 0, "stream: usage with reasoning tokens")
check(usage.completion_tokens == ext["thinking_tokens"] + ext["answer_tokens"], "stream: usage adds up")
check(frames >= usage.completion_tokens - 4, "stream: about one frame per token")
check(ext["finish_reason"] == "stop" and "timing" in ext and "diagnostics" in ext, "stream: the deltascope extension")

# Not streaming: the same greedy text; logprobs with token ids.
r = client.chat.completions.create(model=model, messages=Q, max_tokens=600, logprobs=True, top_logprobs=3)
msg = r.choices[0].message
reasoning = (msg.model_extra or {}).get("reasoning_content")
out["whole"] = {"thinking": reasoning, "answer": msg.content}
check(msg.content.strip() == answer.strip() and reasoning.strip() == thinking.strip(), "non-stream equals stream (greedy)")
check(r.usage.completion_tokens_details.reasoning_tokens == usage.completion_tokens_details.reasoning_tokens, "same reasoning tokens")
lp = r.choices[0].logprobs.content
check(len(lp) >= r.usage.completion_tokens - 2, "a logprob per token")
check(all(len(t.top_logprobs) == 3 for t in lp), "top_logprobs 3 each")
check(all(isinstance((t.model_extra or {}).get("token_id"), int) for t in lp), "token ids with the logprobs")
check(all(t.logprob <= 0.0 for t in lp), "logprobs are log-probabilities")
ext2 = (r.model_extra or {}).get("deltascope")
check(ext2 and ext2["answer_tokens"] > 0, "non-stream extension")

# A thinking budget under vLLM's name: the engine forces the end of thinking.
r = client.chat.completions.create(model=model, messages=Q, max_tokens=300, extra_body={"thinking_token_budget": 12})
ext3 = r.model_extra["deltascope"]
out["budget"] = {"forced": ext3["forced_tokens"], "diagnostics": [d["kind"] for d in ext3["diagnostics"]]}
check(ext3["forced_tokens"] > 0 and "thinking_budget_forced" in out["budget"]["diagnostics"], "thinking budget forced")
check(r.usage.completion_tokens_details.reasoning_tokens <= 12 + ext3["forced_tokens"], "thinking stayed within the budget")

# enable_thinking off: no reasoning at all.
r = client.chat.completions.create(model=model, messages=Q, max_tokens=200,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
check(not (r.choices[0].message.model_extra or {}).get("reasoning_content") and r.choices[0].message.content, "thinking off")

# /v1/completions: raw text.
c = client.completions.create(model=model, prompt="Sort", max_tokens=8)
out["completion"] = {"text": c.choices[0].text, "finish": c.choices[0].finish_reason}
check(c.choices[0].text and c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 8, "completions")

# Errors the client raises, with the field named.
for kwargs, param in [({"n": 2}, "n"), ({"temperature": "hot"}, "temperature"), ({"max_tokens": 10 ** 9}, "max_tokens")]:
    try:
        client.chat.completions.create(model=model, messages=Q, **kwargs)
        check(False, f"{param}: no error")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == param, f"{param}: 400 naming it ({e.body})")
try:
    client.chat.completions.create(model="no-such-model", messages=Q, max_tokens=4)
    check(False, "unknown model accepted")
except openai.NotFoundError as e:
    check(e.body.get("code") == "model_not_found", "unknown model: 404 model_not_found")

print(json.dumps({"ok": True, **out}))
