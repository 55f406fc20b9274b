#!/usr/bin/python3
"""Does a job through the Open Inference Protocol cost more than the same
job through dgmm's own Multiply, from the same client code?

One N x N float32 job (side right, fresh random operands), sent in turns
through inference.GRPCInferenceService/ModelInfer and dgmm.v1.Dgmm/Multiply
by one grpcio channel, which of the two goes first alternating from turn
to turn: each call builds its request message from the NumPy
arrays, makes the unary call and reads C back into a NumPy array, the same
steps for both. Prints every time, the medians, their ratio and whether it
meets the target: ModelInfer <= 1.1 x Multiply. Both results are checked
against each other and against a float64 NumPy reference before timing.

Needs the server and the generated modules (proto/CMakeLists.txt:
dgmm_oip_python):
  /usr/bin/python3 bench/oip/oip_vs_multiply.py --server build/service/dgmm-server \\
      --modules build/oip_python --n 4000 --reps 9
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import grpc
import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TARGET = 1.1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=os.path.join(REPO, "build", "service", "dgmm-server"))
    ap.add_argument("--modules", default=os.path.join(REPO, "build", "oip_python"),
                    help="where inference/*_pb2*.py and dgmm_pb2*.py were generated")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=9, help="timed calls of each, in turns")
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()

    sys.path.insert(0, os.path.join(REPO, "tests", "support"))
    sys.path.insert(0, args.modules)
    from dgmm_server import ServerProcess
    from inference import grpc_predict_v2_pb2 as pb
    from inference import grpc_predict_v2_pb2_grpc as pb_grpc
    import dgmm_pb2
    import dgmm_pb2_grpc

    n = args.n
    rng = np.random.default_rng()
    a = rng.uniform(0.5, 2.0, size=(n, n)).astype(np.float32)
    d = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
    message_mib = (a.nbytes + d.nbytes) // (1 << 20) + 16
    server = ServerProcess(binary=args.server, backend=args.backend,
                           flags=["--max_unary_message_bytes=%dMiB" % message_mib],
                           prefix="dgmm-oip-bench-")
    try:
        channel = grpc.insecure_channel(server.address, options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        oip = pb_grpc.GRPCInferenceServiceStub(channel)
        dgmm = dgmm_pb2_grpc.DgmmStub(channel)

        def via_oip():
            req = pb.ModelInferRequest(model_name="dgmm")
            req.inputs.add(name="A", datatype="FP32", shape=[n, n])
            req.inputs.add(name="d", datatype="FP32", shape=[n])
            req.raw_input_contents.extend([a.tobytes(), d.tobytes()])
            resp = oip.ModelInfer(req, timeout=600)
            return np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(n, n)

        def via_multiply():
            req = dgmm_pb2.MultiplyRequest(
                header=dgmm_pb2.JobHeader(rows=n, cols=n, dtype=dgmm_pb2.DTYPE_FLOAT32,
                                          side=dgmm_pb2.SIDE_RIGHT, diagonal=d.tobytes()),
                matrix=a.tobytes())
            resp = dgmm.Multiply(req, timeout=600)
            return np.frombuffer(resp.result, dtype=np.float32).reshape(n, n)

        reference = (a.astype(np.float64) * d.astype(np.float64)).astype(np.float32)
        for name, call in (("ModelInfer", via_oip), ("Multiply", via_multiply)):
            if not np.array_equal(call(), reference):
                sys.exit("%s returned a wrong result" % name)
        with open("/proc/loadavg") as f:
            load_before = f.read().split()[:3]
        times = {"ModelInfer": [], "Multiply": []}
        pair = (("ModelInfer", via_oip), ("Multiply", via_multiply))
        for rep in range(args.reps):
            for name, call in pair if rep % 2 == 0 else pair[::-1]:  # who goes first alternates
                start = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - start) * 1e3)
        with open("/proc/loadavg") as f:
            load_after = f.read().split()[:3]
        channel.close()
    finally:
        server.stop()

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print("oip_vs_multiply: N = %d float32, side right, backend %s, %d calls of each in turns "
          "(the first alternating), "
          "one grpcio channel (grpcio %s), commit %s, %s"
          % (n, args.backend, args.reps, grpc.__version__, commit,
             time.strftime("%Y-%m-%d %H:%M:%S %Z")))
    med = {}
    for name, ts in times.items():
        med[name] = statistics.median(ts)
        print("  %-10s ms: %s  median %.1f" % (name, " ".join("%.1f" % t for t in ts), med[name]))
    turns = [o / m for o, m in zip(times["ModelInfer"], times["Multiply"])]
    print("  per turn ModelInfer / Multiply: %s  median %.3f"
          % (" ".join("%.2f" % r for r in turns), statistics.median(turns)))
    print("  load average (1, 5, 15 min) before %s, after %s (the client and the server "
          "themselves load the machine's two cores)" % (" ".join(load_before), " ".join(load_after)))
    ratio = med["ModelInfer"] / med["Multiply"]
    print("  ModelInfer / Multiply = %.3f (target <= %.1f): %s"
          % (ratio, TARGET, "MET" if ratio <= TARGET else "MISSED"))


if __name__ == "__main__":
    main()
