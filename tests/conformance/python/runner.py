#!/usr/bin/env python3
"""Conformance runner for the Python client (tests/conformance/README.md).

  runner.py --case FILE --target TARGET   one case; prints one JSON line
  runner.py --vectors FILE                the policy vectors; prints one JSON line

Checks the installed package (the binding of the C++ client): ctest runs it
with the build's venv (tests/python/CMakeLists.txt), where client/python is
pip-installed; the source tree is taken off sys.path even when PYTHONPATH
names it.
"""

import argparse
import json
import math
import os
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
_SOURCE = os.path.join(REPO, "client", "python")
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _SOURCE]

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import dgmm  # noqa: E402
from dgmm import client as policy  # noqa: E402


def run_vectors(path):
    with open(path) as f:
        vectors = json.load(f)
    failed = []
    for i, v in enumerate(vectors):
        u = v["unary_limit"] or policy.DEFAULT_MAX_UNARY_MESSAGE_BYTES
        c = v["chunk_bytes"] or policy.DEFAULT_CHUNK_BYTES
        mode = policy.transfer_mode(v["matrix_bytes"], v["diag_bytes"], u, c, v["line_bytes"])
        k = policy.stripe_count(v["matrix_bytes"], v["lines"], v["stripes_option"])
        ranges = [list(r) for r in policy.stripe_ranges(v["lines"], k)]
        got = {"mode": mode, "stripes": k, "ranges": ranges}
        if "expect_lines_per_block" in v:
            got["lines_per_block"] = policy.lines_per_block(v["line_bytes"], c)
        want = {"mode": v["expect_mode"], "stripes": v["expect_stripes"],
                "ranges": v["expect_ranges"]}
        if "expect_lines_per_block" in v:
            want["lines_per_block"] = v["expect_lines_per_block"]
        if got != want:
            failed.append({"index": i, "got": got, "want": want})
    print(json.dumps({"vectors": len(vectors), "failed": failed}))
    return 1 if failed else 0


def run_case(path, target):
    with open(path) as f:
        case = json.load(f)
    opts = case.get("options") or {}
    out = {"name": case["name"], "status": "OK", "mode": None, "stripes": None, "attempts": 0,
           "checked": False, "max_abs_err": None, "message": ""}
    dtypes = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "complex64": "<c8",
              "complex128": "<c16"}
    dtype = np.dtype(dtypes[case["dtype"]])
    # The diagonals' dtype (default: A's), and C's: NumPy's result_type of the two.
    d_dtype = np.dtype(dtypes[case.get("diagonal_dtype") or case["dtype"]])
    c_dtype = np.result_type(dtype, d_dtype)
    order = "F" if case["layout"] == "col" else "C"
    rows, cols, side = case["rows"], case["cols"], case["side"]
    rng = np.random.default_rng(case["seed"])

    def draw(shape, of):
        x = rng.uniform(-4, 4, shape)
        if of.kind == "c":
            x = x + 1j * rng.uniform(-4, 4, shape)
        return x.astype(of)

    a = np.asarray(draw((rows, cols), dtype), order=order)
    if side == "both":
        d = (draw(rows, d_dtype), draw(cols, d_dtype))
    else:
        d = draw(cols if side == "right" else rows, d_dtype)
    c = np.full((rows, cols), np.nan, dtype=c_dtype, order=order)  # Poisoned.
    retry = None
    if opts.get("max_attempts") is not None:
        retry = dgmm.RetryPolicy(max_attempts=opts["max_attempts"])
    client = dgmm.Client(target, max_unary_message_bytes=opts.get("max_unary_message_bytes"),
                         chunk_bytes=opts.get("chunk_bytes"), retry=retry,
                         load_balancing_policy="round_robin")
    try:
        result, info = client.multiply(a, d, side=side, backend=case.get("backend", "auto"),
                                       timeout=opts.get("deadline_s"),
                                       stripes=opts.get("stripes"), out=c, return_info=True)
        out.update(mode=info.mode, stripes=info.stripes, attempts=info.attempts, resumed=info.resumed,
                   message="group %s, %d resumed" % (info.group_id or "-", info.resumed))
        if result is not c:
            raise AssertionError("the result did not land in the caller's array")
        out["result_dtype"] = result.dtype.name
        # float64 (complex128) from the inputs; per element, relative to
        # |reference| (the modulus for complex), a rounding or two of C's dtype.
        wide = np.complex128 if c_dtype.kind == "c" else np.float64
        a_w = a.astype(wide)
        if side == "both":
            reference = (d[0].astype(wide)[:, None] * a_w) * d[1].astype(wide)
        else:
            d_w = d.astype(wide)
            reference = a_w * d_w if side == "right" else d_w[:, None] * a_w
        err = np.abs(c.astype(wide) - reference)
        tol = {2: 2e-3, 4: 1e-6, 8: 1e-6 if c_dtype.kind == "c" else 1e-15, 16: 4e-15}[
            c_dtype.itemsize] * np.abs(reference)
        max_err = float(np.max(err)) if err.size else 0.0
        out["max_abs_err"] = max_err if math.isfinite(max_err) else str(max_err)
        out["checked"] = bool(np.all(np.isfinite(c)) and np.all(err <= tol))
        if not out["checked"]:
            out["message"] = "result differs from the float64 reference"
    except dgmm.DgmmError as e:
        out["status"] = e.code.name if isinstance(e.code, grpc.StatusCode) else str(e.code)
        out["message"] = e.details
        if e.info is not None:
            out.update(mode=e.info.mode, stripes=e.info.stripes, attempts=e.info.attempts)
    finally:
        client.close()
    print(json.dumps(out))
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case")
    parser.add_argument("--target")
    parser.add_argument("--vectors")
    args = parser.parse_args()
    if args.vectors:
        return run_vectors(args.vectors)
    if not args.case or not args.target:
        parser.error("--case and --target, or --vectors")
    return run_case(args.case, args.target)


if __name__ == "__main__":
    sys.exit(main())
