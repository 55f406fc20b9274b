#!/usr/bin/env python3
"""The hostile client of tests/load (honest_load.py fairness): one process
that holds --streams MultiplyStream calls open and sends nothing useful on
them: --silent_fraction of them send no message at all, the others a
JobHeader (2048x2048 float32) and then nothing. A call the server ends (its
header or first-block timeout) is opened again at once, one it refuses
(RESOURCE_EXHAUSTED) after --refused_reopen_s, so the count stays near
--streams for as long as this runs without a busy loop of refusals eating the
test machine's cores. The calls go over --connections
connections (under the server's 64 concurrent streams per connection), all
from this one process. Reuses bench/attacks.py's wire helpers.

Prints "holding N" once every call is open, and on SIGTERM (or after
--duration) writes {"opened", "ended": {code: n}} to --report and exits.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import attacks  # noqa: E402  (bench/attacks.py: channel, stream_header)

import grpc  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--connections", type=int, default=17)
    p.add_argument("--silent_fraction", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--refused_reopen_s", type=float, default=5.0,
                   help="a call the server refused at once is opened again after this long")
    p.add_argument("--report", required=True)
    args = p.parse_args()

    release = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()
    ended = {}
    opened = [0]
    chans = [attacks.channel(args.server) for _ in range(args.connections)]
    methods = [c.stream_stream("/dgmm.v1.Dgmm/MultiplyStream") for c in chans]
    header = attacks.stream_header(2048, 2048)
    calls = {}

    def with_header():
        yield header
        release.wait()

    def silent():
        release.wait()
        return
        yield  # a generator that yields nothing

    def open_call(slot):
        if stop.is_set():
            return
        gen = silent() if slot < args.streams * args.silent_fraction else with_header()
        call = methods[slot % len(methods)](gen, timeout=3600)
        with lock:
            opened[0] += 1
            calls[slot] = call

        def done(c, slot=slot):
            try:
                code = c.code().name
            except Exception:
                code = "UNKNOWN"
            with lock:
                ended[code] = ended.get(code, 0) + 1
            if not stop.is_set():
                # Opened again from another thread: not inside gRPC's callback.
                delay = args.refused_reopen_s if code == "RESOURCE_EXHAUSTED" else 0.0
                threading.Timer(delay, open_call, args=(slot,)).start()
        call.add_done_callback(done)

    for slot in range(args.streams):
        open_call(slot)
    print("holding %d" % args.streams, flush=True)
    stop.wait(args.duration)
    stop.set()
    with lock:
        during = dict(ended)  # what the server did to them while the test ran
        live = list(calls.values())
    for c in live:
        c.cancel()
    release.set()
    for c in chans:
        c.close()
    with open(args.report, "w") as f:
        json.dump(dict(opened=opened[0], ended=during), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
