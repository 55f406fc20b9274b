'use strict';
// Conformance runner for the Node client (tests/conformance/README.md).
//   node runner.js --case FILE --target TARGET   one case; prints one JSON line
//   node runner.js --vectors FILE                the policy vectors; prints one JSON line
// Needs client/node's dependencies (npm ci in client/node).

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

async function runCase(file, target) {
  const c = JSON.parse(fs.readFileSync(file, 'utf8'));
  const opts = c.options || {};
  const out = { name: c.name, status: 'OK', mode: null, stripes: null, attempts: 0, checked: false, max_abs_err: null, message: '' };
  const Ctor = c.dtype === 'float32' ? Float32Array : Float64Array;
  const { rows, cols, side, layout } = c;
  const next = random(c.seed);
  const a = new Ctor(rows * cols);
  for (let i = 0; i < a.length; i++) a[i] = next();
  const d = new Ctor(side === 'right' ? cols : rows);
  for (let i = 0; i < d.length; i++) d[i] = next();
  const result = new Ctor(rows * cols).fill(NaN); // Poisoned.
  const client = dgmm.createClient(target, undefined, {
    loadBalancingPolicy: 'round_robin',
    retry: opts.max_attempts != null ? { maxAttempts: opts.max_attempts } : undefined,
  });
  // The lines the client placed, as its progress callback counts them (each
  // result block adds its lines): the job's lines when none was placed twice.
  let linesPlaced = 0;
  try {
    const done = await dgmm.multiply(client, a, rows, cols, d, side, {
      layout,
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
    const rtol = Ctor === Float32Array ? 1e-6 : 1e-15;
    let maxErr = 0;
    let ok = true;
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const idx = layout === 'col' ? j * rows + i : i * cols + j;
        const want = a[idx] * (side === 'right' ? d[j] : d[i]); // float64 arithmetic
        const err = Math.abs(result[idx] - want);
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
