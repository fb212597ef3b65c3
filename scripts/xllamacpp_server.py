#!/usr/bin/env python3
"""Run llama.cpp's HTTP server in-process through xllamacpp (PyPI `xllamacpp`): llama.cpp b11549
from the venv, or b10566 with the folder setup-servers.sh prints as XLLAMACPP_OLD_PATH on
PYTHONPATH.

    python scripts/xllamacpp_server.py --model demo.gguf --host 127.0.0.1 --port 18081 \
        [--mtp N] [--metrics] [--reasoning-format deepseek|none|auto] [--ctx 4096] \
        [--threads 1] [--parallel 1] [--alias NAME]

The flags mirror llama-server's: --mtp N is `--spec-type draft-mtp --spec-draft-n-max N`,
--metrics is `--metrics`, --ctx is `-c`, --threads is `-t`, --parallel is `-np`.
Prints one line `xllamacpp VERSION listening on http://HOST:PORT` (stdout, flushed) once the model is
loaded and the port accepts connections, then serves until SIGTERM or SIGINT and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description="llama.cpp server in-process via xllamacpp")
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mtp", type=int, default=0, metavar="N", help="MTP speculative decoding, N draft tokens")
    ap.add_argument("--metrics", action="store_true", help="enable /metrics")
    ap.add_argument("--reasoning-format", choices=["deepseek", "none", "auto"], default="deepseek")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--alias", default=None, help="model name reported by the API (default: the path)")
    ap.add_argument("--chat-template", default=None, metavar="FILE",
                    help="render chats with this Jinja template instead of the GGUF's (verify's tests: a wrong one)")
    args = ap.parse_args()

    if not os.path.isfile(args.model):
        print(f"xllamacpp_server.py: no model file {args.model}", file=sys.stderr)
        return 2

    # Block the stop signals before the server starts its threads (they inherit the mask), so that
    # only sigwait() below sees them and the C++ threads are never interrupted.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = args.model
    if args.alias:
        p.model_alias = {args.alias}  # a set of names: a bare string would become its letters
    if hasattr(p, "hostnames"):  # b11549 binds a list of hosts
        p.hostnames = [args.host]
    else:  # older builds (b10566) bind one
        p.hostname = args.host
    p.port = args.port
    p.n_ctx = args.ctx
    p.n_parallel = args.parallel
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.endpoint_metrics = args.metrics
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            p.chat_template = f.read()
    p.reasoning_format = {
        "deepseek": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_DEEPSEEK,
        "none": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_NONE,
        "auto": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_AUTO,
    }[args.reasoning_format]
    if args.mtp > 0:
        # also makes the loader keep the nextn (MTP) block: load_mtp follows the speculative types
        p.speculative.types = [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_MTP]
        p.speculative.draft.n_max = args.mtp

    try:
        server = xlc.Server(p)  # loads the model, then serves HTTP on its own threads
    except Exception as e:  # e.g. the model does not load or the port is taken
        print(f"xllamacpp_server.py: server failed to start: {e}", file=sys.stderr)
        return 1

    # Announce only once the socket accepts connections.
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((args.host, args.port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                print(f"xllamacpp_server.py: nothing listening on {args.host}:{args.port}", file=sys.stderr)
                os._exit(1)
            time.sleep(0.02)
    # The version tells which build answered (both report build_info "b0-unknown").
    print(f"xllamacpp {getattr(xlc, '__version__', '?')} listening on http://{args.host}:{args.port}", flush=True)

    sig = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print(f"xllamacpp_server.py: {signal.Signals(sig).name}, stopping", file=sys.stderr, flush=True)

    # Let the destructor stop the HTTP server; if it hangs, leave anyway.
    timer = threading.Timer(5.0, lambda: os._exit(0))
    timer.daemon = True
    timer.start()
    del server
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
