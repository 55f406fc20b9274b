#!/usr/bin/python3
"""Do metrics through prometheus-cpp leave the 1x1 job rate within the noise
of the server before them?

Two dgmm-server binaries, A (before: the hand-written exposition over
civetweb) and B (after: prometheus-cpp), both on the CPU backend with
--metrics_listen, both running for the whole benchmark. In each turn
bench/small_job_bench --loop_1x1_seconds=S (one thread, one Client, 1x1
float32 Multiply jobs back to back) runs against A and against B, which of
the two goes first alternating from turn to turn, while this script GETs
the server's /metrics every --scrape_s seconds as a Prometheus would (0:
no scrapes). One warm-up turn is run and not counted.

Prints every turn's rates, the median time of a GET /metrics of each, the medians, B / A, the run-to-run noise (the
spread of A's own turns: the median of |rate / median - 1|, and their
stdev / mean) and MET when B / A >= 1 - noise (B is no slower than A's own
turns differ), else MISSED; the server's CPU time per job (user + system,
all threads, from /proc: a figure the other processes of a busy machine
disturb less than the rate); and the load average before and after.

    /usr/bin/python3 bench/metrics/metrics_ab.py --a build-base/service/dgmm-server \\
        --b build/service/dgmm-server --client build/bench/small_job_bench --turns 10 --seconds 5
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def scrape_loop(port, interval, stop, counts, times):
    while not stop.wait(interval):
        try:
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
            times.append(time.perf_counter() - t0)
            counts[0] += 1
        except OSError:
            counts[1] += 1


def cpu_seconds(pid):
    """User + system CPU time of process `pid`, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_turn(client, server, seconds, scrape_s, times=None):
    """(jobs/s, scrapes, server CPU us per job) of one run of the client."""
    stop = threading.Event()
    counts = [0, 0]
    scraper = None
    if scrape_s > 0:
        scraper = threading.Thread(target=scrape_loop, args=(server.metrics_port, scrape_s, stop, counts,
                                                             times if times is not None else []))
        scraper.start()
    cpu0 = cpu_seconds(server.process.pid)
    try:
        p = subprocess.run([client, f"--server={server.address}", f"--loop_1x1_seconds={seconds}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 60)
    finally:
        stop.set()
        if scraper:
            scraper.join()
    cpu = cpu_seconds(server.process.pid) - cpu0
    m = re.search(r"(\d+) in [0-9.]+ s, ([0-9.]+)/s", p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"small_job_bench failed ({p.returncode}): {p.stdout}")
    if counts[1]:
        raise RuntimeError(f"{counts[1]} scrapes of /metrics failed")
    return float(m.group(2)), counts[0], cpu / int(m.group(1)) * 1e6


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="dgmm-server before (the baseline)")
    ap.add_argument("--b", default=os.path.join(REPO, "build", "service", "dgmm-server"),
                    help="dgmm-server after")
    ap.add_argument("--client", default=os.path.join(REPO, "build", "bench", "small_job_bench"))
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=5, help="seconds of 1x1 jobs per server per turn")
    ap.add_argument("--scrape_s", type=float, default=1.0, help="seconds between GETs of /metrics; 0: none")
    ap.add_argument("--label_a", default="A (before)")
    ap.add_argument("--label_b", default="B (after)")
    args = ap.parse_args()

    sys.path.insert(0, os.path.join(REPO, "tests", "support"))
    from dgmm_server import ServerProcess

    servers = {}
    for key, binary in (("A", args.a), ("B", args.b)):
        s = ServerProcess(binary=binary, backend="cpu", flags=["--metrics_listen=127.0.0.1:0"],
                          prefix="dgmm-metrics-ab-")
        m = re.search(r"/metrics \(port (\d+)\)", s.log())
        if not m:
            raise RuntimeError(f"{binary}: no metrics port in its log:\n{s.log()}")
        s.metrics_port = int(m.group(1))
        servers[key] = s
    try:
        print(f"A: {args.label_a}: {args.a}")
        print(f"B: {args.label_b}: {args.b}")
        print(f"client: {args.client} --loop_1x1_seconds={args.seconds} (one thread, 1x1 float32 Multiply)")
        print(f"scrapes of /metrics every {args.scrape_s} s during each run" if args.scrape_s > 0 else "no scrapes")
        print(f"load average before: {loadavg()}; cpus: {os.cpu_count()}")
        for key in ("A", "B"):  # warm-up, not counted
            run_turn(args.client, servers[key], min(args.seconds, 2), args.scrape_s)
        rates = {"A": [], "B": []}
        cpu_us = {"A": [], "B": []}
        scrape_times = {"A": [], "B": []}
        print("| turn | first | A jobs/s | B jobs/s | B / A | server CPU us/job A | B | scrapes A, B |")
        print("|---|---|---|---|---|---|---|---|")
        for turn in range(args.turns):
            order = ("A", "B") if turn % 2 == 0 else ("B", "A")
            got = {}
            for key in order:
                got[key] = run_turn(args.client, servers[key], args.seconds, args.scrape_s, scrape_times[key])
                rates[key].append(got[key][0])
                cpu_us[key].append(got[key][2])
            print(f"| {turn + 1} | {order[0]} | {got['A'][0]:.0f} | {got['B'][0]:.0f} | "
                  f"{got['B'][0] / got['A'][0]:.3f} | {got['A'][2]:.1f} | {got['B'][2]:.1f} | "
                  f"{got['A'][1]}, {got['B'][1]} |", flush=True)
        med_a, med_b = statistics.median(rates["A"]), statistics.median(rates["B"])
        ratio = med_b / med_a
        noise_a = statistics.median(abs(r / med_a - 1) for r in rates["A"])
        noise_b = statistics.median(abs(r / med_b - 1) for r in rates["B"])
        cv_a = statistics.stdev(rates["A"]) / statistics.mean(rates["A"])
        cv_b = statistics.stdev(rates["B"]) / statistics.mean(rates["B"])
        turn_ratios = [b / a for a, b in zip(rates["A"], rates["B"])]
        print(f"medians: A {med_a:.0f} jobs/s, B {med_b:.0f} jobs/s; B / A = {ratio:.3f} "
              f"(per-turn B / A {min(turn_ratios):.3f}-{max(turn_ratios):.3f}, median "
              f"{statistics.median(turn_ratios):.3f})")
        print(f"run-to-run noise: A's turns median |rate/median - 1| = {noise_a:.3f} "
              f"(stdev/mean {cv_a:.3f}); B's {noise_b:.3f} (stdev/mean {cv_b:.3f})")
        cpu_a, cpu_b = statistics.median(cpu_us["A"]), statistics.median(cpu_us["B"])
        print(f"server CPU per job (user + system, all threads, scrapes included), median: "
              f"A {cpu_a:.1f} us, B {cpu_b:.1f} us; B / A = {cpu_b / cpu_a:.3f} "
              f"(A's turns {min(cpu_us['A']):.1f}-{max(cpu_us['A']):.1f}, "
              f"B's {min(cpu_us['B']):.1f}-{max(cpu_us['B']):.1f})")
        met = ratio >= 1 - noise_a
        print(f"target: B / A >= 1 - A's noise = {1 - noise_a:.3f}: {'MET' if met else 'MISSED'}")
        if scrape_times["A"] and scrape_times["B"]:
            ms = {k: statistics.median(v) * 1e3 for k, v in scrape_times.items()}
            print(f"GET /metrics under the load, median: A {ms['A']:.2f} ms, B {ms['B']:.2f} ms "
                  f"({len(scrape_times['A'])}, {len(scrape_times['B'])} scrapes)")
        print(f"load average after: {loadavg()}")
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()
