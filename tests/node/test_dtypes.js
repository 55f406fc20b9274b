'use strict';
// Element types through the Node.js client: float16 and bfloat16 (Uint16Array
// with options.dtype), float32, float64, complex64 and complex128
// (interleaved typed arrays), a diagonal promoted into A's dtype, results
// of a wider dtype than A's (NumPy's result_type of A and d, typed as that
// dtype, or a stated options.resultDtype), side "both" with [l, r], both
// layouts, on Multiply, MultiplyStream, striping, the same-host path and
// SharedMemoryRegion.multiply, against the real server (CPU). Each element is compared bit for
// bit (any NaN equals any NaN) with a reference computed here from the
// definition (docs/dtypes.md): float32 products with Math.fround, complex
// products as (ac - bd) + (ad + bc)i, half results rounded once from float32.
// Run by ctest (node_dtypes), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_dtypes.js

const assert = require('node:assert/strict');

const { CLIENT_DIR, installDependencies, startServer, stopServer } = require('./support');

installDependencies();

const { test, before, after } = require('node:test');
const dgmm = require(CLIENT_DIR);

let server;
let client;
before(async () => {
  server = await startServer();
  client = dgmm.createClient(server.address);
});
after(async () => {
  if (client) client.close();
  if (server) await stopServer(server);
});

// ------------------------------------------------------- half conversions

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function halfToNumber(h) {
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (e === 31) return m ? NaN : sign * Infinity;
  if (e === 0) return sign * m * 2 ** -24;
  return sign * (1024 + m) * 2 ** (e - 25);
}

// A float32 value to binary16, to nearest, ties to even (by the value: the
// candidates are exact doubles).
function numberToHalf(x) {
  if (Number.isNaN(x)) return 0x7e00;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const ax = Math.abs(x);
  if (ax >= 65520) return sign | 0x7c00;
  // Largest pattern whose value is <= ax, then the nearer of it and the next.
  let lo = 0;
  let hi = 0x7c00;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (halfToNumber(mid) <= ax) lo = mid; else hi = mid;
  }
  const below = ax - halfToNumber(lo);
  const above = (lo + 1 === 0x7c00 ? 65536 : halfToNumber(lo + 1)) - ax;
  const b = above < below || (above === below && (lo & 1)) ? lo + 1 : lo;
  return sign | b;
}

function bf16ToNumber(b) {
  u32[0] = b << 16;
  return f32[0];
}

function numberToBf16(x) {
  f32[0] = x;
  const u = u32[0];
  if (Number.isNaN(f32[0])) return (u >>> 16) | 0x0040;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

// ----------------------------------------------------------------- dtypes

// For each dtype: its typed array, parts per element, decode/encode of one
// real part to a JS number, the product in the compute type.
const TYPES = {
  float16: { Ctor: Uint16Array, parts: 1, load: halfToNumber, store: numberToHalf, mul: (x, y) => Math.fround(x * y) },
  bfloat16: { Ctor: Uint16Array, parts: 1, load: bf16ToNumber, store: numberToBf16, mul: (x, y) => Math.fround(x * y) },
  float32: { Ctor: Float32Array, parts: 1, load: (v) => v, store: (v) => v, mul: (x, y) => Math.fround(x * y) },
  float64: { Ctor: Float64Array, parts: 1, load: (v) => v, store: (v) => v, mul: (x, y) => x * y },
  complex64: { Ctor: Float32Array, parts: 2, load: (v) => v, store: (v) => v, mul: (x, y) => Math.fround(x * y), add: (x, y) => Math.fround(x + y) },
  complex128: { Ctor: Float64Array, parts: 2, load: (v) => v, store: (v) => v, mul: (x, y) => x * y, add: (x, y) => x + y },
};

function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const SPECIALS = [0, -0, Infinity, -Infinity, NaN, 6e-8, -1e-40, 1e-310];

// Random real parts in `dtype`'s storage: values in (-2, 2), values near 1
// whose half products round, and specials.
function fill(dtype, n, next) {
  const t = TYPES[dtype];
  const out = new t.Ctor(n * t.parts);
  for (let i = 0; i < out.length; ++i) {
    const k = Math.floor(next() * 10);
    let v = k === 0 ? SPECIALS[Math.floor(next() * SPECIALS.length)]
      : k === 1 ? (1 + Math.floor(next() * 1024) / 1024) * (next() < 0.5 ? -1 : 1)
        : next() * 4 - 2;
    if (t.Ctor === Uint16Array) {
      f32[0] = v;
      v = f32[0];
      out[i] = t.store(v);
    } else {
      out[i] = v;
    }
  }
  return out;
}

// Element i as [re, im] numbers (a real diagonal widened to complex: +0).
function elem(dtype, arr, i) {
  const t = TYPES[dtype];
  return t.parts === 2 ? [arr[2 * i], arr[2 * i + 1]] : [t.load(arr[i]), 0];
}

// (x·y) in the result type `c`, x and y [re, im].
function product(c, x, y) {
  const t = TYPES[c];
  if (t.parts === 1) return [t.mul(x[0], y[0]), 0];
  return [t.add(t.mul(x[0], y[0]), -t.mul(x[1], y[1])), t.add(t.mul(x[0], y[1]), t.mul(x[1], y[0]))];
}

function sameBits(dtype, got, want) {
  const t = TYPES[dtype];
  if (t.Ctor === Uint16Array) {
    return got === want || (Number.isNaN(t.load(got)) && Number.isNaN(t.load(want)));
  }
  if (Number.isNaN(got) && Number.isNaN(want)) return true;
  return Object.is(got, want);
}

// `run(a, diag, opts)` resolves to C; by default dgmm.multiply on `client`.
// cDtype: the result's dtype (A's unless promoted wider).
async function check(dtype, dDtype, rows, cols, side, layout, options, seed, run = null,
  cDtype = dtype) {
  const next = rng(seed);
  const ta = TYPES[dtype];
  const t = TYPES[cDtype];
  const a = fill(dtype, rows * cols, next);
  const nl = side === 'right' ? cols : rows;
  const l = fill(dDtype, nl, next);
  const r = side === 'both' ? fill(dDtype, cols, next) : null;
  const diag = side === 'both' ? [l, r] : l;
  const opts = { sameHost: false, ...options, layout, dtype };
  if (dDtype !== dtype) opts.diagonalDtype = dDtype;
  const c = run ? await run(a, diag, opts) : await dgmm.multiply(client, a, rows, cols, diag, side, opts);
  assert.ok(c instanceof t.Ctor, `C is a ${t.Ctor.name}`);
  assert.equal(c.length, rows * cols * t.parts);
  assert.equal(a.length, rows * cols * ta.parts);
  let mismatches = 0;
  let first = '';
  for (let i = 0; i < rows; ++i) {
    for (let j = 0; j < cols; ++j) {
      const at = layout === 'row' ? i * cols + j : j * rows + i;
      let x = elem(dtype, a, at);
      if (side === 'left' || side === 'both') x = product(cDtype, elem(dDtype, l, i), x);
      if (side === 'right') x = product(cDtype, elem(dDtype, l, j), x);
      if (side === 'both') x = product(cDtype, x, elem(dDtype, r, j));
      const want = t.parts === 2 ? x : [t.Ctor === Uint16Array ? t.store(x[0]) : x[0]];
      const got = t.parts === 2 ? [c[2 * at], c[2 * at + 1]] : [c[at]];
      for (let p = 0; p < want.length; ++p) {
        if (!sameBits(cDtype, got[p], want[p]) && ++mismatches === 1) {
          first = `C[${i}][${j}] part ${p}: got ${got[p]} want ${want[p]}`;
        }
      }
    }
  }
  assert.equal(mismatches, 0, `${dtype} with ${dDtype} d into ${cDtype}, ${side}, ${layout}, ${JSON.stringify(options)}: ${first}`);
}

const PATHS = [{ stream: false }, { stream: true, chunkBytes: 256 }, { stripes: 3 }];

test('every dtype, side and layout on unary, stream and striped jobs', async () => {
  let seed = 1;
  for (const dtype of Object.keys(TYPES)) {
    for (const side of ['left', 'right', 'both']) {
      for (const layout of ['row', 'col']) {
        for (const options of PATHS) await check(dtype, dtype, 21, 13, side, layout, options, seed++);
      }
    }
  }
});

test('a diagonal promoted into the matrix dtype', async () => {
  let seed = 1000;
  for (const [dtype, dDtype] of [['float64', 'float32'], ['float32', 'float16'], ['complex64', 'float32'],
    ['complex128', 'complex64'], ['complex128', 'bfloat16'], ['float64', 'float16']]) {
    for (const side of ['right', 'both']) await check(dtype, dDtype, 9, 7, side, 'col', {}, seed++);
  }
});

// (A, d, C): NumPy's result_type(A, d) is C, wider than A.
const PROMOTED = [['float32', 'float64', 'float64'], ['float16', 'float32', 'float32'],
  ['float16', 'bfloat16', 'float32'], ['bfloat16', 'float16', 'float32'],
  ['float32', 'complex64', 'complex64'], ['float64', 'complex64', 'complex128'],
  ['float32', 'complex128', 'complex128']];

test('results of a wider dtype than the matrix, typed by the result dtype', async () => {
  let seed = 3000;
  for (const [dtype, dDtype, cDtype] of PROMOTED) {
    assert.equal(dgmm.resultDtype(dtype, dDtype), cDtype);
    for (const side of ['left', 'right', 'both']) {
      for (const layout of ['row', 'col']) {
        for (const options of PATHS) {
          await check(dtype, dDtype, 21, 13, side, layout, options, seed++, null, cDtype);
        }
      }
    }
  }
  // A stated wider result: float32 A and d into float64, float16 into
  // complex128.
  for (const [dtype, cDtype] of [['float32', 'float64'], ['float16', 'complex128']]) {
    for (const options of PATHS) {
      await check(dtype, dtype, 21, 13, 'both', 'col', { ...options, resultDtype: cDtype }, seed++,
        null, cDtype);
    }
  }
  // The diagonal's typed array says its precision: a Float64Array with a
  // Float32Array A gives a Float64Array C (NumPy's float32 * float64), and
  // out takes C's type; one of A's type is refused.
  const a = new Float32Array([1.5, -2, 3.25, 0.1, 7, -0.5]);
  const d = new Float64Array([0.1, 3, 1 / 3]);
  const c = await dgmm.multiply(client, a, 2, 3, d, 'right', { sameHost: false });
  assert.ok(c instanceof Float64Array);
  assert.deepEqual(Array.from(c), Array.from(a, (v, i) => v * d[i % 3]));
  const out = new Float64Array(6).fill(NaN);
  assert.equal(await dgmm.multiply(client, a, 2, 3, d, 'right', { out, stream: true }), out);
  assert.deepEqual(Array.from(out), Array.from(c));
  await assert.rejects(dgmm.multiply(client, a, 2, 3, d, 'right', { out: new Float32Array(6) }),
    (err) => err instanceof TypeError && /Float64Array of 6 elements \(the result's dtype, float64\)/.test(err.message));
});

// A job on a region: A written at 0, C at 0 (in place) or after A when
// wider, read back as C's typed array.
async function regionMultiply(regions, shm, regionClient, a, rows, cols, diag, side, opts) {
  const cDtype = dgmm.resultDtype(opts.dtype, opts.diagonalDtype ?? opts.dtype);
  const { Ctor, parts } = dgmm.DTYPES[cDtype];
  const cBytes = rows * cols * parts * Ctor.BYTES_PER_ELEMENT;
  const resultOffset = cBytes === a.byteLength ? 0 : Math.ceil(a.byteLength / 64) * 64;
  shm.write(a, 0);
  const stats = await regions.multiplyRegion(regionClient, {
    rows, cols, dtype: opts.dtype, layout: opts.layout, side, diagonalDtype: opts.diagonalDtype,
    diagonal: side === 'both' ? diag[0] : diag, right: side === 'both' ? diag[1] : null,
    matrix: shm.ref(0), result: shm.ref(resultOffset),
  });
  return { result: shm.read(new Ctor(rows * cols * parts), resultOffset), stats };
}

test('region jobs (multiplyRegion) of every dtype and side', async () => {
  const regions = require(require('node:path').join(CLIENT_DIR, 'regions.js'));
  const regionServer = await startServer(['--threads=2', '--allow_regions']);
  const regionClient = dgmm.createClient(regionServer.address);
  const shm = await regions.createSharedMemoryRegion(regionClient, 64 * 1024, 'node-dtypes');
  try {
    let seed = 2000;
    for (const dtype of Object.keys(TYPES)) {
      for (const side of ['left', 'both']) {
        for (const layout of ['row', 'col']) {
          await check(dtype, dtype, 19, 11, side, layout, {}, seed++, async (a, diag, opts) => {
            const { result, stats } = await regionMultiply(regions, shm, regionClient, a, 19, 11, diag, side, opts);
            assert.equal(stats.bytesOut, a.byteLength);
            return result;
          });
        }
      }
    }
    // C wider than A: after A in the region, read back as C's type.
    for (const [dtype, dDtype, cDtype] of PROMOTED) {
      await check(dtype, dDtype, 19, 11, 'both', 'col', {}, seed++, async (a, diag, opts) => {
        const { result, stats } = await regionMultiply(regions, shm, regionClient, a, 19, 11, diag, 'both', opts);
        assert.equal(stats.bytesOut, result.byteLength);
        assert.ok(result.byteLength > a.byteLength);
        return result;
      }, cDtype);
    }
    // The same-host path (A of 1 MiB and more), C wider than A.
    for (const [dtype, dDtype, cDtype] of [['float32', 'float64', 'float64'], ['float32', 'complex64', 'complex64']]) {
      await check(dtype, dDtype, 520, 513, 'both', 'col', {}, seed++, async (a, diag, opts) => {
        const { result, info } = await dgmm.multiply(regionClient, a, 520, 513, diag, 'both',
          { ...opts, sameHost: true, returnInfo: true });
        assert.equal(info.mode, 'shm', info.socketReason);
        return result;
      }, cDtype);
    }
  } finally {
    await shm.close();
    regionClient.close();
    await stopServer(regionServer);
  }
});

test('refusals name what is wrong', async () => {
  await assert.rejects(dgmm.multiply(client, new Uint16Array(6), 2, 3, new Uint16Array(3)),
    (err) => err instanceof TypeError && /name its dtype/.test(err.message));
  await assert.rejects(dgmm.multiply(client, new Float32Array(6), 2, 3, new Float32Array(3), 'both'),
    (err) => err instanceof TypeError && /pair \[l, r\]/.test(err.message));
  await assert.rejects(dgmm.multiply(client, new Float32Array(5), 2, 3, new Float32Array(3), 'right', { dtype: 'complex64' }),
    (err) => err instanceof RangeError && /2 x 3 complex64/.test(err.message));
  // cuBLAS has no half dgmm; the server says so.
  await assert.rejects(dgmm.multiply(client, new Uint16Array(6), 2, 3, new Uint16Array(3), 'right', { dtype: 'float16', backend: 'cublas' }),
    (err) => err instanceof dgmm.DgmmError && /BACKEND_CUBLAS/.test(err.details));
  // A stated result the promotion cannot widen to: the server says so.
  await assert.rejects(dgmm.multiply(client, new Float64Array(6), 2, 3, new Float64Array(3), 'right', { resultDtype: 'float32' }),
    (err) => err instanceof dgmm.DgmmError && /result_dtype float32 cannot hold the product of a float64 matrix/.test(err.details));
  // cuBLAS has no dgmm of a promoted result.
  await assert.rejects(dgmm.multiply(client, new Float32Array(6), 2, 3, new Float64Array(3), 'right', { backend: 'cublas' }),
    (err) => err instanceof dgmm.DgmmError && /BACKEND_CUBLAS/.test(err.details));
});
