'use strict';
// node_client_phases: the user-space work the Node client (client/node/dgmm.js
// on grpc-js) does per N x N float32 job besides the network, timed phase by
// phase in one process with no server: what bench/python_client_bench.py's
// Node column pays on top of what the C++ client does (which encodes with
// slices that borrow the caller's matrix and decodes each result block
// straight into the output: proto/wire.h).
//
//   node bench/node_client_phases.js N [REPEATS]
//
// Per call, for the messages multiply() sends and receives with the default
// policy (one Multiply up to 4 MiB, else MultiplyStream blocks of
// floor(4 MiB / line bytes) lines):
//   encode    the service's requestSerialize (protobufjs: a new buffer, the
//             matrix bytes copied in);
//   frame     grpc-js's 5-byte gRPC frame (a new buffer, a second copy);
//   reassemble  grpc-js's StreamDecoder on the result arriving as 16 KiB
//             HTTP/2 DATA chunks (Buffer.concat: a copy);
//   decode    responseDeserialize (protobufjs; the bytes field is a view);
//   place     dgmm.js's outBytes.set(result) into options.out (a copy).
// (Node's http2 hands grpc-js each DATA frame as a slice of its socket read
// buffer, no copy.) Prints one line per phase: ms per call, and MB/s of
// matrix bytes, then the sum. The median of REPEATS (default 5).

const path = require('node:path');
const { performance } = require('node:perf_hooks');

const CLIENT_DIR = path.join(__dirname, '..', 'client', 'node');
const dgmm = require(path.join(CLIENT_DIR, 'dgmm.js'));
const { StreamDecoder } = require(require.resolve('@grpc/grpc-js/build/src/stream-decoder', { paths: [CLIENT_DIR] }));

const n = Number(process.argv[2]);
const repeats = Number(process.argv[3] || 5);
if (!(Number.isInteger(n) && n >= 1 && Number.isInteger(repeats) && repeats >= 1)) {
  process.stderr.write('usage: node bench/node_client_phases.js N [REPEATS]\n');
  process.exit(2);
}

const client = dgmm.createClient('127.0.0.1:1'); // Never connects: only its service definition is used.
const service = client.constructor.service;
client.close();

const a = new Float32Array(n * n);
for (let k = 0; k < a.length; k++) a[k] = Math.random() * 8 - 4;
const d = new Float32Array(n).fill(1.5);
const out = new Float32Array(a.length);
const outBytes = Buffer.from(out.buffer);
const lineBytes = 4 * n;
const matrixBytes = a.byteLength;
const unary = dgmm.transferMode(matrixBytes, d.byteLength, undefined, undefined, lineBytes) === 'unary';
const perBlock = dgmm.linesPerBlock(lineBytes);
const header = dgmm.describeJob(a, n, n, d, 'right', {}).header;
const bytes = (begin, end) => Buffer.from(a.buffer, begin, end - begin);

// The request and response messages of one call, as multiply() builds them.
const requests = [];
const responses = [];
if (unary) {
  requests.push([service.Multiply.requestSerialize, { header, matrix: bytes(0, matrixBytes) }]);
  responses.push([service.Multiply, { result: bytes(0, matrixBytes) }, 'result', 0]);
} else {
  requests.push([service.MultiplyStream.requestSerialize, { header }]);
  for (let first = 0; first < n; first += perBlock) {
    const stop = Math.min(first + perBlock, n);
    const data = bytes(first * lineBytes, stop * lineBytes);
    requests.push([service.MultiplyStream.requestSerialize, { block: { firstLine: first, data } }]);
    responses.push([service.MultiplyStream, { block: { firstLine: first, data } }, 'block', first * lineBytes]);
  }
}
// The responses as the server would send them: framed, in 16 KiB DATA chunks.
const CHUNK = 16 * 1024;
const wire = responses.map(([method, message, kind, offset]) => {
  const body = method.responseSerialize(message);
  const framed = Buffer.alloc(body.length + 5);
  framed.writeUInt32BE(body.length, 1);
  body.copy(framed, 5);
  const chunks = [];
  for (let s = 0; s < framed.length; s += CHUNK) chunks.push(Buffer.from(framed.subarray(s, s + CHUNK)));
  return { method, kind, offset, chunks };
});

const phases = { encode: [], frame: [], reassemble: [], decode: [], place: [] };
for (let r = 0; r < repeats; r++) {
  const t = { encode: 0, frame: 0, reassemble: 0, decode: 0, place: 0 };
  for (const [serialize, message] of requests) {
    let t0 = performance.now();
    const body = serialize(message);
    let t1 = performance.now();
    t.encode += t1 - t0;
    const framed = Buffer.allocUnsafe(body.length + 5); // grpc-js compression-filter.js
    framed.writeUInt8(0, 0);
    framed.writeUInt32BE(body.length, 1);
    body.copy(framed, 5);
    t0 = performance.now();
    t.frame += t0 - t1;
  }
  for (const { method, kind, offset, chunks } of wire) {
    const decoder = new StreamDecoder(-1);
    let t0 = performance.now();
    let framed = null;
    for (const chunk of chunks) {
      const got = decoder.write(chunk);
      if (got.length) framed = got[0];
    }
    let t1 = performance.now();
    t.reassemble += t1 - t0;
    const message = method.responseDeserialize(framed.subarray(5));
    t0 = performance.now();
    t.decode += t0 - t1;
    const data = kind === 'result' ? message.result : message.block.data;
    outBytes.set(data, offset);
    t1 = performance.now();
    t.place += t1 - t0;
  }
  for (const k of Object.keys(t)) phases[k].push(t[k]);
}
const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
if (Buffer.compare(Buffer.from(out.buffer), Buffer.from(a.buffer)) !== 0) throw new Error('the placed result differs from the bytes sent');
console.log(`# node_client_phases N=${n}: ${unary ? 'unary' : `stream, ${requests.length - 1} blocks of ${perBlock} lines`}, ` +
  `${(matrixBytes / 1e6).toFixed(1)} MB each way; median of ${repeats}; ${process.version}`);
let sum = 0;
for (const [k, xs] of Object.entries(phases)) {
  const ms = median(xs);
  sum += ms;
  console.log(`${k.padEnd(11)} ${ms.toFixed(3).padStart(10)} ms ${(matrixBytes / (ms / 1e3) / 1e6).toFixed(0).padStart(7)} MB/s`);
}
console.log(`${'sum'.padEnd(11)} ${sum.toFixed(3).padStart(10)} ms`);
