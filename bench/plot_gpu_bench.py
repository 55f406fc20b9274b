#!/usr/bin/env python3
"""Plots gpu_bench's CSV (run here, not on the GPU machine).

    /usr/bin/python3 bench/plot_gpu_bench.py bench/results/kernel/h200_6b105dd/gpu_bench.csv bench/results/kernel/h200_6b105dd/gpu_bench.png

Left: the original question's table (float32, median ms, log scale), each
method kernel-only and with transfers. Right: our kernel's and cuBLAS dgmm's
bandwidth (read + write) against the device-to-device copy of the same bytes.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = list(csv.DictReader(line for line in open(src) if not line.startswith("#")))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))

    table = [r for r in rows if r["section"] == "table"]
    sizes = sorted({int(r["n"]) for r in table})
    series = [
        ("sgemm_dense_diag", "kernel_only", "SGEMM, dense diag"),
        ("sgemm_dense_diag", "with_transfers", "SGEMM + transfers"),
        ("cublas_sdgmm", "kernel_only", "cublasSdgmm"),
        ("cublas_sdgmm", "with_transfers", "cublasSdgmm + transfers"),
        ("dgmm_kernel", "kernel_only", "our kernel"),
        ("dgmm_kernel", "with_transfers", "our kernel + transfers"),
        ("d2d_copy", "ceiling", "D2D copy (ceiling)"),
    ]
    width = 0.8 / len(series)
    for i, (method, variant, label) in enumerate(series):
        ys = []
        for n in sizes:
            match = [float(r["ms_median"]) for r in table
                     if r["method"] == method and r["variant"] == variant and int(r["n"]) == n]
            ys.append(match[0] if match else float("nan"))
        xs = [j + (i - len(series) / 2) * width + width / 2 for j in range(len(sizes))]
        left.bar(xs, ys, width, label=label)
    left.set_xticks(range(len(sizes)))
    left.set_xticklabels([f"N={n}" for n in sizes])
    left.set_yscale("log")
    left.set_ylabel("median time, ms (log)")
    left.set_title("C = A·diag(d), float32 (the original question's sizes)")
    left.legend(fontsize=8)

    kern = [r for r in rows if r["section"] == "kernel"]
    by = defaultdict(dict)
    for r in kern:
        key = (r["method"], r["dtype"], r["variant"])
        by[key][int(r["n"])] = float(r["gbps"])
    for (method, dtype, variant), pts in sorted(by.items()):
        ns = sorted(pts)
        style = "--" if method == "d2d_copy" else "-"
        marker = {"dgmm_kernel": "o", "cublas_dgmm": "s", "d2d_copy": "x"}[method]
        right.plot(ns, [pts[n] for n in ns], style, marker=marker,
                   label=f"{method} {dtype} {variant}")
    right.set_xscale("log")
    right.set_xlabel("N (N×N matrix)")
    right.set_ylabel("GB/s (bytes read + written)")
    right.set_title("Bandwidth against the device-to-device copy")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
