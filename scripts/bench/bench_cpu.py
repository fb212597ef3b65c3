#!/usr/bin/env python3
"""Interleaved CPU benchmark: deltascope against llama.cpp's llama-bench on the same weights.

    python3 scripts/bench/bench_cpu.py --deltascope BIN --llama-bench BIN --stream BIN \
        --pair bf16=MODEL_DIR,FILE.gguf --pair f32=MODEL_DIR,FILE.gguf [--pair moe-bf16=DIR,FILE.gguf] \
        [--pair q4_k_m=FILE.gguf,FILE.gguf] \
        [--rounds 3] [--threads 2] [--prompt-len 512] [--gen 128] [--out runs.jsonl]
    python3 scripts/bench/bench_cpu.py --summary runs.jsonl

Each round runs, for every dtype, one deltascope process (`bench --json --dtype DTYPE
--prompt-len P --max-tokens G --warmup 1 --repeat 1`) and one llama-bench process
(`-p P -n G -d 0,P -r 1`), measured alike: an untimed warm-up (the whole prompt, then generation: all
G tokens in deltascope, one in llama-bench), then one timed repetition, in the same process.
A pair whose deltascope model is itself a GGUF file (`q4_k_m=FILE.gguf,FILE.gguf`: both engines
read the same quantised blocks) runs deltascope at `--dtype auto` (f32 activations: its GGUF
config declares float32).
Both decode after a prompt of P tokens: deltascope generates after its prompt, and llama-bench's
tg is taken at depth P (`-d P`: the KV cache filled with P tokens first); its tg at depth 0,
llama-bench's default, is recorded beside it (`tg_d0`) and summarised too.
The engines alternate and the order reverses every round, with the bandwidth probe first.
Before each job it waits (up to a minute) until other processes use under 0.2 core; during the
job it measures what others used and runs the job again once if that exceeded 0.25 core. Peak
RSS comes from the kernel (wait4) per process.
Standard library only. Written by scripts/bench-cpu.sh, which builds everything it calls.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import statistics
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def busy_cores_since(start: tuple[float, float]) -> float:
    """Cores busy system-wide since `start` (from /proc/stat)."""
    t0, b0 = start
    t1, b1 = time.monotonic(), proc_busy()
    return (b1 - b0) / max(t1 - t0, 1e-6)


def proc_busy() -> float:
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]
    return (sum(cpu[:8]) - idle) / TICK


def wait_quiet(limit_s: float = 60.0) -> float:
    """Waits until the machine is quiet (< 0.2 core busy over 2 s); returns the seconds waited."""
    t = time.monotonic()
    while time.monotonic() - t < limit_s:
        s = (time.monotonic(), proc_busy())
        time.sleep(2)
        if busy_cores_since(s) < 0.2:
            break
    return time.monotonic() - t


def run_measured(cmd: list[str]) -> dict:
    """Runs one process: its output, wall time, peak RSS and cores, and the CPU others used meanwhile
    (the child's own rusage comes from wait4, so subprocess must not reap it)."""
    start = (time.monotonic(), proc_busy())
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_chunks, err_chunks = [], []
    # Drain both pipes without letting subprocess reap the child.
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, out_chunks)
    sel.register(p.stderr, selectors.EVENT_READ, err_chunks)
    open_pipes = 2
    while open_pipes:
        for key, _ in sel.select():
            data = os.read(key.fileobj.fileno(), 65536)
            if not data:
                sel.unregister(key.fileobj)
                open_pipes -= 1
            else:
                key.data.append(data)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    total = busy_cores_since(start) * wall
    own = ru.ru_utime + ru.ru_stime
    return {
        "rc": p.returncode,
        "stdout": b"".join(out_chunks).decode(errors="replace"),
        "stderr": b"".join(err_chunks).decode(errors="replace")[-2000:],
        "wall_s": wall,
        "peak_rss_bytes": ru.ru_maxrss * 1024,
        "cores_used": own / max(wall, 1e-6),
        "others_cores": max(total - own, 0.0) / max(wall, 1e-6),
    }


def deltascope_job(a, dtype: str, model: str) -> dict:
    # Measured as llama-bench measures: one warm-up pass (a whole prompt and generation, not
    # timed), then one timed pass, in one process. `bench --prompt-len P` pads its prompt to at
    # least P tokens (the chat template adds a few: the real count is recorded). `--dtype` is the
    # weights' dtype: llama.cpp multiplies BF16 weights by BF16 activations, as deltascope does at
    # --dtype bf16 (its default, f32, keeps f32 activations on bf16 weights).
    # A pair's label is its dtype, or SHAPE-DTYPE (moe-bf16: the MoE shape at bf16); `fp8` pairs
    # deltascope's FP8 checkpoint with llama.cpp's Q8_0 conversion of it.
    # An FP8 checkpoint runs at its declared dtype (bf16), its matrices read as FP8.
    # A GGUF file (`q4_k_m`, `q8_0`: llama-quantize's output, the file llama-bench reads) runs
    # as its metadata declares: f32 activations on the blocks as stored.
    ds_dtype = dtype.rsplit("-", 1)[-1]
    ds_dtype = "auto" if ds_dtype == "fp8" or model.endswith(".gguf") else ds_dtype
    cmd = [a.deltascope, "bench", "--model", model, "--dtype", ds_dtype, "--prompt", "Count.",
           "--prompt-len", str(a.prompt_len), "--max-tokens", str(a.gen), "--mtp", "0",
           "--warmup", "1", "--repeat", "1", "--threads", str(a.threads), "--json"]
    r = run_measured(cmd)
    if r["rc"] != 0:
        sys.exit(f"bench_cpu: deltascope {dtype} failed (exit {r['rc']}): {r['stderr']}")
    try:
        out = json.loads(r["stdout"])
        row = out["rows"][0]
        pp, tg = row["prefill_tok_s"]["median"], row["decode_tok_s"]["median"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        sys.exit(f"bench_cpu: deltascope {dtype}: unexpected bench --json output ({e}):\n{r['stdout'][-2000:]}")
    if row["generated_tokens"] < a.gen:
        sys.exit(f"bench_cpu: deltascope {dtype} generated {row['generated_tokens']} of {a.gen} tokens")
    return {"engine": "deltascope", "dtype": dtype, "pp": pp, "tg": tg, "prompt_tokens": out["prompt_tokens"][0],
            "generated": row["generated_tokens"], "cpu": out.get("cpu"),
            **{k: r[k] for k in ("wall_s", "peak_rss_bytes", "others_cores", "cores_used")}}


def llama_job(a, dtype: str, gguf: str) -> dict:
    # pp from an empty cache; tg at depth P as deltascope's (after its prompt), and at depth 0.
    cmd = [a.llama_bench, "-m", gguf, "-t", str(a.threads), "-p", str(a.prompt_len), "-n", str(a.gen),
           "-d", f"0,{a.prompt_len}", "-r", "1", "-o", "json"]
    r = run_measured(cmd)
    repack = True
    if r["rc"] in (-4, 132):
        # SIGILL: llama.cpp's AMX Q8_0 kernel runs `tilezero` on a thread the kernel has not
        # granted AMX tile state (seen on the 2-core Xeon VM, build 11434; gdb:
        # tinygemm_kernel_amx<block_q8_0>). Without weight repacking it runs its AVX-512 kernels.
        print(f"  llama.cpp {dtype}: illegal instruction (its AMX path); again with --repack 0", file=sys.stderr)
        r = run_measured(cmd + ["--repack", "0"])
        repack = False
    if r["rc"] != 0:
        sys.exit(f"bench_cpu: llama-bench {dtype} failed (exit {r['rc']}): {r['stderr']}")
    rows = json.loads(r["stdout"])
    def pick(prompt: bool, depth: int) -> float:
        found = [x["avg_ts"] for x in rows
                 if (x["n_prompt"] > 0) == prompt and (x["n_gen"] > 0) != prompt and x.get("n_depth", 0) == depth]
        if not found:
            sys.exit(f"bench_cpu: llama-bench {dtype}: no {'pp' if prompt else 'tg'} row at depth {depth}: {rows}")
        return found[0]
    pp, tg, tg_d0 = pick(True, 0), pick(False, a.prompt_len), pick(False, 0)
    return {"engine": "llama.cpp", "dtype": dtype, "pp": pp, "tg": tg, "tg_depth": a.prompt_len, "tg_d0": tg_d0,
            "build": rows[0].get("build_number"),
            "repack": repack,
            **{k: r[k] for k in ("wall_s", "peak_rss_bytes", "others_cores", "cores_used")}}


def stream_job(a) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    p = subprocess.run([a.stream, "6"], capture_output=True, text=True, env=env, check=True)
    return {"engine": "probe", **json.loads(p.stdout)}


def measure(a) -> None:
    pairs = {}
    for spec in a.pair:
        dtype, rest = spec.split("=", 1)
        model, gguf = rest.split(",", 1)
        pairs[dtype] = (model, gguf)
    jobs = []
    for dtype, (model, gguf) in pairs.items():
        jobs.append(("deltascope", dtype, model))
        jobs.append(("llama.cpp", dtype, gguf))
    out = open(a.out, "a")
    for rnd in range(a.rounds):
        order = jobs if rnd % 2 == 0 else list(reversed(jobs))
        wait_quiet()
        rec = {"round": rnd, **stream_job(a), "time": time.strftime("%H:%M:%S")}
        print(json.dumps(rec), file=out, flush=True)
        print(f"round {rnd}: bandwidth {rec['read_gb_s']} GB/s", file=sys.stderr)
        for engine, dtype, path in order:
            for attempt in range(2):
                waited = wait_quiet()
                rec = deltascope_job(a, dtype, path) if engine == "deltascope" else llama_job(a, dtype, path)
                rec.update(round=rnd, attempt=attempt, waited_s=round(waited, 1), time=time.strftime("%H:%M:%S"),
                           weight_file_bytes=weight_bytes(path))
                if rec["others_cores"] <= 0.25 or attempt == 1:
                    break
                print(f"  {engine} {dtype}: others used {rec['others_cores']:.2f} core; again", file=sys.stderr)
            print(json.dumps(rec), file=out, flush=True)
            print(f"  {engine:10} {dtype:6} pp{a.prompt_len} {rec['pp']:7.1f}  tg{a.gen} {rec['tg']:6.2f}  "
                  f"rss {rec['peak_rss_bytes'] / 2**30:.2f} GiB  others {rec['others_cores']:.2f}", file=sys.stderr)


def weight_bytes(path: str) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.glob("*.safetensors"))
    return p.stat().st_size


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})"


def summary(files: list[str]) -> None:
    recs = [json.loads(l) for f in files for l in open(f) if l.strip()]
    bw = [r["read_gb_s"] for r in recs if r["engine"] == "probe"]
    runs = [r for r in recs if r["engine"] != "probe"]
    keys = sorted({(r["engine"], r["dtype"]) for r in runs}, key=lambda k: (k[1], k[0]))
    med_bw = statistics.median(bw) if bw else float("nan")
    print(f"bandwidth (read, {len(bw)} probes): {spread(bw) if bw else 'not measured'} GB/s")
    print()
    print("| engine | dtype | pp tok/s | tg tok/s | peak RSS GiB | weights GB | decode GB/s | of bandwidth |")
    print("|---|---|---|---|---|---|---|---|")
    med = {}
    for k in keys:
        rs = [r for r in runs if (r["engine"], r["dtype"]) == k]
        pp, tg = [r["pp"] for r in rs], [r["tg"] for r in rs]
        rss = [r["peak_rss_bytes"] / 2**30 for r in rs]
        wb = rs[0]["weight_file_bytes"] / 1e9
        gbs = wb * statistics.median(tg)
        med[k] = (statistics.median(pp), statistics.median(tg), statistics.median(rss), wb, pp, tg)
        # A MoE token reads its experts only, not the whole file: no bandwidth share from it.
        moe = k[1].startswith("moe")
        bw_cols = "- | -" if moe else f"{gbs:.1f} | {100 * gbs / med_bw:.0f} %"
        print(f"| {k[0]} | {k[1]} | {spread(pp)} | {spread(tg)} | {max(rss):.2f} | {wb:.2f} | {bw_cols} |")
    print()
    print("| dtype | pp ratio deltascope / llama.cpp | tg ratio | deltascope RSS / weights |")
    print("|---|---|---|---|")
    for dtype in sorted({k[1] for k in keys}):
        d, l = med.get(("deltascope", dtype)), med.get(("llama.cpp", dtype))
        if d and l:
            # Ratios per round (interleaved pairs), then their median and range.
            rp = [a / b for a, b in zip(d[4], l[4])]
            rt = [a / b for a, b in zip(d[5], l[5])]
            print(f"| {dtype} | {spread(rp)} | {spread(rt)} | {d[2] * 2**30 / 1e9 / d[3]:.2f} |")
    depths = sorted({str(r.get("tg_depth", 0)) for r in runs if r["engine"] == "llama.cpp"})
    print()
    if depths == ["0"]:
        print("tg: llama.cpp's at depth 0 (runs recorded before llama-bench was asked for deltascope's depth).")
        return
    older = " (0: runs recorded before the depths were matched)" if "0" in depths else ""
    print(f"tg: both engines decode after the prompt (llama.cpp at depth {', '.join(depths)}{older}). "
          "llama.cpp's tg at depth 0, llama-bench's default:")
    for dtype in sorted({k[1] for k in keys}):
        ls = [r for r in runs if (r["engine"], r["dtype"]) == ("llama.cpp", dtype) and "tg_d0" in r]
        d = med.get(("deltascope", dtype))
        if ls and d:
            d0 = [r["tg_d0"] for r in ls]
            print(f"  {dtype}: {spread(d0)} tok/s; deltascope tg / it: {d[1] / statistics.median(d0):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", nargs="+", metavar="JSONL")
    ap.add_argument("--deltascope")
    ap.add_argument("--llama-bench")
    ap.add_argument("--stream")
    ap.add_argument("--pair", action="append", default=[], metavar="DTYPE=MODEL_DIR,GGUF")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--out", default="bench-cpu.jsonl")
    a = ap.parse_args()
    if a.summary:
        summary(a.summary)
        return
    missing = [f for f in ("deltascope", "llama_bench", "stream") if not getattr(a, f)] + ([] if a.pair else ["pair"])
    if missing:
        sys.exit(f"bench_cpu: missing --{', --'.join(m.replace('_', '-') for m in missing)}")
    measure(a)
    summary([a.out])


if __name__ == "__main__":
    main()
