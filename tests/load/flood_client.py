#!/usr/bin/env python3
"""A unary flood from honest clients for tests/load (honest_load.py flood):
--calls valid Multiply calls of about --bytes each (float32, random data in
[0.5, 2), SIDE_RIGHT), all in flight at once, each on its own connection;
--rounds times. Every result is checked against a float64 NumPy reference.

--via=raw: grpcio, one attempt per call, no retry, so that each refusal is
  seen once and can be matched with the server's counters (but for a call
  that met a GOAWAY before the server saw it: sent again, up to 3 times,
  and counted in `goaway`); a failure is
  classified by its trailers: "dgmm" when it carries `dgmm-origin: server`
  (dgmm's own refusal), else "transport" (gRPC's: the transport quota's
  "Buffers full" / RST_STREAM code 11, a reset); and whether it carried
  `grpc-retry-pushback-ms`.
--via=binding: the Python binding (dgmm.Client per connection, stream=False,
  its default retry policy, --deadline): the final outcome an honest user sees.

Writes one JSON record per call to --report:
  {status, origin, pushback, details, correct, attempts[, goaway]}
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np

MIB = 1 << 20


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--calls", type=int, required=True)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--bytes", type=int, default=15 * MIB)
    p.add_argument("--via", choices=["raw", "binding"], default="raw")
    p.add_argument("--deadline", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start_at", type=float, default=0.0)
    p.add_argument("--report", required=True)
    args = p.parse_args()

    import grpc
    import dgmm
    pb = dgmm.pb
    n = int((args.bytes // 4) ** 0.5)
    rng = np.random.default_rng(args.seed)
    a = rng.random((n, n), dtype=np.float32) + np.float32(0.5)
    d = rng.random(n, dtype=np.float32) + np.float32(0.5)
    ref = a.astype(np.float64) * d.astype(np.float64)
    records = []
    lock = threading.Lock()

    def correct(c):
        c = np.asarray(c, dtype=np.float64).reshape(n, n)
        return bool(np.all(np.isfinite(c)) and np.max(np.abs(c - ref) / ref) <= 1e-6)

    if args.via == "raw":
        header = pb.JobHeader(rows=n, cols=n, dtype=pb.DTYPE_FLOAT32, layout=pb.LAYOUT_ROW_MAJOR,
                              side=pb.SIDE_RIGHT, diagonal=d.tobytes())
        request = pb.MultiplyRequest(header=header, matrix=a.tobytes()).SerializeToString()
        opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                ("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)]
        chans = [grpc.insecure_channel(args.server, options=opts) for _ in range(args.calls)]
        for ch in chans:
            grpc.channel_ready_future(ch).result(timeout=30)
        calls = [ch.unary_unary("/dgmm.v1.Dgmm/Multiply") for ch in chans]
    else:
        clients = [dgmm.Client(args.server) for _ in range(args.calls)]
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))

    def raw_attempt(i):
        try:
            reply, call = calls[i].with_call(request, timeout=args.deadline)
            out = np.frombuffer(pb.MultiplyResponse.FromString(reply).result, dtype=np.float32)
            return dict(status="OK", origin="", pushback=False, details="",
                        correct=correct(out) if out.size == n * n else False)
        except grpc.RpcError as e:
            trailers = dict(e.trailing_metadata() or ())
            return dict(status=e.code().name, origin=trailers.get("dgmm-origin", ""),
                        pushback="grpc-retry-pushback-ms" in trailers, details=e.details() or "",
                        correct=None)

    def one(i):
        if args.via == "raw":
            rec = raw_attempt(i)
            attempts, goaway = 1, 0
            # A call that meets a GOAWAY before the server saw its stream (its
            # id above the GOAWAY's last stream id: gRPC ends it UNAVAILABLE
            # "GOAWAY received") never reached the server, which cannot count
            # it. gRPC's memory reclaimer sends such GOAWAYs to idle
            # connections when its quota runs dry. A well-behaved client
            # sends the call again; so does this one, and says how often.
            while (rec["status"] == "UNAVAILABLE" and rec["details"] == "GOAWAY received"
                   and not rec["origin"] and attempts < 4):
                rec = raw_attempt(i)
                attempts += 1
                goaway += 1
            rec.update(attempts=attempts, goaway=goaway)
        else:
            out = np.full((n, n), np.nan, dtype=np.float32)
            try:
                _, info = clients[i].multiply(a, d, timeout=args.deadline, stream=False, out=out,
                                              return_info=True)
                rec = dict(status="OK", origin="", pushback=False, details="", correct=correct(out),
                           attempts=info.attempts)
            except dgmm.DgmmError as e:
                rec = dict(status=e.code.name if e.code is not None else "UNKNOWN", origin="?",
                           pushback=e.retry_after_ms is not None, details=e.details or "",
                           correct=None, attempts=getattr(e.info, "attempts", 0) if e.info else 0)
        with lock:
            records.append(rec)

    for _ in range(args.rounds):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with open(args.report + ".tmp", "w") as f:
        json.dump(records, f)
    os.replace(args.report + ".tmp", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
