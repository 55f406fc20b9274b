#!/usr/bin/env python3
"""The clients against each other: the Node package and the Python package
(both bindings of the C++ client) against dgmm::Client itself, on one N x N
float32 job (side right, row-major), interleaved round by round so that
whatever else loads the machine loads both sides alike.

    /usr/bin/python3 bench/clients/client_bench.py --build build \\
        --node-package build/tests/node/project/node_modules/dgmm-client \\
        [--rounds 3] [--out bench/results/clients/cpu2_<commit>]

Per case it runs the C++ tool (dgmm_cpp_client_timing, client/python/tools),
then node_timing.js (then python_timing.py where asked), swapping the order
every round, each a fresh process that times REPEATS jobs after a warm-up,
and compares the medians of all their jobs. Servers: one of this user
(regions on, its defaults: a same-host job uses the caller's memory) and,
as root, one run as uid 65534 (a same-host job goes through a staging memfd
passed by descriptor). Prints a table with each ratio and MET or MISSED,
and with --out writes it (results.md) and the raw timings (raw.json) there.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def start_server(binary, uid=None):
    d = tempfile.mkdtemp(prefix="dgmm-client-bench-")
    os.chmod(d, 0o777)
    port_file = os.path.join(d, "port")
    cmd = [binary, "--listen=127.0.0.1:0", "--port_file=" + port_file, "--backend=cpu"]
    if uid is not None:
        copy = os.path.join(d, "dgmm-server")
        shutil.copy(binary, copy)
        os.chmod(copy, 0o755)
        cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups", copy] + cmd[1:]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "log"), "w"))
    deadline = time.time() + 30
    while time.time() < deadline:
        if os.path.exists(port_file):
            text = open(port_file).read()
            if text.endswith("\n"):
                return proc, d, "127.0.0.1:" + text.strip()
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start: " + open(os.path.join(d, "log")).read())


def run_side(cmd, env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit("%s failed (%d): %s" % (" ".join(cmd), out.returncode, out.stderr[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", required=True, help="a build of the repository (scripts/build.sh)")
    p.add_argument("--node-package", required=True, help="the installed Node package")
    p.add_argument("--python", default="", help="python with dgmm installed (default <build>/python-venv/bin/python)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="", help="run only cases whose name contains this")
    p.add_argument("--out", default="")
    args = p.parse_args()
    build = os.path.abspath(args.build)
    server_bin = os.path.join(build, "service", "dgmm-server")
    cpp_tool = os.path.join(build, "python", "dgmm_cpp_client_timing")
    python = args.python or os.path.join(build, "python-venv", "bin", "python")
    node_tool = ["node", os.path.join(HERE, "node_timing.js"), os.path.abspath(args.node_package)]
    py_tool = [python, os.path.join(HERE, "python_timing.py")]

    servers = {"same user": start_server(server_bin)}
    if os.getuid() == 0 and shutil.which("setpriv"):
        servers["uid 65534"] = start_server(server_bin, uid=65534)
    # name, server, N, repeats, same_host, sides, target (kind, bound)
    socket, same = {"DGMM_SAME_HOST": "0"}, {}
    cases = []
    for n, reps in ((1000, 20), (4000, 6), (10000, 3)):
        cases.append(("socket N=%d" % n, "same user", n, reps, socket, ("node",), ("throughput", 0.9)))
    for n, reps in ((1000, 20), (4000, 6), (10000, 3)):
        cases.append(("same-host N=%d, server same user" % n, "same user", n, reps, same, ("node",),
                      ("time", 1.1)))
    if "uid 65534" in servers:
        for n, reps in ((1000, 20), (4000, 6), (10000, 3)):
            cases.append(("same-host N=%d, server uid 65534" % n, "uid 65534", n, reps, same, ("node",),
                          ("time", 1.1)))
    cases.append(("1x1 per call (node)", "same user", 1, 2000, socket, ("node",), ("time", 1.2)))
    if os.path.exists(python):
        cases.append(("1x1 per call (python)", "same user", 1, 2000, socket, ("python",), ("time", 1.1)))
    cases = [c for c in cases if args.only in c[0]]

    raw = {c[0]: {"cpp": [], "node": [], "python": [], "modes": set()} for c in cases}
    try:
        for r in range(args.rounds):
            for name, srv, n, reps, env, sides, _ in cases:
                address = servers[srv][2]
                order = ["cpp"] + list(sides)
                if r % 2:
                    order.reverse()
                for side in order:
                    cmd = {"cpp": [cpp_tool], "node": node_tool, "python": py_tool}[side] + \
                        [address, str(n), str(reps), "2" if n > 1 else "50"]
                    result = run_side(cmd, env)
                    raw[name][side].extend(result["seconds"])
                    if result.get("mode"):
                        raw[name]["modes"].add("%s: %s" % (side, result["mode"]))
                print("# round %d: %s done" % (r + 1, name), file=sys.stderr, flush=True)
    finally:
        for proc, d, _ in servers.values():
            proc.terminate()
            proc.wait()
            shutil.rmtree(d, ignore_errors=True)

    lines = ["| case | C++ median | binding median | ratio | target | verdict | modes |",
             "|---|---|---|---|---|---|---|"]
    all_met = True
    for name, srv, n, reps, env, sides, (kind, bound) in cases:
        side = sides[0]
        cpp = statistics.median(raw[name]["cpp"])
        other = statistics.median(raw[name][side])
        if kind == "throughput":
            ratio = cpp / other  # the binding's throughput over C++'s
            met = ratio >= bound
            target = "%s throughput >= %.1f x C++" % (side, bound)
        else:
            ratio = other / cpp
            met = ratio <= bound
            target = "%s time <= %.1f x C++" % (side, bound)
        all_met &= met
        unit = (lambda s: "%.1f us" % (s * 1e6)) if n == 1 else (lambda s: "%.2f ms" % (s * 1e3))
        lines.append("| %s | %s | %s (%s) | %.3f | %s | %s | %s |" % (
            name, unit(cpp), unit(other), side, ratio, target, "MET" if met else "MISSED",
            "; ".join(sorted(raw[name]["modes"]))))
    table = "\n".join(lines)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(table + "\n")
        for v in raw.values():
            v["modes"] = sorted(v["modes"])
        with open(os.path.join(args.out, "raw.json"), "w") as f:
            json.dump(raw, f, separators=(",", ":"))
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
