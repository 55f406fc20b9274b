'use strict';
// Node.js client for the dgmm service, C = A·diag(d) (side "right"),
// diag(d)·A ("left") or diag(l)·A·diag(r) ("both"): a binding of the C++
// client (dgmm::Client, client/cpp) through the addon build/dgmm.node.
// Everything the client decides -- unary or stream, striping, retries and
// resume, the same-host path, C's dtype -- is the C++ core's
// (docs/protocol.md section 9); this file converts arguments and errors.
// Jobs run on the addon's threads; typed arrays are read and written in place.

const os = require('node:os');
const path = require('node:path');

const native = require(path.join(__dirname, 'build', 'dgmm.node'));

if (os.endianness() !== 'LE') {
  throw new Error('dgmm: payloads are little-endian; this client only runs on little-endian hosts');
}

// grpc.status: the numeric gRPC status codes by name.
const status = Object.freeze({
  OK: 0, CANCELLED: 1, UNKNOWN: 2, INVALID_ARGUMENT: 3, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5,
  ALREADY_EXISTS: 6, PERMISSION_DENIED: 7, RESOURCE_EXHAUSTED: 8, FAILED_PRECONDITION: 9,
  ABORTED: 10, OUT_OF_RANGE: 11, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14,
  DATA_LOSS: 15, UNAUTHENTICATED: 16,
});
const CODE_NAMES = Object.fromEntries(Object.entries(status).map(([k, v]) => [v, k]));

// A failed call: `code` the numeric gRPC status, `codeName` its name,
// `details` the server's (or the client's) message, `retryAfterMs` the
// server's pushback when its admission queue was full (else null),
// `attempts` the attempts the job made, `info` the failed job's
// { mode, stripes, attempts } (null when it was refused before any call).
class DgmmError extends Error {
  constructor(code, details, { retryAfterMs = null, attempts = 0, info = null } = {}) {
    const codeName = CODE_NAMES[code] || String(code);
    super(`${codeName}: ${details}`);
    this.name = 'DgmmError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.retryAfterMs = retryAfterMs;
    this.attempts = attempts;
    this.info = info;
  }
}

// The addon's error value ({ code, message, attempts, retryAfterMs, info }).
function errorOf(e) {
  if (e instanceof Error) return e;
  return new DgmmError(e.code, e.message, { retryAfterMs: e.retryAfterMs, attempts: e.attempts, info: e.info || null });
}

function invalidArgument(details) {
  return new DgmmError(status.INVALID_ARGUMENT, details);
}

const D = native.defaults;
const DEFAULT_MAX_UNARY_MESSAGE_BYTES = D.maxUnaryMessageBytes;
const DEFAULT_CHUNK_BYTES = D.chunkBytes;
const SAME_HOST_MIN_BYTES = D.sameHostMinBytes;
const DEFAULT_RETRY_POLICY = Object.freeze({ ...D.retry });

// The dtypes by name: the wire value, the typed array holding them and
// numbers per element (complex: interleaved re, im).
const DTYPES = Object.freeze({
  float32: { wire: 1, Ctor: Float32Array, parts: 1 },
  float64: { wire: 2, Ctor: Float64Array, parts: 1 },
  float16: { wire: 3, Ctor: Uint16Array, parts: 1 },
  bfloat16: { wire: 4, Ctor: Uint16Array, parts: 1 },
  complex64: { wire: 5, Ctor: Float32Array, parts: 2 },
  complex128: { wire: 6, Ctor: Float64Array, parts: 2 },
});
const DTYPE_BY_WIRE = Object.fromEntries(Object.entries(DTYPES).map(([k, v]) => [v.wire, k]));
const SIDES = { right: 1, left: 2, both: 3 };
const LAYOUTS = { row: 1, col: 2 };

function checkDtypeName(name, what) {
  if (!Object.hasOwn(DTYPES, name)) {
    throw new RangeError(`dgmm: unknown ${what}dtype "${name}"; expected one of ${Object.keys(DTYPES).join(', ')}`);
  }
}

// C's dtype for A's and d's dtypes (the core's promotion, NumPy's result_type).
function resultDtype(a, d) {
  checkDtypeName(a, '');
  checkDtypeName(d, '');
  return DTYPE_BY_WIRE[native.promoteDtypes(DTYPES[a].wire, DTYPES[d].wire)];
}

// The policy's pure functions, the core's (checked by tests/conformance).
function unaryThreshold(maxUnaryMessageBytes = DEFAULT_MAX_UNARY_MESSAGE_BYTES, chunkBytes = DEFAULT_CHUNK_BYTES) {
  return native.unaryThreshold(maxUnaryMessageBytes, chunkBytes);
}
function transferMode(matrixBytes, diagBytes, maxUnaryMessageBytes = DEFAULT_MAX_UNARY_MESSAGE_BYTES,
  chunkBytes = DEFAULT_CHUNK_BYTES, lineBytes = 0) {
  return native.transferMode(matrixBytes + diagBytes, maxUnaryMessageBytes, chunkBytes, lineBytes);
}
function linesPerBlock(lineBytes, chunkBytes = DEFAULT_CHUNK_BYTES) {
  return native.linesPerBlock(lineBytes, chunkBytes);
}
function stripeCount(matrixBytes, lines, stripes = null) {
  return native.chooseStripes(matrixBytes, lines, checkStripes(stripes));
}
function stripeRanges(lines, k) {
  return native.splitLines(lines, k);
}
// Rule 3 as the core has it: ms before the next attempt, or null. deadline
// and now in ms (Infinity: none); fromServer: the status had `dgmm-origin: server`.
function retryDelay(policy, attemptsMade, code, pushbackMs, now, deadline, jitter, fromServer = true) {
  return native.retryDelay({ ...DEFAULT_RETRY_POLICY, ...policy }, attemptsMade, code, pushbackMs, now, deadline,
    jitter, fromServer);
}

// Rule 4: the Backend enum value of a name, or an INVALID_ARGUMENT DgmmError.
function backendOf(name) {
  try {
    return native.parseBackend(String(name));
  } catch (e) {
    throw errorOf(e);
  }
}

function checkStripes(stripes) {
  if (stripes === null || stripes === undefined) return 0;
  if (!Number.isInteger(stripes) || stripes < 1) {
    throw invalidArgument(`dgmm: stripes must be an integer >= 1 or null (auto), got ${stripes}`);
  }
  return stripes;
}

// The options createClient passes to the core.
const CLIENT_KEYS = ['token', 'loadBalancingPolicy', 'localSocket', 'sameHost', 'processMemory',
  'initialReconnectBackoffMs', 'minReconnectBackoffMs', 'maxReconnectBackoffMs', 'tls'];

// A client of `address` ("host:port", "dns:///name:port",
// "ipv4:h:p1,h:p2"). credentials: undefined (plaintext) or
// { rootCaPem, certChainPem, privateKeyPem, serverNameOverride } for TLS.
// Options: token (bearer token), retry (overrides of DEFAULT_RETRY_POLICY),
// initialReconnectBackoffMs, minReconnectBackoffMs, maxReconnectBackoffMs,
// loadBalancingPolicy ('round_robin'), localSocket (the server's local
// socket as this process sees it), sameHost (default true), processMemory
// (default true). A job whose stripes, chunkBytes or maxUnaryMessageBytes
// differ from the defaults runs on a core client made for them (its own
// connections), kept until close().
class Client {
  constructor(address, credentials, options = {}) {
    if (typeof address !== 'string' || address === '') throw new TypeError('dgmm: the address must be a string');
    const base = {};
    for (const key of CLIENT_KEYS) if (options[key] !== undefined) base[key] = options[key];
    if (credentials) base.tls = credentials;
    if (options.retry) {
      for (const [k, v] of Object.entries(options.retry)) if (v !== undefined) base[k] = v;
    }
    this.address = address;
    this.sameHost = options.sameHost !== false;
    this._base = base;
    this._cores = new Map();
    this._closed = false;
    this._core('');  // Checks the options now.
  }

  // The core client for these per-job settings.
  _core(key, extra) {
    if (this._closed) throw new DgmmError(status.CANCELLED, 'dgmm: the client is closed');
    let core = this._cores.get(key);
    if (!core) {
      try {
        core = new native.Client(this.address, { ...this._base, ...extra });
      } catch (e) {
        throw errorOf(e);
      }
      this._cores.set(key, core);
    }
    return core;
  }

  // The core client for a job's options.
  _coreFor(options) {
    const stripes = checkStripes(options.stripes);
    const chunk = options.chunkBytes ?? options.blockBytes ?? null;
    const unary = options.maxUnaryMessageBytes ?? options.unaryLimitBytes ?? null;
    const sameHost = options.sameHost ?? this.sameHost;
    if (stripes === 0 && chunk === null && unary === null && sameHost === this.sameHost) return this._core('');
    const extra = { stripes, sameHost };
    if (chunk !== null) extra.chunkBytes = chunk;
    if (unary !== null) extra.maxUnaryMessageBytes = unary;
    return this._core(`${stripes}/${chunk}/${unary}/${sameHost}`, extra);
  }

  // Ends the client's connections and its same-host session (the server
  // then drops its regions); jobs in flight finish first.
  close() {
    this._closed = true;
    for (const core of this._cores.values()) core.close();
    this._cores.clear();
  }
}

function createClient(address, credentials, options = {}) {
  return new Client(address, credentials, options);
}

// The dtype of a typed array as options name it, or as its type says.
function matrixDtype(a, named) {
  if (named !== undefined && named !== null) {
    checkDtypeName(named, 'matrix ');
    if (!(a instanceof DTYPES[named].Ctor)) {
      throw new TypeError(`dgmm: a ${named} matrix must be a ${DTYPES[named].Ctor.name}`);
    }
    return named;
  }
  if (a instanceof Float32Array) return 'float32';
  if (a instanceof Float64Array) return 'float64';
  if (a instanceof Uint16Array) {
    throw new TypeError('dgmm: a Uint16Array matrix holds float16 or bfloat16 patterns: name its dtype (options.dtype)');
  }
  throw new TypeError('dgmm: the matrix must be a Float32Array or a Float64Array (float32, float64, or with options.dtype complex64, complex128), or a Uint16Array with options.dtype float16 or bfloat16');
}

// A diagonal's dtype when options do not name one: a Float64Array is 64-bit
// and a Float32Array 32-bit floats of A's kind (real or complex); anything
// else (numbers, half patterns) A's dtype.
function diagonalDtypeOf(diag, dtype) {
  const complex = DTYPES[dtype].parts === 2;
  if (diag instanceof Float64Array) return complex ? 'complex128' : 'float64';
  if (diag instanceof Float32Array) return complex ? 'complex64' : 'float32';
  return dtype;
}

// A diagonal as the typed array of `dtype` (numbers are converted).
function diagonalOf(diag, dtype, which) {
  const { Ctor } = DTYPES[dtype];
  if (diag instanceof Ctor) return diag;
  if (Ctor !== Uint16Array && (Array.isArray(diag) || diag instanceof Float32Array || diag instanceof Float64Array)) {
    return Ctor.from(diag);
  }
  throw new TypeError(`dgmm: the ${which} must be a ${Ctor.name} of ${dtype}${Ctor === Uint16Array ? ' patterns' : ' (or an array of numbers)'}`);
}

// A job's arguments as the addon takes them: [a, dtype, rows, cols, layout,
// side, backend, d, dDtype, right, resultDtype, out], and C's array type.
function describeJob(a, rows, cols, diag, side, options) {
  const backend = backendOf(options.backend ?? 'auto');
  const dtype = matrixDtype(a, options.dtype);
  const { parts } = DTYPES[dtype];
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows * cols * parts !== a.length) {
    throw new RangeError(`dgmm: ${a.length} elements do not make a ${rows} x ${cols} ${dtype} matrix`);
  }
  if (!Object.hasOwn(SIDES, side)) throw new RangeError(`dgmm: side must be "right", "left" or "both", got ${side}`);
  const layout = options.layout || 'row';
  if (!Object.hasOwn(LAYOUTS, layout)) throw new RangeError(`dgmm: layout must be "row" or "col", got ${layout}`);
  let dDtype = options.diagonalDtype ?? null;
  if (dDtype !== null) checkDtypeName(dDtype, 'diagonal ');
  const stated = options.resultDtype ?? null;
  if (stated !== null) checkDtypeName(stated, 'result ');
  let d;
  let right = null;
  if (side === 'both') {
    if (!Array.isArray(diag) || diag.length !== 2 || typeof diag[0] === 'number') {
      throw new TypeError('dgmm: side "both" takes the diagonals as a pair [l, r]: C = diag(l)·A·diag(r)');
    }
    dDtype = dDtype ?? resultDtype(diagonalDtypeOf(diag[0], dtype), diagonalDtypeOf(diag[1], dtype));
    d = diagonalOf(diag[0], dDtype, 'left diagonal');
    right = diagonalOf(diag[1], dDtype, 'right diagonal');
  } else {
    dDtype = dDtype ?? diagonalDtypeOf(diag, dtype);
    d = diagonalOf(diag, dDtype, 'diagonal');
  }
  const cDtype = stated ?? resultDtype(dtype, dDtype);
  const C = DTYPES[cDtype];
  return {
    args: [a, DTYPES[dtype].wire, rows, cols, LAYOUTS[layout], SIDES[side], backend, d, DTYPES[dDtype].wire, right,
      stated === null ? 0 : C.wire, null],
    resultDtype: cDtype,
    OutCtor: C.Ctor,
    outLength: rows * cols * C.parts,
  };
}

function outputOf(job, out) {
  if (out === undefined || out === null) return new job.OutCtor(job.outLength);
  if (!(out instanceof job.OutCtor) || out.length !== job.outLength) {
    throw new TypeError(`dgmm: options.out must be a ${job.OutCtor.name} of ${job.outLength} elements (the result's dtype, ${job.resultDtype})`);
  }
  return out;
}

// One JobStats for a job from its parts' stats.
function mergedStats(list) {
  if (list.length <= 1) return list[0] || null;
  const merged = { ...list[0], group: null };
  for (const field of ['queueWaitNs', 'h2dNs', 'computeNs', 'd2hNs', 'totalNs']) {
    merged[field] = Math.max(...list.map((s) => s[field]));
  }
  merged.bytesIn = list.reduce((sum, s) => sum + s.bytesIn, 0);
  merged.bytesOut = list.reduce((sum, s) => sum + s.bytesOut, 0);
  return merged;
}

// A cancel token for `signal`, or null; throws CANCELLED when it is aborted.
function cancelOf(signal) {
  if (!signal) return null;
  if (signal.aborted) throw new DgmmError(status.CANCELLED, 'the job was cancelled before it started');
  const token = native.cancelToken();
  const onAbort = () => native.cancel(token);
  signal.addEventListener('abort', onAbort, { once: true });
  return { token, done: () => signal.removeEventListener('abort', onAbort) };
}

const MODES = { undefined: 0, null: 0, false: 1, true: 2 };

// Computes C for the rows x cols matrix `a` and resolves to C: a new typed
// array of the result dtype, or options.out filled in place; with
// options.returnStats to { result, stats }, with options.returnInfo to
// { result, stats, info }, info = { mode ('shm', 'unary' or 'stream'),
// stripes, attempts, resumed, groupId, stats (per part), socketReason,
// processMemory, sameHost (phases, s), traceparent }. Rejects with a DgmmError.
// Options: layout ('row' | 'col'), dtype, diagonalDtype, resultDtype,
// backend, timeoutMs (the whole job, every part and attempt), stream
// (true/false forces MultiplyStream/Multiply), stripes, chunkBytes,
// maxUnaryMessageBytes, sameHost, out, progress(linesDone, totalLines),
// signal (an AbortSignal: the job ends with CANCELLED), traceparent and
// tracestate (W3C trace context sent with every call of the job, every part
// and retry; none: the client makes a new traceparent for the job, in
// info.traceparent; docs/protocol.md "Trace context").
function multiply(client, a, rows, cols, diag, side = 'right', options = {}) {
  let job;
  let core;
  let out;
  let cancel;
  try {
    job = describeJob(a, rows, cols, diag, side, options);
    out = outputOf(job, options.out);
    core = client._coreFor(options);
    cancel = cancelOf(options.signal);
  } catch (e) {
    return Promise.reject(e);
  }
  job.args[11] = out;
  const wantInfo = Boolean(options.returnStats || options.returnInfo);
  let timeout;
  let trace;
  try {
    timeout = timeoutOf(options);
    trace = traceOf(options);
  } catch (e) {
    if (cancel) cancel.done();
    return Promise.reject(e);
  }
  return new Promise((resolve, reject) => {
    native.multiply(core, ...job.args, MODES[options.stream], timeout, options.progress || null,
      cancel ? cancel.token : null, wantInfo, (err, info) => {
        if (cancel) cancel.done();
        if (err) {
          reject(errorOf(err));
        } else if (!wantInfo) {
          resolve(out);
        } else {
          const done = { result: out, stats: mergedStats(info.stats) };
          if (options.returnInfo) done.info = info;
          resolve(done);
        }
      }, ...trace);
  });
}

// Many small jobs in one MultiplyBatch call. items: [{ a, rows, cols, diag,
// side, options: { layout, dtype, diagonalDtype, resultDtype, backend, out } }].
// Resolves to one entry per item: { result, stats } or { error: DgmmError };
// rejects (DgmmError) when the call itself fails. options: signal,
// traceparent and tracestate (as multiply's, for the one call).
function multiplyBatch(client, items, options = {}) {
  let jobs;
  let core;
  let cancel;
  let trace;
  try {
    trace = traceOf(options);
    jobs = items.map((item) => {
      const o = item.options || {};
      const job = describeJob(item.a, item.rows, item.cols, item.diag, item.side || 'right', o);
      job.args[11] = outputOf(job, o.out);
      return job;
    });
    core = client._core('');
    cancel = cancelOf(options.signal);
  } catch (e) {
    return Promise.reject(e);
  }
  return new Promise((resolve, reject) => {
    native.multiplyBatch(core, jobs.map((j) => j.args), cancel ? cancel.token : null, (err, done) => {
      if (cancel) cancel.done();
      if (err) return reject(errorOf(err));
      resolve(done.jobs.map((r, i) => (r.error ? { error: errorOf(r.error) } : { result: jobs[i].args[11], stats: r.stats })));
    }, ...trace);
  });
}

function call(fn, ...args) {
  return new Promise((resolve, reject) => {
    try {
      fn(...args, (err, value) => (err ? reject(errorOf(err)) : resolve(value)));
    } catch (e) {
      reject(errorOf(e));
    }
  });
}

// The traceparent and tracestate options: strings, or none (null).
function traceOf(options) {
  const out = [];
  for (const key of ['traceparent', 'tracestate']) {
    const v = options[key] ?? null;
    if (v !== null && typeof v !== 'string') throw new TypeError(`dgmm: ${key} must be a string`);
    out.push(v);
  }
  return out;
}

// A call's timeoutMs option: a number >= 0, or none (-1).
function timeoutOf(options) {
  const ms = options.timeoutMs ?? -1;
  if (typeof ms !== 'number' || Number.isNaN(ms)) throw new TypeError('dgmm: timeoutMs must be a number of ms');
  return ms;
}

// The server's GetServerInfoResponse (devices, budgets, limits). Not
// retried. options: timeoutMs (DEADLINE_EXCEEDED after it).
async function serverInfo(client, options = {}) {
  return call(native.serverInfo, client._core(''), timeoutOf(options));
}

// The grpc.health.v1 status ('SERVING', 'NOT_SERVING', ...) of `service`.
// Not retried. options: timeoutMs.
async function health(client, service = '', options = {}) {
  return call(native.health, client._core(''), service, timeoutOf(options));
}

module.exports = {
  Client, createClient, multiply, multiplyBatch, serverInfo, health, DgmmError, status,
  grpc: { status },  // the former grpc-js namespace's status codes
  DEFAULT_RETRY_POLICY, DEFAULT_MAX_UNARY_MESSAGE_BYTES, DEFAULT_CHUNK_BYTES, SAME_HOST_MIN_BYTES, DTYPES,
  resultDtype, unaryThreshold, transferMode, linesPerBlock, stripeCount, stripeRanges, retryDelay, backendOf,
  // For regions.js: the addon and the conversions.
  native, errorOf, call, describeJob,
};
