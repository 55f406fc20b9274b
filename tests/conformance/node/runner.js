'use strict';
// Conformance runner for the Node client (tests/conformance/README.md).
//   node runner.js --case FILE --target TARGET   one case; prints one JSON line
//   node runner.js --vectors FILE                the policy vectors; prints one JSON line
// Needs client/node's addon (tests/node's node_package fixture builds it).

const fs = require('node:fs');
const path = require('node:path');

const dgmm = require(path.join(__dirname, '..', '..', '..', 'client', 'node'));
// The seeded generator of uniform values in [-4, 4) shared with tests/node.
const { random } = require(path.join(__dirname, '..', '..', 'support', 'random.js'));

function args() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const m = /^--(\w+)(?:=(.*))?$/.exec(argv[i]);
    if (!m) throw new Error(`unexpected argument ${argv[i]}`);
    out[m[1]] = m[2] !== undefined ? m[2] : argv[++i];
  }
  return out;
}

function runVectors(file) {
  const vectors = JSON.parse(fs.readFileSync(file, 'utf8'));
  const failed = [];
  vectors.forEach((v, index) => {
    const u = v.unary_limit ?? dgmm.DEFAULT_MAX_UNARY_MESSAGE_BYTES;
    const c = v.chunk_bytes ?? dgmm.DEFAULT_CHUNK_BYTES;
    const k = dgmm.stripeCount(v.matrix_bytes, v.lines, v.stripes_option);
    const got = { mode: dgmm.transferMode(v.matrix_bytes, v.diag_bytes, u, c, v.line_bytes), stripes: k, ranges: dgmm.stripeRanges(v.lines, k) };
    const want = { mode: v.expect_mode, stripes: v.expect_stripes, ranges: v.expect_ranges };
    if ('expect_lines_per_block' in v) {
      got.lines_per_block = dgmm.linesPerBlock(v.line_bytes, c);
      want.lines_per_block = v.expect_lines_per_block;
    }
    if (JSON.stringify(got) !== JSON.stringify(want)) failed.push({ index, got, want });
  });
  console.log(JSON.stringify({ vectors: vectors.length, failed }));
  return failed.length ? 1 : 0;
}

// The case dtypes: the typed array holding each (float16 as its 16-bit
// patterns, complex interleaved), and the relative error allowed per
// element (a rounding or two of it).
const DTYPES = {
  float16: { Ctor: Uint16Array, parts: 1, rtol: 2e-3 },
  float32: { Ctor: Float32Array, parts: 1, rtol: 1e-6 },
  float64: { Ctor: Float64Array, parts: 1, rtol: 1e-15 },
  complex64: { Ctor: Float32Array, parts: 2, rtol: 1e-6 },
  complex128: { Ctor: Float64Array, parts: 2, rtol: 4e-15 },
};

function halfToNumber(h) {
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (e === 31) return m ? NaN : sign * Infinity;
  if (e === 0) return sign * m * 2 ** -24;
  return sign * (1024 + m) * 2 ** (e - 25);
}

// NumPy's result_type of two case dtypes, computed here (not by the client):
// float16 with float32 gives float32; a real with a complex, the complex type
// whose parts are as wide as the wider of the two; otherwise the wider.
const RANK = { float16: 0, float32: 1, complex64: 1, float64: 2, complex128: 2 };
function promote(x, y) {
  if (x === y) return x;
  const rank = Math.max(RANK[x], RANK[y], 1);
  if (DTYPES[x].parts === 2 || DTYPES[y].parts === 2) return rank === 1 ? 'complex64' : 'complex128';
  return rank === 1 ? 'float32' : 'float64';
}

// The case dtype of a typed array of n elements.
function dtypeOfArray(v, n) {
  const complex = v.length === 2 * n;
  if (v instanceof Float64Array) return complex ? 'complex128' : 'float64';
  if (v instanceof Float32Array) return complex ? 'complex64' : 'float32';
  return v instanceof Uint16Array ? 'float16' : 'unknown';
}

// A finite number in float16's range to the nearest binary16 (ties to even).
function numberToHalf(x) {
  const sign = x < 0 ? 0x8000 : 0;
  const ax = Math.abs(x);
  let lo = 0;
  let hi = 0x7bff;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (halfToNumber(mid) <= ax) lo = mid; else hi = mid;
  }
  const below = ax - halfToNumber(lo);
  const above = halfToNumber(lo + 1) - ax;
  return sign | (above < below || (above === below && (lo & 1)) ? lo + 1 : lo);
}

async function runCase(file, target) {
  const c = JSON.parse(fs.readFileSync(file, 'utf8'));
  const opts = c.options || {};
  const out = { name: c.name, status: 'OK', mode: null, stripes: null, attempts: 0, checked: false, max_abs_err: null, message: '' };
  // A's dtype, the diagonals' (default: A's) and C's (their result type).
  const dDtype = c.diagonal_dtype ?? c.dtype;
  if (!DTYPES[c.dtype]) throw new Error(`dtype '${c.dtype}' is not valid`);
  if (!DTYPES[dDtype]) throw new Error(`diagonal_dtype '${dDtype}' is not valid`);
  const cDtype = promote(c.dtype, dDtype);
  const T = DTYPES[cDtype];
  const { rows, cols, side, layout } = c;
  const next = random(c.seed);
  // n values of `dtype` in its storage: a half type's 16-bit pattern, else
  // the number (complex: interleaved parts).
  const draw = (n, dtype) => {
    const { Ctor, parts } = DTYPES[dtype];
    const v = new Ctor(n * parts);
    for (let i = 0; i < v.length; i++) v[i] = Ctor === Uint16Array ? numberToHalf(next()) : next();
    return v;
  };
  const a = draw(rows * cols, c.dtype);
  const d = draw(side === 'right' ? cols : rows, dDtype);
  const r = side === 'both' ? draw(cols, dDtype) : null;
  const result = new T.Ctor(rows * cols * T.parts).fill(T.Ctor === Uint16Array ? 0x7e00 : NaN); // Poisoned.
  const client = dgmm.createClient(target, undefined, {
    loadBalancingPolicy: 'round_robin',
    retry: opts.max_attempts != null ? { maxAttempts: opts.max_attempts } : undefined,
  });
  // The lines the client placed, as its progress callback counts them (each
  // result block adds its lines): the job's lines when none was placed twice.
  let linesPlaced = 0;
  try {
    const done = await dgmm.multiply(client, a, rows, cols, side === 'both' ? [d, r] : d, side, {
      layout,
      dtype: c.dtype,
      diagonalDtype: dDtype,
      backend: c.backend ?? 'auto',
      timeoutMs: opts.deadline_s != null ? opts.deadline_s * 1000 : undefined,
      stripes: opts.stripes,
      chunkBytes: opts.chunk_bytes ?? undefined,
      maxUnaryMessageBytes: opts.max_unary_message_bytes ?? undefined,
      out: result,
      returnInfo: true,
      progress: (linesDone) => { linesPlaced = linesDone; },
    });
    const { info } = done;
    Object.assign(out, { mode: info.mode, stripes: info.stripes, attempts: info.attempts, resumed: info.resumed,
      message: `group ${info.groupId || '-'}, ${info.resumed} resumed`,
      placed_once: linesPlaced === (layout === 'col' ? cols : rows) });
    if (done.result !== result) throw new Error("the result did not land in the caller's array");
    // C's dtype as the array the client accepted and filled says (its type,
    // and two numbers per element for complex): the client refuses an out of
    // another dtype than the one it computes.
    out.result_dtype = dtypeOfArray(done.result, rows * cols);
    const rtol = T.rtol;
    let maxErr = 0;
    let ok = true;
    // Element k as [re, im] (float64), and products in float64.
    const load = (v, dtype, k) => (DTYPES[dtype].parts === 2 ? [v[2 * k], v[2 * k + 1]]
      : [DTYPES[dtype].Ctor === Uint16Array ? halfToNumber(v[k]) : v[k], 0]);
    const mul = (x, y) => [x[0] * y[0] - x[1] * y[1], x[0] * y[1] + x[1] * y[0]];
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const idx = layout === 'col' ? j * rows + i : i * cols + j;
        let want;
        const av = load(a, c.dtype, idx);
        if (side === 'both') want = mul(mul(load(d, dDtype, i), av), load(r, dDtype, j));
        else want = mul(av, load(d, dDtype, side === 'right' ? j : i));
        const got = load(result, cDtype, idx);
        const err = Math.hypot(got[0] - want[0], got[1] - want[1]);
        want = Math.hypot(want[0], want[1]);
        if (!(err <= rtol * Math.abs(want))) ok = false; // NaN fails too
        if (!(err <= maxErr)) maxErr = err;
      }
    }
    out.max_abs_err = Number.isFinite(maxErr) ? maxErr : String(maxErr);
    out.checked = ok;
    if (!ok) out.message = 'result differs from the float64 reference';
  } catch (err) {
    if (!(err instanceof dgmm.DgmmError)) throw err;
    out.status = err.codeName;
    out.message = err.details;
    if (err.info) Object.assign(out, { mode: err.info.mode, stripes: err.info.stripes, attempts: err.info.attempts });
  } finally {
    client.close();
  }
  console.log(JSON.stringify(out));
  return 0;
}

async function main() {
  const a = args();
  if (a.vectors) return runVectors(a.vectors);
  if (!a.case || !a.target) throw new Error('usage: runner.js --case FILE --target TARGET | --vectors FILE');
  return runCase(a.case, a.target);
}

main().then((code) => { process.exitCode = code; }, (err) => {
  console.error(err);
  process.exitCode = 2;
});
