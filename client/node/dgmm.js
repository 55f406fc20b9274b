'use strict';
// Node.js client for the dgmm service, C = A·diag(d) (side "right") or
// diag(d)·A (side "left"). The contract is loaded at run time from
// proto/dgmm/v1/dgmm.proto (override with DGMM_PROTO_DIR); nothing is generated.

const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.DGMM_PROTO_DIR || path.join(__dirname, '..', '..', 'proto');
const LOADER_OPTIONS = { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true };
const MIB = 1 << 20;
// MultiplySmall's limit (GetServerInfo limits.max_small_message_bytes), and
// the mark on a connection whose server answered it UNIMPLEMENTED.
const MAX_SMALL_MESSAGE_BYTES = 256 * 1024;
const NO_MULTIPLY_SMALL = Symbol('dgmm.noMultiplySmall');
// The client policy's defaults (docs/protocol.md section 9): U, the server's
// default max_unary_message_bytes, and C, the stream chunk.
const DEFAULT_MAX_UNARY_MESSAGE_BYTES = 16 * MIB;
const DEFAULT_CHUNK_BYTES = 4 * MIB;
// Auto striping: one part per 32 MiB of matrix, at most 8 parts.
const STRIPE_UNIT_BYTES = 32 * MIB;
const MAX_AUTO_STRIPES = 8;
// Rule 0: the same-host path takes jobs of at least this much matrix.
const SAME_HOST_MIN_BYTES = MIB;
// Rule 4: these backend names and nothing else.
const BACKEND_NAMES = Object.freeze({
  auto: 'BACKEND_AUTO',
  cpu: 'BACKEND_CPU',
  'cuda-kernel': 'BACKEND_CUDA_KERNEL',
  cublas: 'BACKEND_CUBLAS',
  BACKEND_AUTO: 'BACKEND_AUTO',
  BACKEND_CPU: 'BACKEND_CPU',
  BACKEND_CUDA_KERNEL: 'BACKEND_CUDA_KERNEL',
  BACKEND_CUBLAS: 'BACKEND_CUBLAS',
});

if (os.endianness() !== 'LE') {
  throw new Error('dgmm: payloads are little-endian; this client only runs on little-endian hosts');
}

const dgmmProto = grpc.loadPackageDefinition(
  protoLoader.loadSync('dgmm/v1/dgmm.proto', { ...LOADER_OPTIONS, includeDirs: [PROTO_DIR] })).dgmm.v1;

// grpc.health.v1 as protobuf.js JSON, from its two-message definition.
const healthProto = grpc.loadPackageDefinition(protoLoader.fromJSON({
  nested: { grpc: { nested: { health: { nested: { v1: { nested: {
    HealthCheckRequest: { fields: { service: { type: 'string', id: 1 } } },
    HealthCheckResponse: {
      fields: { status: { type: 'ServingStatus', id: 1 } },
      nested: { ServingStatus: { values: { UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 } } },
    },
    Health: { methods: { Check: { requestType: 'HealthCheckRequest', responseType: 'HealthCheckResponse' } } },
  } } } } } } },
}, LOADER_OPTIONS)).grpc.health.v1;

// A failed call: `code` is the numeric grpc.status, `codeName` its name
// ("INVALID_ARGUMENT", ...), `details` the server's message.
class DgmmError extends Error {
  constructor(code, details, metadata) {
    const codeName = Object.keys(grpc.status).find((k) => grpc.status[k] === code) || String(code);
    super(`${codeName}: ${details}`);
    this.name = 'DgmmError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.metadata = metadata;
    this.info = null; // multiply(): the failed job's info.
  }

  static fromServiceError(err) {
    return new DgmmError(err.code ?? grpc.status.UNKNOWN, err.details ?? err.message, err.metadata);
  }
}

function protocolError(message) {
  return new DgmmError(grpc.status.INTERNAL, `dgmm client: server broke the protocol: ${message}`);
}

// Which failed parts of a job multiply() tries again, how often and after how
// long: rule 3 of the client policy (docs/protocol.md section 9), the same in
// the C++ and Python clients. A dgmm server marks every error status it makes
// with the trailer `dgmm-origin: server`; a status without it comes from gRPC
// or the network. Each part (the whole job when it is not striped) is retried
// by itself after UNAVAILABLE (nothing listening, the connection lost, a
// server draining), after a jittered exponential backoff; after INTERNAL,
// UNKNOWN or RESOURCE_EXHAUSTED without `dgmm-origin: server` (a stream reset
// by the transport, "Received RST_STREAM with code 1"; a transport's memory
// quota; a broken proxy), after the same backoff; and after
// RESOURCE_EXHAUSTED that carries the `grpc-retry-pushback-ms` trailer (the
// admission queue was full), after the time it names. Other errors are final:
// dgmm's own INTERNAL and RESOURCE_EXHAUSTED without a pushback, CANCELLED,
// DEADLINE_EXCEEDED, every verdict on the request. A streamed part that fails
// with a retried error after some result blocks arrived is resumed: the retry
// sends only the lines not received yet. A retry goes to the next of the
// job's connections. No wait may end past the job's deadline (timeoutMs); the
// first final error cancels the other parts.
// Every attempt fails fast when there is no connection. A retried attempt
// first waits for its channel to connect, up to the deadline and at most
// maxReconnectWaitMs (no connection by then ends the job with UNAVAILABLE),
// and is then sent without waitForReady too: a connection lost after that
// wait (a server that exits at the end of its drain) fails the attempt at
// once instead of holding it until the deadline.
//   maxAttempts: attempts per part, the first included; 1 turns retries off.
//   initialBackoffMs: the wait before the second attempt after UNAVAILABLE
//     (or a transport failure);
//     each later one is backoffMultiplier times longer, up to maxBackoffMs;
//     every wait is jittered by +-20%.
const DEFAULT_RETRY_POLICY = Object.freeze({
  maxAttempts: 4,
  initialBackoffMs: 100,
  maxBackoffMs: 2000,
  backoffMultiplier: 2,
  maxReconnectWaitMs: 5000,
});
const JITTER_FRACTION = 0.2;
const RETRY_POLICY = Symbol('dgmm.retryPolicy');
// The client's striping connections: { get(i), list: [client, ...], closed }.
const STRIPES = Symbol('dgmm.stripes');
// Marks a DgmmError of one attempt that must not be retried.
const FINAL = Symbol('dgmm.final');
// createClient's localSocket option (read by regions.js).
const LOCAL_SOCKET = Symbol('dgmm.localSocket');
// createClient's sameHost option: multiply()'s default for options.sameHost.
const SAME_HOST = Symbol('dgmm.sameHost');

function checkRetryPolicy(policy) {
  const p = { ...DEFAULT_RETRY_POLICY, ...policy };
  if (!(Number.isInteger(p.maxAttempts) && p.maxAttempts >= 1 && p.initialBackoffMs > 0 &&
        p.maxBackoffMs >= p.initialBackoffMs && p.backoffMultiplier >= 1 && p.maxReconnectWaitMs > 0)) {
    throw new RangeError('dgmm: retry: maxAttempts must be an integer >= 1, initialBackoffMs > 0, ' +
      'maxBackoffMs >= initialBackoffMs, backoffMultiplier >= 1 and maxReconnectWaitMs > 0');
  }
  return Object.freeze(p);
}

// Rule 3 as a pure function: milliseconds to wait before attempt
// attemptsMade + 1 of a job whose attempt attemptsMade (1-based) failed with
// grpc.status `code`, or null when it must not be retried. pushbackMs: the
// failed call's grpc-retry-pushback-ms (null if absent); now and deadline
// (Infinity: none) in ms since the epoch; jitter in [-1, 1]; fromServer:
// whether the status carried `dgmm-origin: server` (madeByServer(metadata)).
function retryDelay(policy, attemptsMade, code, pushbackMs, now, deadline, jitter, fromServer = true) {
  if (attemptsMade >= policy.maxAttempts) return null;
  const backoff = () => {
    const base = Math.min(policy.initialBackoffMs * policy.backoffMultiplier ** (attemptsMade - 1), policy.maxBackoffMs);
    return base * (1 + JITTER_FRACTION * Math.max(-1, Math.min(1, jitter)));
  };
  let wait = null;
  if (code === grpc.status.UNAVAILABLE) {
    wait = backoff();
  } else if (code === grpc.status.RESOURCE_EXHAUSTED && pushbackMs !== null) {
    wait = pushbackMs; // The server's queue was full.
  } else if (!fromServer && (code === grpc.status.INTERNAL || code === grpc.status.UNKNOWN ||
                             code === grpc.status.RESOURCE_EXHAUSTED)) {
    // The transport's: a stream reset, its memory quota, a broken proxy. The
    // same codes from dgmm (a CUDA error, a job that can never fit) are final.
    wait = backoff();
  }
  if (wait === null || now + wait >= deadline) return null;
  return wait;
}

// Whether a failed call's trailing metadata says dgmm made its status
// (`dgmm-origin: server`).
function madeByServer(metadata) {
  const values = metadata && typeof metadata.get === 'function' ? metadata.get('dgmm-origin') : [];
  return values.length > 0 && String(values[0]) === 'server';
}

// The server's grpc-retry-pushback-ms trailer in `metadata`, or null.
function pushbackMs(metadata) {
  const values = metadata && typeof metadata.get === 'function' ? metadata.get('grpc-retry-pushback-ms') : [];
  if (values.length === 0 || !/^\d+$/.test(String(values[0]))) return null;
  return Number(values[0]);
}

// A dgmm.v1.Dgmm client for "host:port" (plaintext unless `credentials`,
// e.g. grpc.credentials.createSsl(rootCa, clientKey, clientCert)). Options:
//   token: every call carries `authorization: Bearer <token>`, for servers
//     started with --auth_token_file.
//   retry: overrides of DEFAULT_RETRY_POLICY's fields for multiply();
//     serverInfo and health are not retried.
//   initialReconnectBackoffMs (100), maxReconnectBackoffMs (1000): the
//     channel's reconnect backoff (grpc.initial_reconnect_backoff_ms,
//     grpc.max_reconnect_backoff_ms; grpc-js's own defaults are 1 s and
//     120 s): the wait after the first failed connection attempt, growing
//     1.6x per attempt up to the max, so a restarted server is found at most
//     about 1.2 * max after it is up.
//   minReconnectBackoffMs (2000): passed as grpc.min_reconnect_backoff_ms,
//     the minimum connect timeout of gRPC core clients (C++, Python);
//     grpc-js 1.14 does not read it.
//   loadBalancingPolicy: e.g. 'round_robin' (with an 'ipv4:h:p1,h:p2' or DNS
//     target: jobs and the parts of striped jobs spread over the replicas).
//   channelOptions: more grpc-js channel options; they override these.
//   localSocket: the path of the server's local socket as this process sees
//     it, for regions (regions.js); default: what GetServerInfo reports
//     (limits.localSocket), which is the server's own path. Set it in a
//     container that mounts the socket's directory elsewhere.
//   sameHost (true): multiply()'s default for its sameHost option (the
//     same-host path, same_host.js).
// Each client has its own connection (grpc.use_local_subchannel_pool) rather
// than sharing one with other clients of the same server in this process. A
// job striped into K parts uses K connections: the client itself and K - 1
// more grpc clients made when first needed (with the extra channel option
// 'dgmm.stripe': i, so each is its own channel and TCP connection), kept
// until client.close().
function createClient(address, credentials = grpc.credentials.createInsecure(), {
  token, retry, initialReconnectBackoffMs = 100, minReconnectBackoffMs = 2000, maxReconnectBackoffMs = 1000,
  loadBalancingPolicy, channelOptions = {}, localSocket, sameHost = true,
} = {}) {
  if (!(initialReconnectBackoffMs > 0 && maxReconnectBackoffMs >= initialReconnectBackoffMs && minReconnectBackoffMs > 0)) {
    throw new RangeError('dgmm: reconnect backoffs must be positive and maxReconnectBackoffMs >= initialReconnectBackoffMs');
  }
  const policy = checkRetryPolicy(retry);
  const options = {
    'grpc.max_send_message_length': -1,
    'grpc.max_receive_message_length': -1,
    'grpc.use_local_subchannel_pool': 1,
    'grpc.initial_reconnect_backoff_ms': Math.round(initialReconnectBackoffMs),
    'grpc.min_reconnect_backoff_ms': Math.round(minReconnectBackoffMs),
    'grpc.max_reconnect_backoff_ms': Math.round(maxReconnectBackoffMs),
    ...(loadBalancingPolicy ? {
      'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ [loadBalancingPolicy]: {} }] }),
    } : {}),
    ...channelOptions,
  };
  if (token) {
    options.interceptors = [(callOptions, nextCall) => new grpc.InterceptingCall(nextCall(callOptions), {
      start(metadata, listener, next) {
        metadata.set('authorization', `Bearer ${token}`);
        next(metadata, listener);
      },
    })];
  }
  const client = new dgmmProto.Dgmm(address, credentials, options);
  client[RETRY_POLICY] = policy;
  client[SAME_HOST] = sameHost !== false;
  if (localSocket !== undefined && localSocket !== null) {
    if (typeof localSocket !== 'string' || localSocket === '') throw new TypeError('dgmm: localSocket must be a path');
    client[LOCAL_SOCKET] = localSocket;
  }
  const stripes = {
    list: [client],
    closed: false,
    get(i) {
      // After close(), no part may open a connection that nothing closes.
      if (this.closed) throw new DgmmError(grpc.status.CANCELLED, 'dgmm: the client is closed');
      while (this.list.length <= i) {
        this.list.push(new dgmmProto.Dgmm(address, credentials, { ...options, 'dgmm.stripe': this.list.length }));
      }
      return this.list[i];
    },
  };
  client[STRIPES] = stripes;
  const closeOwn = client.close.bind(client);
  client.close = () => {
    stripes.closed = true;
    for (const other of stripes.list.slice(1)) other.close();
    stripes.list = [client];
    closeOwn();
  };
  return client;
}

function deadlineOf(options) {
  return options.timeoutMs === undefined ? undefined : new Date(Date.now() + options.timeoutMs);
}

// ---- The policy as pure functions (checked against tests/conformance/policy_vectors.json).

// Rule 1: the largest matrix + diagonal bytes sent as one Multiply,
// min(C, 7/8 of U) (in integers: min(C, floor(U / 8) * 7)).
function unaryThreshold(maxUnaryMessageBytes = DEFAULT_MAX_UNARY_MESSAGE_BYTES, chunkBytes = DEFAULT_CHUNK_BYTES) {
  return Math.min(chunkBytes, Math.floor(maxUnaryMessageBytes / 8) * 7);
}

// Rule 1: 'unary' or 'stream' for a job or one part of a striped job. A job
// whose one line (lineBytes; 0: unknown) is longer than C goes unary up to
// U - 64 KiB: no stream block the server takes could hold that line.
function transferMode(matrixBytes, diagBytes, maxUnaryMessageBytes = DEFAULT_MAX_UNARY_MESSAGE_BYTES,
  chunkBytes = DEFAULT_CHUNK_BYTES, lineBytes = 0) {
  const threshold = lineBytes > chunkBytes ? maxUnaryMessageBytes - 64 * 1024
    : unaryThreshold(maxUnaryMessageBytes, chunkBytes);
  return matrixBytes + diagBytes <= threshold ? 'unary' : 'stream';
}

// Rule 1: whole lines per stream block, max(1, floor(C / lineBytes)).
function linesPerBlock(lineBytes, chunkBytes = DEFAULT_CHUNK_BYTES) {
  return Math.max(1, Math.floor(chunkBytes / lineBytes));
}

// Rule 2: K. stripes: the caller's option (an integer >= 1) or null/undefined
// for auto, min(8, max(1, floor(matrixBytes / 32 MiB))); then at most lines.
function stripeCount(matrixBytes, lines, stripes = null) {
  let k;
  if (stripes === null || stripes === undefined) {
    k = Math.min(MAX_AUTO_STRIPES, Math.max(1, Math.floor(matrixBytes / STRIPE_UNIT_BYTES)));
  } else {
    if (!Number.isInteger(stripes) || stripes < 1) {
      throw invalidArgument(`dgmm: stripes must be an integer >= 1 or null (auto), got ${stripes}`);
    }
    k = stripes;
  }
  return Math.max(1, Math.min(k, lines));
}

// Rule 2: K contiguous [firstLine, count] ranges covering `lines`; the first
// lines % K ranges get one extra line.
function stripeRanges(lines, k) {
  const base = Math.floor(lines / k);
  const extra = lines % k;
  const ranges = [];
  let first = 0;
  for (let i = 0; i < k; i++) {
    const count = base + (i < extra ? 1 : 0);
    ranges.push([first, count]);
    first += count;
  }
  return ranges;
}

// Rule 4: the JobHeader.backend enum name of a backend name, or an
// INVALID_ARGUMENT DgmmError.
function backendEnumName(name) {
  if (typeof name === 'string' && Object.hasOwn(BACKEND_NAMES, name)) return BACKEND_NAMES[name];
  throw invalidArgument(`dgmm: unknown backend ${JSON.stringify(name)}; expected one of auto, cpu, ` +
    'cuda-kernel, cublas (or BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA_KERNEL, BACKEND_CUBLAS)');
}

// INVALID_ARGUMENT raised by the client itself, before any call.
function invalidArgument(details) {
  return new DgmmError(grpc.status.INVALID_ARGUMENT, details);
}

// The call deadline for a job deadline in ms since the epoch (Infinity: none).
function callDeadline(deadline) {
  return deadline === Infinity ? undefined : new Date(deadline);
}

// Call metadata. Never waitForReady: a retried attempt has waited for its
// connection already (awaitConnection, bounded by maxReconnectWaitMs), and a
// connection lost since (a server exiting at the end of its drain) must fail
// it at once, not hold it until the deadline.
function callMetadata() {
  return new grpc.Metadata();
}

function final(err) {
  err[FINAL] = true;
  return err;
}

// Before a retried attempt: waits for `client`'s channel to connect, up to
// the job's deadline and the policy's maxReconnectWaitMs.
function awaitConnection(client, policy, deadline) {
  const start = Date.now();
  const deadlineFirst = deadline - start <= policy.maxReconnectWaitMs;
  const until = deadlineFirst ? deadline : start + policy.maxReconnectWaitMs;
  return new Promise((resolve, reject) => {
    client.waitForReady(new Date(until), (err) => {
      if (!err) return resolve();
      const waited = Date.now() - start;
      // UNAVAILABLE either way: the server could not be reached.
      reject(final(new DgmmError(grpc.status.UNAVAILABLE,
        `no connection to the server within ${waited} ms (${deadlineFirst ? 'timeoutMs' : 'retry.maxReconnectWaitMs'})`)));
    });
  });
}

// The element types (docs/dtypes.md): the typed array that holds each (the
// half types as their 16-bit patterns in a Uint16Array, the complex ones
// as interleaved real and imaginary parts) and its values per element.
const DTYPES = {
  float16: { wire: 'DTYPE_FLOAT16', Ctor: Uint16Array, parts: 1 },
  bfloat16: { wire: 'DTYPE_BFLOAT16', Ctor: Uint16Array, parts: 1 },
  float32: { wire: 'DTYPE_FLOAT32', Ctor: Float32Array, parts: 1 },
  float64: { wire: 'DTYPE_FLOAT64', Ctor: Float64Array, parts: 1 },
  complex64: { wire: 'DTYPE_COMPLEX64', Ctor: Float32Array, parts: 2 },
  complex128: { wire: 'DTYPE_COMPLEX128', Ctor: Float64Array, parts: 2 },
};

// The width of each element type's real part: 0 half, 1 float32, 2 float64.
const REAL_RANK = { float16: 0, bfloat16: 0, float32: 1, complex64: 1, float64: 2, complex128: 2 };

// NumPy's result_type of two dtypes (by name), as the server computes it
// (docs/protocol.md "Element types"): float16 with bfloat16 gives float32
// (as ml_dtypes does); real with complex, the complex type wide enough for
// both; otherwise the wider.
function resultDtype(a, d) {
  if (!DTYPES[a] || !DTYPES[d]) throw new RangeError(`dgmm: unknown dtype "${DTYPES[a] ? d : a}"; expected one of ${Object.keys(DTYPES).join(', ')}`);
  if (a === d) return a;
  const rank = Math.max(REAL_RANK[a], REAL_RANK[d], 1);
  if (DTYPES[a].parts === 2 || DTYPES[d].parts === 2) return rank === 1 ? 'complex64' : 'complex128';
  return rank === 1 ? 'float32' : 'float64';
}

// The dtype a diagonal is sent as when options do not name one: a typed
// array's precision (Float32Array 32-bit, Float64Array 64-bit floats), of
// A's kind (real, or interleaved complex for a complex A); A's dtype for
// plain numbers and Uint16Array patterns.
function diagonalDtypeOf(diag, dtype) {
  const complex = DTYPES[dtype].parts === 2;
  if (diag instanceof Float64Array) return complex ? 'complex128' : 'float64';
  if (diag instanceof Float32Array) return complex ? 'complex64' : 'float32';
  return dtype;
}

// The dtype of `typed` as options name it (a dtype name), or as its type
// implies (float32, float64).
function dtypeOf(typed, named, what) {
  if (named !== undefined && named !== null) {
    const t = DTYPES[named];
    if (!t) throw new RangeError(`dgmm: unknown ${what} dtype "${named}"; expected one of ${Object.keys(DTYPES).join(', ')}`);
    return named;
  }
  if (typed instanceof Float32Array) return 'float32';
  if (typed instanceof Float64Array) return 'float64';
  if (typed instanceof Uint16Array) {
    throw new TypeError(`dgmm: a Uint16Array ${what} holds float16 or bfloat16 patterns: name its dtype (options.${what === 'matrix' ? 'dtype' : 'diagonalDtype'})`);
  }
  return null;
}

// One diagonal as the typed array of `dtype` it is sent as (a plain array
// of numbers is converted to it).
function diagonalOf(diag, dtype, which) {
  const { Ctor } = DTYPES[dtype];
  if (diag instanceof Ctor) return diag;
  // Numbers, or a float typed array, converted to the diagonal's type (the
  // other diagonal of a pair of two dtypes, widened to their result type).
  if (Ctor !== Uint16Array && (Array.isArray(diag) || diag instanceof Float32Array || diag instanceof Float64Array)) {
    return Ctor.from(diag);
  }
  throw new TypeError(`dgmm: the ${which} must be a ${Ctor.name} of ${dtype}${Ctor === Uint16Array ? ' patterns' : ' (or an array of numbers)'}`);
}

function describeJob(a, rows, cols, diag, side, options) {
  const backend = backendEnumName(options.backend ?? 'auto'); // Rule 4 first: refused before anything.
  const dtype = dtypeOf(a, options.dtype, 'matrix');
  if (!dtype || !(a instanceof DTYPES[dtype].Ctor)) {
    throw new TypeError('dgmm: the matrix must be a Float32Array or a Float64Array (float32, float64, or with options.dtype complex64, complex128), or a Uint16Array with options.dtype float16 or bfloat16');
  }
  const { Ctor, parts } = DTYPES[dtype];
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows * cols * parts !== a.length) {
    throw new RangeError(`dgmm: ${a.length} elements do not make a ${rows} x ${cols} ${dtype} matrix`);
  }
  if (side !== 'right' && side !== 'left' && side !== 'both') {
    throw new RangeError(`dgmm: side must be "right", "left" or "both", got ${side}`);
  }
  const layout = options.layout || 'row';
  if (layout !== 'row' && layout !== 'col') throw new RangeError(`dgmm: layout must be "row" or "col", got ${layout}`);
  // The diagonals: options.diagonalDtype, else as their typed arrays say
  // (diagonalDtypeOf). C: NumPy's result type of A and d (wider than A for
  // a wider or complex d), or options.resultDtype (the server checks it).
  let dDtype = options.diagonalDtype ?? null;
  if (dDtype !== null && !DTYPES[dDtype]) {
    throw new RangeError(`dgmm: unknown diagonal dtype "${dDtype}"; expected one of ${Object.keys(DTYPES).join(', ')}`);
  }
  const stated = options.resultDtype ?? null;
  if (stated !== null && !DTYPES[stated]) {
    throw new RangeError(`dgmm: unknown result dtype "${stated}"; expected one of ${Object.keys(DTYPES).join(', ')}`);
  }
  let d, right = null;
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
  const colMajor = layout === 'col';
  const lineElems = colMajor ? rows : cols;
  const elemBytes = Ctor.BYTES_PER_ELEMENT * parts;
  const outElemBytes = DTYPES[cDtype].Ctor.BYTES_PER_ELEMENT * DTYPES[cDtype].parts;
  const dElemBytes = DTYPES[dDtype].Ctor.BYTES_PER_ELEMENT * DTYPES[dDtype].parts;
  const header = {
    rows,
    cols,
    dtype: DTYPES[dtype].wire,
    layout: colMajor ? 'LAYOUT_COL_MAJOR' : 'LAYOUT_ROW_MAJOR',
    side: side === 'left' ? 'SIDE_LEFT' : side === 'both' ? 'SIDE_BOTH' : 'SIDE_RIGHT',
    backend,
    diagonal: bytesOf(d),
  };
  if (dDtype !== dtype) header.diagonalDtype = DTYPES[dDtype].wire;
  if (stated !== null) header.resultDtype = DTYPES[stated].wire;
  if (right) header.rightDiagonal = bytesOf(right);
  return {
    Ctor,
    // C: its dtype, typed array and length (elements of that array).
    resultDtype: cDtype,
    OutCtor: DTYPES[cDtype].Ctor,
    outLength: rows * cols * DTYPES[cDtype].parts,
    outBytes: rows * cols * outElemBytes,
    a,
    d,
    right,
    dElemBytes,
    colMajor,
    header,
    numLines: colMajor ? cols : rows,
    lineElems,
    lineBytes: lineElems * elemBytes,
    outLineBytes: lineElems * outElemBytes,
    // Rule 2: the diagonal runs along the split dimension (row-major LEFT,
    // column-major RIGHT; SIDE_BOTH: the left one row-major, the right one
    // column-major): a part gets its slice, else the whole diagonal.
    diagonalSliced: side === 'both' || (side === 'left') !== colMajor,
    slicedField: side === 'both' && colMajor ? 'rightDiagonal' : 'diagonal',
  };
}

// The JobHeader of lines [first, first + count); group: a JobGroup or null.
function partHeader(job, first, count, group) {
  const header = { ...job.header };
  if (job.colMajor) header.cols = count; else header.rows = count;
  if (job.diagonalSliced) {
    const whole = job.slicedField === 'rightDiagonal' ? job.right : job.d;
    header[job.slicedField] = bytesOf(whole, first * job.dElemBytes, (first + count) * job.dElemBytes);
  }
  if (group) header.group = group;
  return header;
}

// The typed array's bytes, without a copy.
function bytesOf(typed, begin = 0, end = typed.byteLength) {
  return Buffer.from(typed.buffer, typed.byteOffset + begin, end - begin);
}

// Rule 2: one random id per logical job, 16 lowercase hex characters.
function newGroupId() {
  return require('node:crypto').randomBytes(8).toString('hex');
}

// One logical job: its K parts, each with its retries and resumes (rule 3).
class Run {
  constructor(client, job, options, deadline, k) {
    this.client = client;
    this.job = job;
    this.options = options;
    this.deadline = deadline;
    this.k = k;
    this.policy = client[RETRY_POLICY] || DEFAULT_RETRY_POLICY;
    this.maxUnary = options.maxUnaryMessageBytes ?? options.unaryLimitBytes ?? DEFAULT_MAX_UNARY_MESSAGE_BYTES;
    this.chunk = options.chunkBytes ?? options.blockBytes ?? DEFAULT_CHUNK_BYTES;
    this.forced = options.stream === undefined || options.stream === null ? null : (options.stream ? 'stream' : 'unary');
    this.groupId = k > 1 ? newGroupId() : '';
    this.calls = new Set();
    this.error = null;
    this.attempts = 0;
    this.resumed = 0;
    this.modes = new Set();
    this.linesDone = 0;
    this.wakeups = new Set(); // Backoff waits, ended early when the job fails.
  }

  channel(i) {
    const stripes = this.client[STRIPES];
    return stripes ? stripes.get(i) : this.client;
  }

  fail(err) {
    if (this.error) return;
    this.error = err;
    for (const call of this.calls) call.cancel();
    for (const wake of this.wakeups) wake();
  }

  sleep(ms) {
    return new Promise((resolve) => {
      const wake = () => { clearTimeout(timer); this.wakeups.delete(wake); resolve(); };
      const timer = setTimeout(wake, ms);
      this.wakeups.add(wake);
    });
  }

  addProgress(lines) {
    this.linesDone += lines;
    if (this.options.progress) this.options.progress(this.linesDone, this.job.numLines);
  }

  async execute(out) {
    this.out = out;
    this.outBytes = bytesOf(out);
    const ranges = stripeRanges(this.job.numLines, this.k);
    const stats = await Promise.all(ranges.map(([first, count], i) => this.part(i, first, count).catch((err) => {
      this.fail(err instanceof DgmmError ? err : new DgmmError(grpc.status.INTERNAL, `dgmm client: ${err && err.stack || err}`));
      return null;
    })));
    const info = {
      mode: this.modes.size === 1 && this.modes.has('unary') ? 'unary' : 'stream',
      stripes: this.k,
      attempts: this.attempts,
      resumed: this.resumed,
      groupId: this.groupId,
      stats,
      socketReason: this.socketReason || '',
    };
    if (this.error) {
      this.error.info = info;
      throw this.error;
    }
    return info;
  }

  // Runs lines [first, first + count) to completion; resolves to the last
  // attempt's stats, or null after a failure (this.error then says why).
  async part(i, first, count) {
    const job = this.job;
    for (let made = 1; ; made++) {
      if (this.error) return null;
      this.attempts += 1;
      const client = this.channel((i + made - 1) % this.k);
      const group = this.k > 1 ? { id: this.groupId, firstLine: first, totalLines: job.numLines, parts: this.k } : null;
      const received = { lines: 0 };
      let error;
      try {
        if (made > 1) await awaitConnection(client, this.policy, this.deadline);
        if (this.error) return null;
        const header = partHeader(job, first, count, group);
        const mode = this.forced || transferMode(count * job.lineBytes, header.diagonal.length, this.maxUnary, this.chunk, job.lineBytes);
        this.modes.add(mode);
        if (mode === 'unary') return await this.unary(client, header, first, count);
        return await this.stream(client, header, first, count, received);
      } catch (err) {
        if (!(err instanceof DgmmError)) throw err;
        error = err;
      }
      if (this.error) return null;
      if (received.lines > 0) {
        // Resume: the lines received are kept; the retry sends the rest.
        first += received.lines;
        count -= received.lines;
        if (count === 0) return null; // Every line arrived; only the stats were lost.
      }
      const wait = error[FINAL] ? null
        : retryDelay(this.policy, made, error.code, pushbackMs(error.metadata), Date.now(), this.deadline,
          Math.random() * 2 - 1, madeByServer(error.metadata));
      if (wait === null) {
        this.fail(made === 1 ? error : new DgmmError(error.code, `${error.details} (after ${made} attempts)`, error.metadata));
        return null;
      }
      if (received.lines > 0) this.resumed += 1;
      await this.sleep(wait);
    }
  }

  unary(client, header, first, count) {
    const job = this.job;
    const begin = first * job.lineBytes;
    const end = (first + count) * job.lineBytes;
    // C's bytes of these lines (more than A's for a wider result dtype).
    const outBegin = first * job.outLineBytes;
    const outEnd = (first + count) * job.outLineBytes;
    const matrix = bytesOf(job.a, begin, end);
    // A small request goes with MultiplySmall (cheaper per call on the
    // server); the bound leaves room for the header's other fields.
    const diagonals = header.diagonal.length + (header.rightDiagonal ? header.rightDiagonal.length : 0);
    const small = !client[NO_MULTIPLY_SMALL] && matrix.length + diagonals + 1024 <= MAX_SMALL_MESSAGE_BYTES;
    return new Promise((resolve, reject) => {
      const send = (method) => {
        const call = client[method]({ header, matrix }, callMetadata(),
          { deadline: callDeadline(this.deadline) },
          (err, response) => {
            this.calls.delete(call);
            if (err && method === 'MultiplySmall' && err.code === grpc.status.UNIMPLEMENTED) {
              // A server older than MultiplySmall: Multiply, from now on
              // (unless the job failed meanwhile: fail() has cancelled its calls).
              client[NO_MULTIPLY_SMALL] = true;
              if (this.error) return reject(DgmmError.fromServiceError(err));
              return send('Multiply');
            }
            if (err) return reject(DgmmError.fromServiceError(err));
            if (response.result.length !== outEnd - outBegin) {
              return reject(final(protocolError(`result has ${response.result.length} bytes, expected ${outEnd - outBegin}`)));
            }
            this.outBytes.set(response.result, outBegin);
            this.addProgress(count);
            resolve(response.stats);
          });
        this.calls.add(call);
      };
      send(small ? 'MultiplySmall' : 'Multiply');
    });
  }

  // One streamed attempt of lines [first, first + count); received.lines
  // counts the result lines placed, for a resume.
  stream(client, header, first, count, received) {
    const job = this.job;
    const perBlock = linesPerBlock(job.lineBytes, this.chunk);
    const call = client.MultiplyStream(callMetadata(), { deadline: callDeadline(this.deadline) });
    this.calls.add(call);
    const ended = new Promise((resolve) => call.on('status', resolve));
    const result = new Promise((resolve, reject) => {
      let accepted = false;
      let stats = null;
      let settled = false;
      const settle = (fn, value) => {
        if (settled) return;
        settled = true;
        this.calls.delete(call);
        fn(value);
      };
      const fail = (err) => { call.cancel(); settle(reject, final(err)); };
      call.on('data', (message) => {
        if (settled) return;
        if (message.kind === 'accepted' && !accepted) {
          accepted = true;
        } else if (message.kind === 'block' && accepted && !stats) {
          const { firstLine, data } = message.block;
          const lines = data.length / job.outLineBytes;
          if (firstLine !== received.lines || !Number.isInteger(lines) || lines === 0 || received.lines + lines > count) {
            return fail(protocolError(`result block at line ${firstLine} of ${data.length} bytes, expected whole lines from line ${received.lines}`));
          }
          this.outBytes.set(data, (first + received.lines) * job.outLineBytes);
          received.lines += lines;
          this.addProgress(lines);
        } else if (message.kind === 'stats' && accepted && !stats) {
          stats = message.stats;
        } else {
          fail(protocolError(`unexpected \`${message.kind}\` message`));
        }
      });
      // The status decides. An OK status can come before the last 'data' has
      // been delivered, so success waits for 'end' too; 'error' repeats a
      // non-OK status and is listened to only so that it is not thrown.
      let statusOk = false;
      let readEnded = false;
      const finish = () => {
        if (!statusOk || !readEnded) return;
        if (received.lines !== count || !stats) {
          fail(protocolError(`the call ended after ${received.lines} of ${count} lines`));
        } else {
          settle(resolve, stats);
        }
      };
      call.on('error', () => {});
      call.on('end', () => { readEnded = true; finish(); });
      call.on('status', (status) => {
        if (status.code !== grpc.status.OK) {
          return settle(reject, new DgmmError(status.code, status.details, status.metadata));
        }
        statusOk = true;
        finish();
      });
    });

    (async () => {
      // Respect flow control: wait for 'drain' when write() says the buffer is full.
      let done = false;
      ended.then(() => { done = true; });
      const send = async (message) => {
        if (!call.write(message)) await Promise.race([new Promise((r) => call.once('drain', r)), ended]);
      };
      await send({ header });
      for (let start = 0; start < count && !done; start += perBlock) {
        const stop = Math.min(start + perBlock, count);
        await send({ block: { firstLine: start, data: bytesOf(job.a, (first + start) * job.lineBytes, (first + stop) * job.lineBytes) } });
      }
      if (!done) call.end();
    })().catch(() => call.cancel());
    return result;
  }
}

function checkOutput(job, out) {
  if (!(out instanceof job.OutCtor) || out.length !== job.outLength) {
    throw new TypeError(`dgmm: options.out must be a ${job.OutCtor.name} of ${job.outLength} elements (the result's dtype, ${job.resultDtype})`);
  }
  return out;
}

// Computes C = A·diag(diag) (side "right"), diag(diag)·A (side "left") or,
// with side "both" and diag a pair [l, r], diag(l)·A·diag(r), for the rows x
// cols matrix `a` (row-major unless options.layout is "col"): a Float32Array
// or Float64Array (float32, float64), or with options.dtype a Float32Array of
// interleaved complex64 or Float64Array of complex128 (re, im per element),
// or a Uint16Array of float16 or bfloat16 patterns; and resolves to C: a new
// array of a's layout and of the result dtype (NumPy's result_type of A and
// the diagonals, dgmm.resultDtype: a's dtype unless the diagonals' is wider
// or complex; options.resultDtype states a wider one), typed as that dtype
// is (a Float64Array for a float64 C of a Float32Array A), or options.out
// filled in place. The diagonals are of options.diagonalDtype, or else of
// their typed arrays' precision in a's kind (a Float64Array: float64 for a
// real A, complex128 for a complex one; a Float32Array: float32 or
// complex64), or else (plain numbers) of a's dtype; a real A with a complex
// diagonal needs options.diagonalDtype 'complex64' or 'complex128'. With
// side 'both' and l, r of two dtypes, both go as their result type. With
// options.returnStats, resolves
// to { result, stats } (for a striped job: byte counts summed over the parts,
// times the longest part's); with options.returnInfo, to { result, stats,
// info }, info = { mode, stripes, attempts, resumed, groupId, stats: [per part],
// socketReason }: mode 'shm' (the same-host path), 'unary' or 'stream';
// socketReason: why a job that could have taken the same-host path went
// over the socket ('' when it took it, or was not a candidate).
// Rejects with a DgmmError when the job fails, after the retries of the
// client's retry policy (see DEFAULT_RETRY_POLICY); its .info describes the
// failed job (null when the client refused it before any call).
// options (docs/protocol.md section 9 is the policy):
//   layout: 'row' | 'col'.
//   backend: 'auto' | 'cpu' | 'cuda-kernel' | 'cublas' (or 'BACKEND_AUTO', ...);
//     anything else rejects with INVALID_ARGUMENT before any call.
//   timeoutMs: one deadline for the whole job, all parts and attempts.
//   stream: true/false forces MultiplyStream/Multiply for every part; default:
//     unary when matrix + diagonal bytes <= min(chunkBytes, 7/8 maxUnaryMessageBytes).
//   maxUnaryMessageBytes (16 MiB; the server's --max_unary_message_bytes),
//     chunkBytes (4 MiB; stream blocks hold max(1, floor(chunkBytes / line bytes))
//     lines). unaryLimitBytes and blockBytes are their former names.
//   stripes: K parts sent at once over K connections; default (null) auto:
//     one per 32 MiB of matrix, at most 8 (jobs under 64 MiB: 1); at most
//     one per line.
//   out: a typed array of the result dtype's type and length for C.
//   resultDtype: C's dtype, the result type above or one it widens to
//     exactly (e.g. 'float64' for float32 A and d); others are refused by
//     the server.
//   progress(linesDone, totalLines): called as result lines arrive.
//   sameHost: true (default: createClient's sameHost, true): a job of at
//     least 1 MiB of matrix with `stream` unset goes through memory when the
//     server is on this host and takes regions (docs/protocol.md section 9,
//     rule 0; same_host.js): A is written into the client's staging region,
//     one MultiplyRegion computes in place, C is read back; info.mode 'shm'.
//     Otherwise, or when that path fails in a way the socket may not, the
//     socket, and info.socketReason says why. false: always the socket.
async function multiply(client, a, rows, cols, diag, side = 'right', options = {}) {
  const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
  const job = describeJob(a, rows, cols, diag, side, options);
  const k = stripeCount(a.byteLength, job.numLines, options.stripes ?? null);
  const out = options.out === undefined ? new job.OutCtor(job.outLength) : checkOutput(job, options.out);
  let socketReason = '';
  const sameHost = options.sameHost ?? client[SAME_HOST] ?? true;
  const forced = options.stream !== undefined && options.stream !== null;
  if (sameHost && !forced && a.byteLength >= SAME_HOST_MIN_BYTES) {
    let done;
    try {
      done = await require('./same_host').sameHostJob(client, job, out, options, deadline);
    } catch (err) {
      if (err instanceof DgmmError) err.info = shmInfo(null);
      throw err;
    }
    if (done.stats) return finished(options, out, shmInfo(done.stats));
    socketReason = done.socketReason;
  }
  const run = new Run(client, job, options, deadline, k);
  run.socketReason = socketReason;
  const info = await run.execute(out);
  return finished(options, out, info);
}

function shmInfo(stats) {
  return { mode: 'shm', stripes: 1, attempts: 1, resumed: 0, groupId: '', stats: stats ? [stats] : [], socketReason: '' };
}

function finished(options, out, info) {
  if (!options.returnStats && !options.returnInfo) return out;
  const done = { result: out, stats: mergedStats(info.stats) };
  if (options.returnInfo) done.info = info;
  return done;
}

// One JobStats for a job from its parts' stats.
function mergedStats(list) {
  const parts = list.filter((s) => s);
  if (parts.length <= 1) return parts[0] || null;
  const merged = { ...parts[0], group: null };
  for (const field of ['queueWaitNs', 'h2dNs', 'computeNs', 'd2hNs', 'totalNs']) {
    merged[field] = Math.max(...parts.map((s) => Number(s[field])));
  }
  merged.bytesIn = parts.reduce((sum, s) => sum + Number(s.bytesIn), 0);
  merged.bytesOut = parts.reduce((sum, s) => sum + Number(s.bytesOut), 0);
  return merged;
}

// Resolves to the server's GetServerInfoResponse (devices, budgets, limits).
function serverInfo(client, options = {}) {
  return new Promise((resolve, reject) => {
    client.GetServerInfo({}, { deadline: deadlineOf(options) },
      (err, response) => (err ? reject(DgmmError.fromServiceError(err)) : resolve(response)));
  });
}

// Resolves to the grpc.health.v1 status ("SERVING", "NOT_SERVING", ...) of
// `service` ("" = the whole server), over the dgmm client's channel.
function health(client, service = '', options = {}) {
  const checker = new healthProto.Health('unused', grpc.credentials.createInsecure(),
    { channelOverride: client.getChannel() });
  return new Promise((resolve, reject) => {
    checker.Check({ service }, { deadline: deadlineOf(options) },
      (err, response) => (err ? reject(DgmmError.fromServiceError(err)) : resolve(response.status)));
  });
}

module.exports = {
  createClient, multiply, serverInfo, health, DgmmError, grpc, DEFAULT_RETRY_POLICY, retryDelay, madeByServer,
  resultDtype,
  DEFAULT_MAX_UNARY_MESSAGE_BYTES, DEFAULT_CHUNK_BYTES, BACKEND_NAMES, SAME_HOST_MIN_BYTES,
  unaryThreshold, transferMode, linesPerBlock, stripeCount, stripeRanges, backendEnumName,
  describeJob,  // for regions.js: one set of input checks
  LOCAL_SOCKET, PROTO_DIR, LOADER_OPTIONS,  // for regions.js and local_socket.js
};
