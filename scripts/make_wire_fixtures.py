#!/usr/bin/env python3
"""Builds tests/fixtures/wire/{sglang,vllm,faults} from the llama.cpp recordings in /work/shared/wire."""
import json, os, random, shutil

SRC = os.environ.get("SHARED_WIRE", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "wire"))
DST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "wire")

def dumps(o):
    return json.dumps(o, separators=(",", ":"), ensure_ascii=False)

def frames(path):
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("data: ") and line[6:] != "[DONE]":
            out.append(json.loads(line[6:]))
    return out

# ---- the demo model's answer to "Is 91 prime?" (llama.cpp b10434, temperature 0) ----
R, C, RID, CID = [], [], [], []
for j in frames(f"{SRC}/llamacpp-b10434-chat-stream-reasoning.sse"):
    for ch in j["choices"]:
        d = ch["delta"]
        lp = ch.get("logprobs")
        if d.get("reasoning_content") is not None:
            R.append(d["reasoning_content"]); RID.append(lp["content"][0]["id"])
        if d.get("content") is not None:
            C.append(d["content"]); CID.append(lp["content"][0]["id"])
assert len(R) == 70 and len(C) == 21
THINK_END, NEWLINES, IM_END = 505, 256, 482
# (text, kind, id): kind r = reasoning, c = content, h = hidden (no text on the wire)
TOKENS = [(t, "r", i) for t, i in zip(R, RID)] + [("", "h", THINK_END), ("", "h", NEWLINES)] \
    + [(t, "c", i) for t, i in zip(C, CID)] + [("", "h", IM_END)]
assert len(TOKENS) == 94
OUTPUT_IDS = [t[2] for t in TOKENS]
PROMPT, COMPLETION = 16, 94
BOUNDARY = 69  # index of ".\n", the last reasoning token

def steps_from(hist, total, seed, need):
    """Sizes of output steps: the prefill token, then one verify step per histogram entry
    (hist[k] steps accepted k drafts, so emitted k+1 tokens), shuffled until need(bounds) holds."""
    sizes = [k + 1 for k, n in enumerate(hist) for _ in range(n)]
    assert 1 + sum(sizes) == total, (sizes, total)
    rng = random.Random(seed)
    for _ in range(200000):
        rng.shuffle(sizes)
        seq = [1] + sizes
        starts, pos = [], 0
        for s in seq:
            starts.append(pos); pos += s
        if need(seq, starts):
            return seq
    raise SystemExit("no arrangement")

def split(seq, tokens):
    out, pos = [], 0
    for s in seq:
        out.append(tokens[pos:pos + s]); pos += s
    assert pos == len(tokens)
    return out

def has_step(seq, starts, start, size):
    return any(st == start and sz == size for st, sz in zip(starts, seq))

def write(rel, data):
    path = os.path.join(DST, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)

# ================================ SGLang 0.5.23 ================================
SG_ID = "chatcmpl-5f0c3a9e2b7d4e61a8c9d0e1f2a3b4c5"
SG_MODEL = "demo"
SG_CREATED = 1796104521

def sg_chunk(created, delta, finish=None, matched=None, rid=SG_ID):
    # msgspec fast path (sse_utils.build_sse_content): null delta keys omitted, choice keys always present
    return "data: " + dumps({"id": rid, "object": "chat.completion.chunk", "created": created, "model": SG_MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": matched}]}) + "\n\n"

def sg_pyd(created, obj, rid=SG_ID):
    # pydantic model_dump_json of ChatCompletionStreamResponse: usage printed (null), sglext popped when None
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": SG_MODEL}
    base.update(obj)
    return base

def sg_usage(prompt, completion, reasoning):
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": reasoning}

SG_HIST = [5, 8, 12, 9]             # verify steps that accepted 0,1,2,3 drafts
SG_VERIFY = sum(SG_HIST)            # 34
SG_CORRECT = sum(k * n for k, n in enumerate(SG_HIST))  # 59
assert SG_VERIFY == 34 and SG_CORRECT == 59 and 1 + SG_VERIFY + SG_CORRECT == COMPLETION
SG_DRAFT_TOKENS = 4                 # --speculative-num-draft-tokens (steps 3 + 1)
SG_PROPOSED = SG_VERIFY * (SG_DRAFT_TOKENS - 1)         # 102
SG_REASONING_TOKENS = 71            # 70 visible thinking tokens + </think>

sg_seq = steps_from(SG_HIST, COMPLETION, 7,
                    lambda seq, st: has_step(seq, st, BOUNDARY, 4) and seq[-1] >= 2)
sg_steps = split(sg_seq, TOKENS)

def sg_token_frames(steps, created_of, pydantic=False, continuous=False):
    out, done = [], 0
    for step in steps:
        done += len(step)
        created = created_of(done)
        r = "".join(t for t, k, _ in step if k == "r")
        c = "".join(t for t, k, _ in step if k == "c")
        reasoning_so_far = min(done, SG_REASONING_TOKENS)
        for kind, text in (("r", r), ("c", c)):
            if not text:
                continue
            if pydantic:
                delta = {"role": None, "content": text if kind == "c" else None,
                         "reasoning_content": text if kind == "r" else None, "tool_calls": None}
                usage = sg_usage(PROMPT, done, reasoning_so_far) if continuous else None
                out.append("data: " + dumps(sg_pyd(created, {"choices": [{"index": 0, "delta": delta, "logprobs": None,
                    "finish_reason": None, "matched_stop": None}], "usage": usage})) + "\n\n")
            else:
                out.append(sg_chunk(created, {"reasoning_content": text} if kind == "r" else {"content": text}))
    return out

created_of = lambda done: SG_CREATED + done // 48
spec = {
    "spec_accept_rate": SG_CORRECT / SG_PROPOSED,
    "spec_accept_length": COMPLETION / SG_VERIFY,
    "spec_cap_length": 0.0,
    "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": SG_CORRECT,
    "spec_num_proposed_drafts": SG_PROPOSED,
    "spec_verify_ct": SG_VERIFY,
    "spec_correct_drafts_histogram": SG_HIST,
    "spec_cap_lens_histogram": [],
}
end = created_of(COMPLETION)
sse = [sg_chunk(SG_CREATED, {"role": "assistant", "content": ""})]
sse += sg_token_frames(sg_steps, created_of)
sse.append(sg_chunk(end, {}, "stop", IM_END))
sse.append("data: " + dumps(sg_pyd(end, {"choices": [], "usage": None, "sglext": {"spec_tokens_details": spec}})) + "\n\n")
sse.append("event: sglext_ids\ndata: " + dumps(sg_pyd(end, {"choices": [], "usage": None, "sglext": {"output_ids": [OUTPUT_IDS]}})) + "\n\n")
sse.append("data: " + dumps(sg_pyd(end, {"choices": [], "usage": sg_usage(PROMPT, COMPLETION, SG_REASONING_TOKENS)})) + "\n\n")
sse.append("data: [DONE]\n\n")
write("sglang/chat-stream-reasoning.sse", "".join(sse))

# older pydantic path with continuous_usage_stats: every key printed, usage on every token frame
SG_ID2 = "chatcmpl-0b9e7d2c4a6f48e1b3d5c7e9f1a2b4c6"
sse = ["data: " + dumps(sg_pyd(SG_CREATED, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "",
       "reasoning_content": None, "tool_calls": None}, "logprobs": None, "finish_reason": None, "matched_stop": None}],
       "usage": sg_usage(PROMPT, 0, 0)}, SG_ID2)) + "\n\n"]
sse += [f.replace(SG_ID, SG_ID2) for f in sg_token_frames(sg_steps, created_of, pydantic=True, continuous=True)]
sse.append("data: " + dumps(sg_pyd(end, {"choices": [{"index": 0, "delta": {"role": None, "content": None,
       "reasoning_content": None, "tool_calls": None}, "logprobs": None, "finish_reason": "stop", "matched_stop": IM_END}],
       "usage": None}, SG_ID2)) + "\n\n")
sse.append("data: " + dumps(sg_pyd(end, {"choices": [], "usage": sg_usage(PROMPT, COMPLETION, SG_REASONING_TOKENS)}, SG_ID2)) + "\n\n")
sse.append("data: [DONE]\n\n")
write("sglang/chat-stream-reasoning-pydantic.sse", "".join(sse))

# max_tokens 12: cut inside thinking
SG_ID3 = "chatcmpl-7a1d3f5b9c2e4d6f8a0b2c4d6e8f0a1b"
length_steps = split([1, 3, 2, 4, 2], TOKENS[:12])
sse = [sg_chunk(SG_CREATED, {"role": "assistant", "content": ""}, rid=SG_ID3)]
sse += [f.replace(SG_ID, SG_ID3) for f in sg_token_frames(length_steps, lambda d: SG_CREATED)]
sse.append(sg_chunk(SG_CREATED, {}, "length", None, rid=SG_ID3))
sse.append("data: " + dumps(sg_pyd(SG_CREATED, {"choices": [], "usage": sg_usage(PROMPT, 12, 12)}, SG_ID3)) + "\n\n")
sse.append("data: [DONE]\n\n")
write("sglang/chat-stream-length.sse", "".join(sse))

# an abort with an HTTP status mid-thinking: the error frame (json.dumps, default separators)
SG_ID4 = "chatcmpl-3c5e7a9b1d2f4a6c8e0b1d3f5a7c9e2d"
err_steps = split([1, 2, 3, 2], TOKENS[:8])
sse = [sg_chunk(SG_CREATED, {"role": "assistant", "content": ""}, rid=SG_ID4)]
sse += [f.replace(SG_ID, SG_ID4) for f in sg_token_frames(err_steps, lambda d: SG_CREATED)]
error = {"error": {"object": "error", "message": "The request was aborted: the KV cache pool ran out of memory.",
                   "type": "SERVICE_UNAVAILABLE", "param": None, "code": 503}}
sse.append("data: " + json.dumps(error) + "\n\n")
sse.append("data: " + dumps(sg_pyd(SG_CREATED, {"choices": [], "usage": sg_usage(PROMPT, 8, 8)}, SG_ID4)) + "\n\n")
sse.append("data: [DONE]\n\n")
write("sglang/chat-stream-error.sse", "".join(sse))

SG_AVG_BEFORE, SG_AVG_AFTER = 2.8103, 2.8061
server_info = {
    "model_path": "/models/demo",
    "tokenizer_path": "/models/demo",
    "served_model_name": "demo",
    "host": "127.0.0.1",
    "port": 30000,
    "dtype": "bfloat16",
    "context_length": 4096,
    "mem_fraction_static": 0.85,
    "max_running_requests": 48,
    "chunked_prefill_size": 8192,
    "page_size": 1,
    "tp_size": 1,
    "stream_interval": 1,
    "reasoning_parser": "qwen3",
    "tool_call_parser": "qwen3_coder",
    "enable_strict_thinking": True,
    "enable_metrics": True,
    "speculative_algorithm": "EAGLE",
    "speculative_draft_model_path": None,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "mamba_scheduler_strategy": "extra_buffer",
    "max_total_num_tokens": 262144,
    "max_req_input_len": 4090,
    "internal_states": [{
        "avg_spec_accept_length": SG_AVG_AFTER,
        "last_gen_throughput": 212.47,
        "memory_usage": {"weight": 0.03, "kvcache": 1.5, "token_capacity": 262144, "graph": 0.41},
        "effective_max_running_requests_per_dp": 48,
    }],
    "version": "0.5.23",
}
write("sglang/server_info.json", dumps(server_info))
write("sglang/models.json", dumps({"object": "list", "data": [{"id": "demo", "object": "model", "created": 1796104400,
      "owned_by": "sglang", "root": "/models/demo", "parent": None, "max_model_len": 4096}]}))

def go_float(v):
    """prometheus_client.utils.floatToGoString."""
    s = repr(float(v))
    dot = s.find(".")
    if v > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s

def prom(families):
    out = []
    for name, kind, help_, samples in families:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n")
        for labels, value in samples:
            lab = ",".join(f'{k}="{v}"' for k, v in labels)
            out.append(f"{name}{{{lab}}} {go_float(value)}\n")
    return "".join(out)

def sg_metrics(after):
    m = [("model_name", "demo")]
    d = 1 if after else 0
    return prom([
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(m, 48213 + 16 * d)]),
        ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", [(m, 391877 + 94 * d)]),
        ("sglang:num_requests_total", "counter", "Number of requests processed.", [(m, 1207 + d)]),
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", [(m, 1.0 if after else 0.0)]),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [(m, 0.0)]),
        ("sglang:num_used_tokens", "gauge", "The number of used tokens.", [(m, 5242.0 if after else 0.0)]),
        ("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", [(m, 262144.0)]),
        ("sglang:token_usage", "gauge", "The token usage.", [(m, 0.02 if after else 0.0)]),
        ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", [(m, 0.4187 if after else 0.4189)]),
        ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", [(m, 212.47 if after else 0.0)]),
        ("sglang:spec_accept_length", "gauge",
         "The average acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
         [(m, COMPLETION / SG_VERIFY if after else 2.9038)]),
        ("sglang:spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding (accepted drafts / proposed drafts).",
         [(m, SG_CORRECT / SG_PROPOSED if after else 0.6346)]),
        ("sglang:spec_num_draft_tokens", "gauge", "The number of draft tokens per verify step.", [(m, 4.0)]),
        ("sglang:spec_verify_calls_total", "counter", "The number of speculative verify forward passes.", [(m, 139451 + SG_VERIFY * d)]),
    ])
write("sglang/metrics-before.txt", sg_metrics(False))
write("sglang/metrics-after.txt", sg_metrics(True))

# ================================ vLLM 0.32.0 ================================
VL_MODEL = "demo"
VL_CREATED = 1796104733

def vl_chunk(rid, delta, finish=None, stop_reason=False):
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if stop_reason is not False:
        choice["stop_reason"] = stop_reason
    return "data: " + dumps({"id": rid, "object": "chat.completion.chunk", "created": VL_CREATED,
                             "model": VL_MODEL, "choices": [choice]}) + "\n\n"

def vl_usage_chunk(rid, usage, metrics=None):
    o = {"id": rid, "object": "chat.completion.chunk", "created": VL_CREATED, "model": VL_MODEL, "choices": [], "usage": usage}
    if metrics is not None:
        o["metrics"] = metrics
    return "data: " + dumps(o) + "\n\n"

def vl_spec(hist, k):
    steps = sum(hist)
    acc = sum(j * n for j, n in enumerate(hist))
    return {"mean_acceptance_length": 1 + acc / steps, "draft_acceptance_rate": acc / (steps * k),
            "acceptance_histogram": hist, "num_spec_steps": steps, "num_accepted_draft_tokens": acc,
            "num_draft_tokens": steps * k, "num_spec_tokens": k}

def vl_frames(rid, steps, key, finish):
    """One frame per engine step (a step emits 1 + accepted tokens). The step with </think> carries
    both keys; the finishing step carries its text together with finish_reason."""
    out = []
    for n, step in enumerate(steps):
        last = n == len(steps) - 1
        r = "".join(t for t, k, _ in step if k == "r")
        c = "".join(t for t, k, _ in step if k == "c")
        delta = {}
        if c or (last and not r):
            delta["content"] = c
        if r:
            delta[key] = r
        if not delta and not last:
            continue
        out.append(vl_chunk(rid, delta, finish if last else None, None if last else False))
    return out

VL_HIST = [4, 11, 9, 10]
VL_K = 3
VL_POS = [sum(VL_HIST[j + 1:]) for j in range(VL_K)]  # accepted per draft position
assert VL_POS == [30, 19, 10] and sum(VL_POS) == 59
vl_seq = steps_from(VL_HIST, COMPLETION, 11,
                    lambda seq, st: has_step(seq, st, BOUNDARY, 4) and seq[-1] == 2)
vl_steps = split(vl_seq, TOKENS)
VL_ID = "chatcmpl-8d3e1f0a6b2c4d5e9f7a1b3c5d7e9f0a"
sse = [vl_chunk(VL_ID, {"role": "assistant", "content": ""})]
sse += vl_frames(VL_ID, vl_steps, "reasoning", "stop")
sse.append(vl_usage_chunk(VL_ID, {"prompt_tokens": PROMPT, "total_tokens": PROMPT + COMPLETION, "completion_tokens": COMPLETION,
           "completion_tokens_details": {"reasoning_tokens": 70}}, {"speculative_decoding": vl_spec(VL_HIST, VL_K)}))
sse.append("data: [DONE]\n\n")
write("vllm/chat-stream-reasoning.sse", "".join(sse))

# older vLLM: reasoning_content, no speculation (one frame per token), no reasoning_tokens in usage
VL_ID2 = "chatcmpl-2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c0e"
sse = [vl_chunk(VL_ID2, {"role": "assistant", "content": ""})]
sse += vl_frames(VL_ID2, [[t] for t in TOKENS], "reasoning_content", "stop")
sse.append(vl_usage_chunk(VL_ID2, {"prompt_tokens": PROMPT, "total_tokens": PROMPT + COMPLETION, "completion_tokens": COMPLETION}))
sse.append("data: [DONE]\n\n")
write("vllm/chat-stream-reasoning-content.sse", "".join(sse))

# max_tokens 12
VL_ID3 = "chatcmpl-6b8d0f2a4c6e8a0c2e4a6c8e0a2c4e6a"
len_seq = [1, 2, 4, 1, 2, 2]
len_hist = [0] * (VL_K + 1)
for s in len_seq[1:]:
    len_hist[s - 1] += 1
sse = [vl_chunk(VL_ID3, {"role": "assistant", "content": ""})]
sse += vl_frames(VL_ID3, split(len_seq, TOKENS[:12]), "reasoning", "length")
sse.append(vl_usage_chunk(VL_ID3, {"prompt_tokens": PROMPT, "total_tokens": PROMPT + 12, "completion_tokens": 12,
           "completion_tokens_details": {"reasoning_tokens": 12}}, {"speculative_decoding": vl_spec(len_hist, VL_K)}))
sse.append("data: [DONE]\n\n")
write("vllm/chat-stream-length.sse", "".join(sse))

write("vllm/version.json", dumps({"version": "0.32.0"}))
write("vllm/models.json", dumps({"object": "list", "data": [{"id": "demo", "object": "model", "created": 1796104700,
      "owned_by": "vllm", "root": "/models/demo", "parent": None, "max_model_len": 4096, "permission": [{
          "id": "modelperm-4e6a8c0e2b4d6f8a0c2e4a6b8d0f2a4c", "object": "model_permission", "created": 1796104700,
          "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
          "allow_view": True, "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}]}]}))

def vl_metrics(after):
    d = 1 if after else 0
    m = [("engine", "0"), ("model_name", "demo")]
    drafts, draft_tokens, accepted, per_pos = 2118, 6354, 3797, [1846, 1213, 738]
    assert sum(per_pos) == accepted and draft_tokens == drafts * VL_K
    return prom([
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [(m, 1.0 if after else 0.0)]),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(m, 0.0)]),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [(m, 0.0172 if after else 0.0)]),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(m, 9312 + PROMPT * d)]),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", [(m, 10451 + COMPLETION * d)]),
        ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
         [(m + [("finished_reason", "stop")], 97 + d), (m + [("finished_reason", "length")], 4),
          (m + [("finished_reason", "abort")], 1)]),
        ("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", [(m, drafts + sum(VL_HIST) * d)]),
        ("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", [(m, draft_tokens + sum(VL_HIST) * VL_K * d)]),
        ("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", [(m, accepted + sum(VL_POS) * d)]),
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.",
         [(m + [("position", str(i))], per_pos[i] + VL_POS[i] * d) for i in range(VL_K)]),
    ])
write("vllm/metrics-before.txt", vl_metrics(False))
write("vllm/metrics-after.txt", vl_metrics(True))

# ================================ llama.cpp: real recordings, copied ================================
for name in sorted(os.listdir(SRC)):
    p = os.path.join(SRC, name)
    if os.path.isfile(p):
        os.makedirs(f"{DST}/llamacpp", exist_ok=True)
        shutil.copyfile(p, f"{DST}/llamacpp/{name}")
os.makedirs(f"{DST}/llamacpp/requests", exist_ok=True)
for name in sorted(os.listdir(f"{SRC}/requests")):
    shutil.copyfile(f"{SRC}/requests/{name}", f"{DST}/llamacpp/requests/{name}")

# ================================ faults ================================
raw = open(f"{SRC}/llamacpp-b10434-chat-stream-reasoning.sse", "rb").read()
lc = [f + b"\n\n" for f in raw.split(b"\n\n") if f]
assert lc[-1] == b"data: [DONE]\n\n"
# malformed: role + 4 token frames, then frame 5 (" the") truncated inside its JSON but properly
# terminated, then 3 more good frames and [DONE]
bad = lc[5][: lc[5].index(b'"token":" the"') + 8] + b"\n\n"
write("faults/malformed.sse", b"".join(lc[:5]) + bad + b"".join(lc[6:9]) + lc[-1])
# cut: role + 14 token frames, then frame 15 (" \xc3\xb7") cut after the first byte of the UTF-8 "÷"
f15 = lc[15]
i = f15.index('"reasoning_content":" ÷'.encode()) + len('"reasoning_content":" '.encode()) + 1
write("faults/cut-mid-token.sse", b"".join(lc[:15]) + f15[:i])
shutil.copyfile(f"{SRC}/llamacpp-b10434-chat-nonstream.json", f"{DST}/faults/nonstream.json")
write("faults/401.json", '{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}')
write("faults/400.json", '{"error":{"code":400,"message":"request (5210 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5210,"n_ctx":4096}}')
write("faults/503.json", '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}')
write("faults/404-model.json", '{"error":{"message":"The model `qwen3.5-27b` does not exist.","type":"NotFoundError","param":"model","code":404}}')
write("faults/400-sglang.json", '{"object":"error","message":"The input (5210 tokens) is longer than the model\'s context length (4096 tokens).","type":"BadRequestError","param":null,"code":400}')
write("faults/html-page.html", """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Router Login</title>
<link rel="stylesheet" href="/css/login.css">
</head>
<body>
<div class="login-box">
  <h1>Welcome to your router</h1>
  <form method="post" action="/cgi-bin/login.cgi">
    <label for="user">User name</label>
    <input id="user" name="user" type="text" autocomplete="username">
    <label for="pass">Password</label>
    <input id="pass" name="pass" type="password" autocomplete="current-password">
    <button type="submit">Log in</button>
  </form>
  <p class="fw">Firmware 3.0.0.4.388_24231</p>
</div>
</body>
</html>
""")
print("sglang steps", sg_seq)
print("vllm steps", vl_seq)
