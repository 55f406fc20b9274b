#!/usr/bin/env python3
"""CuPy's l[:, None] * A * r and A * r at N = 10000 per dtype, next to a D2D
copy of the same bytes: the peer figures for bench/dtype_bench.

    python3 bench/dtype_cupy_bench.py [--n 10000] [--reps 30]

CuPy evaluates l[:, None] * A * r as two elementwise passes with a
temporary, in the dtype NumPy's rules give (float16 is computed per
operation, rounded after each product). CuPy has no bfloat16. Times are the
median of --reps runs by CUDA events after 3 warm-ups.
"""
import argparse

import cupy as cp


def time_ms(fn, reps):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    ms = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ms.append(cp.cuda.get_elapsed_time(start, stop))
    ms.sort()
    return ms[len(ms) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    n = args.n
    print(f"# CuPy {cp.__version__}: N = {n}, median of {args.reps}\n")
    print("| dtype | what | ms | ratio (copy ms / ms) |")
    print("|---|---|---:|---:|")
    rng = cp.random.default_rng(1)
    for name in ["float16", "float32", "float64", "complex64", "complex128"]:
        dt = cp.dtype(name)
        real = cp.float32 if dt in (cp.float16, cp.complex64) else cp.float64
        a = rng.random((n, n), dtype=real) + 0.5
        l = rng.random(n, dtype=real) + 0.5
        r = rng.random(n, dtype=real) + 0.5
        if dt.kind == "c":
            a = a + 1j * a[::-1]
            l, r = l + 0.5j, r - 0.25j
        a, l, r = a.astype(dt), l.astype(dt), r.astype(dt)
        c = cp.empty_like(a)
        copy = time_ms(lambda: cp.copyto(c, a), args.reps)
        one = time_ms(lambda: cp.multiply(a, r, out=c), args.reps)
        both = time_ms(lambda: l[:, None] * a * r, args.reps)
        print(f"| {name} | D2D copy (cp.copyto) | {copy:.4f} | 1.000 |")
        print(f"| {name} | A * r (out=C) | {one:.4f} | {copy / one:.3f} |")
        print(f"| {name} | l[:, None] * A * r | {both:.4f} | {copy / both:.3f} |")
        del a, c
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
