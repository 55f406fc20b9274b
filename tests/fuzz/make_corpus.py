#!/usr/bin/env python3
"""Writes the fuzz harnesses' seed corpora (tests/fuzz/corpus/HARNESS/):
a few valid and near-valid inputs each. Run from anywhere; rewrites the
seeds it owns and leaves other files alone."""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ----- validator: serialized dgmm.v1.JobHeader (proto3 wire format)
def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def header(rows, cols, dtype=1, layout=0, side=0, diag_bytes=None, backend=0):
    es = 8 if dtype == 2 else 4
    if diag_bytes is None:
        diag_bytes = (rows if side == 2 else cols) * es
    out = b""
    for field, value in ((1, rows), (2, cols), (3, dtype), (4, layout), (5, side)):
        if value:
            out += varint(field << 3) + varint(value)
    if diag_bytes:
        out += varint(6 << 3 | 2) + varint(diag_bytes) + b"\x00" * diag_bytes
    if backend:
        out += varint(7 << 3) + varint(backend)
    return out


write("validator", "f32_row_right_4x6", header(4, 6))
write("validator", "f64_col_left_3x2", header(3, 2, dtype=2, layout=2, side=2))
write("validator", "f32_cpu_1x1", header(1, 1, backend=1))
write("validator", "rows_zero", header(0, 6, diag_bytes=24))
write("validator", "rows_negative", header(-5, 6, diag_bytes=24))
write("validator", "overflow", header(1 << 40, 1 << 40, diag_bytes=0))
write("validator", "unknown_dtype", header(4, 6, dtype=7, diag_bytes=24))
write("validator", "unknown_side", header(4, 6, side=9))
write("validator", "diag_short", header(4, 6, diag_bytes=20))
write("validator", "wide_row", header(2, 100, dtype=2))
write("validator", "empty", b"")

# ----- stream_assembler: FuzzedDataProvider bytes (problem, then blocks)
rng = random.Random(8)
write("stream_assembler", "zeros", b"\x00" * 64)
write("stream_assembler", "ones", b"\x01" * 64)
write("stream_assembler", "ff", b"\xff" * 64)
for i in range(4):
    write("stream_assembler", "random%d" % i, bytes(rng.randrange(256) for _ in range(96)))


# ----- npy: .npy files
def npy(descr, fortran, shape, data_elems=None, version=1, es=None, pad_to=64):
    shape_text = "(%s)" % (", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shape_text)
    pre = 10 if version == 1 else 12
    pad = (pad_to - (pre + len(d) + 1) % pad_to) % pad_to
    hdr = (d + " " * pad + "\n").encode()
    length = struct.pack("<H", len(hdr)) if version == 1 else struct.pack("<I", len(hdr))
    n = 1
    for s in shape:
        n *= s
    if data_elems is None:
        data_elems = n
    es = es or (4 if descr.endswith("4") else 8)
    return b"\x93NUMPY" + bytes([version, 0]) + length + hdr + bytes(
        rng.randrange(256) for _ in range(data_elems * es))


write("npy", "f4_2x3_v1", npy("<f4", False, (2, 3)))
write("npy", "f8_3x1_fortran_v2", npy("<f8", True, (3, 1), version=2))
write("npy", "f4_5_v3", npy("<f4", False, (5,), version=3))
write("npy", "f8_0x4", npy("<f8", False, (0, 4)))
write("npy", "f4_2x3_truncated", npy("<f4", False, (2, 3), data_elems=5))
write("npy", "f8_big_endian", npy(">f8", False, (2, 2)))
write("npy", "i4_dtype", npy("<i4", False, (2, 2)))
write("npy", "f4_3d", npy("<f4", False, (2, 2, 2)))
write("npy", "not_npy", b"PK\x03\x04 not a numpy file")
