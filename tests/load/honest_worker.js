'use strict';
// One honest Node client process for tests/load (honest_load.py): it runs the
// jobs its Python driver (honest_worker.py --kind=node) hands it, one JSON line
// on stdin each, through client/node/dgmm.js with its default policy, and
// answers one JSON line per job on stdout. The driver makes the random inputs
// and checks the result against NumPy; this process only moves bytes:
//
//   in:  {"id", "a", "d", "out", "rows", "cols", "dtype": "f32"|"f64",
//         "layout": "row"|"col", "side", "stream": true|false|null, "timeoutMs"}
//        (a, d: raw little-endian files; out: where C goes, written only on OK)
//   out: {"id", "status": "OK"|codeName, "details", "attempts", "mode", "resumed"}
//
// The result array is poisoned with NaN before the call, so a line the client
// never wrote shows up as wrong in the driver's check.
//
//   node honest_worker.js ADDRESS

const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');

const dgmm = require(path.join(__dirname, '..', '..', 'client', 'node', 'dgmm.js'));

function readTyped(file, Ctor) {
  const buf = fs.readFileSync(file);
  // A copy into a fresh, aligned buffer.
  const out = new Ctor(buf.byteLength / Ctor.BYTES_PER_ELEMENT);
  new Uint8Array(out.buffer).set(buf);
  return out;
}

async function runJob(client, job) {
  const Ctor = job.dtype === 'f64' ? Float64Array : Float32Array;
  const a = readTyped(job.a, Ctor);
  const d = readTyped(job.d, Ctor);
  const out = new Ctor(a.length).fill(NaN);
  const options = { layout: job.layout, out, returnInfo: true, timeoutMs: job.timeoutMs };
  if (job.stream !== null && job.stream !== undefined) options.stream = job.stream;
  try {
    const { info } = await dgmm.multiply(client, a, job.rows, job.cols, d, job.side, options);
    fs.writeFileSync(job.out, new Uint8Array(out.buffer, out.byteOffset, out.byteLength));
    return { id: job.id, status: 'OK', details: '', attempts: info.attempts, mode: info.mode, resumed: info.resumed };
  } catch (e) {
    const info = e.info || {};
    return {
      id: job.id,
      status: e.codeName || 'EXCEPTION',
      details: String(e.details || e.message || e),
      attempts: info.attempts || 0,
      mode: info.mode || '',
      resumed: info.resumed || 0,
    };
  }
}

function main() {
  const address = process.argv[2];
  const client = dgmm.createClient(address);
  const rl = readline.createInterface({ input: process.stdin });
  let pending = 0;
  let closed = false;
  const finish = () => {
    if (closed && pending === 0) {
      client.close();
      process.exit(0);
    }
  };
  rl.on('line', (line) => {
    if (!line.trim()) return;
    const job = JSON.parse(line);
    pending += 1;
    runJob(client, job).then((reply) => {
      process.stdout.write(`${JSON.stringify(reply)}\n`);
      pending -= 1;
      finish();
    });
  });
  rl.on('close', () => {
    closed = true;
    finish();
  });
}

main();
