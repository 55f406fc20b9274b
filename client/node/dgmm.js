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
// Defaults for the unary/stream choice and the stream block size: gRPC's
// default message limit and the server's default max_block_bytes.
const DEFAULT_UNARY_LIMIT_BYTES = 4 * MIB - 1024;
const DEFAULT_BLOCK_BYTES = 4 * MIB;

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
  }

  static fromServiceError(err) {
    return new DgmmError(err.code ?? grpc.status.UNKNOWN, err.details ?? err.message, err.metadata);
  }
}

function protocolError(message) {
  return new DgmmError(grpc.status.INTERNAL, `dgmm client: server broke the protocol: ${message}`);
}

// Which failed jobs multiply() tries again, how often and after how long:
// the same policy as the C++ client (dgmm::RetryPolicy). A job is retried
// after UNAVAILABLE (nothing listening, the connection lost, a server
// draining), after a jittered exponential backoff; and after
// RESOURCE_EXHAUSTED that carries the `grpc-retry-pushback-ms` trailer (the
// admission queue was full), after the time it names. Other errors are final,
// and so is any error of a streamed job once a result block has arrived. No
// wait may end past the job's deadline (timeoutMs).
// The first attempt fails fast when there is no connection. A retried attempt
// first waits for the channel to connect, up to the deadline and at most
// maxReconnectWaitMs (no connection by then ends the job with UNAVAILABLE),
// and is then sent with waitForReady.
//   maxAttempts: attempts per job, the first included; 1 turns retries off.
//   initialBackoffMs: the wait before the second attempt after UNAVAILABLE;
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
// Marks a DgmmError of one attempt that must not be retried.
const FINAL = Symbol('dgmm.final');

function checkRetryPolicy(policy) {
  const p = { ...DEFAULT_RETRY_POLICY, ...policy };
  if (!(Number.isInteger(p.maxAttempts) && p.maxAttempts >= 1 && p.initialBackoffMs > 0 &&
        p.maxBackoffMs >= p.initialBackoffMs && p.backoffMultiplier >= 1 && p.maxReconnectWaitMs > 0)) {
    throw new RangeError('dgmm: retry: maxAttempts must be an integer >= 1, initialBackoffMs > 0, ' +
      'maxBackoffMs >= initialBackoffMs, backoffMultiplier >= 1 and maxReconnectWaitMs > 0');
  }
  return Object.freeze(p);
}

// Milliseconds to wait before attempt attemptsMade + 1 of a job whose attempt
// attemptsMade (1-based) failed with grpc.status `code`, or null when it must
// not be retried. pushbackMs: the failed call's grpc-retry-pushback-ms (null
// if absent); now and deadline (Infinity: none) in ms since the epoch;
// jitter in [-1, 1].
function retryDelay(policy, attemptsMade, code, pushbackMs, now, deadline, jitter) {
  if (attemptsMade >= policy.maxAttempts) return null;
  let wait = null;
  if (code === grpc.status.UNAVAILABLE) {
    const base = Math.min(policy.initialBackoffMs * policy.backoffMultiplier ** (attemptsMade - 1), policy.maxBackoffMs);
    wait = base * (1 + JITTER_FRACTION * Math.max(-1, Math.min(1, jitter)));
  } else if (code === grpc.status.RESOURCE_EXHAUSTED && pushbackMs !== null) {
    // Without the trailer the job itself is too large: retrying cannot help.
    wait = pushbackMs;
  }
  if (wait === null || now + wait >= deadline) return null;
  return wait;
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
//   channelOptions: more grpc-js channel options; they override these.
// Each client has its own connection (grpc.use_local_subchannel_pool) rather
// than sharing one with other clients of the same server in this process.
function createClient(address, credentials = grpc.credentials.createInsecure(), {
  token, retry, initialReconnectBackoffMs = 100, minReconnectBackoffMs = 2000, maxReconnectBackoffMs = 1000,
  channelOptions = {},
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
  return client;
}

function deadlineOf(options) {
  return options.timeoutMs === undefined ? undefined : new Date(Date.now() + options.timeoutMs);
}

// The call deadline for a job deadline in ms since the epoch (Infinity: none).
function callDeadline(deadline) {
  return deadline === Infinity ? undefined : new Date(deadline);
}

// Call metadata; waitForReady for retried attempts.
function callMetadata(retried) {
  return retried ? new grpc.Metadata({ waitForReady: true }) : new grpc.Metadata();
}

function final(err) {
  err[FINAL] = true;
  return err;
}

// Before a retried attempt: waits for the channel to connect, up to the job's
// deadline and the policy's maxReconnectWaitMs.
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

// Runs attempt(retried) until it succeeds or the policy says stop.
async function withRetries(client, deadline, attempt) {
  const policy = client[RETRY_POLICY] || DEFAULT_RETRY_POLICY;
  for (let made = 1; ; made++) {
    let error;
    try {
      if (made > 1) await awaitConnection(client, policy, deadline);
      return await attempt(made > 1);
    } catch (err) {
      if (!(err instanceof DgmmError)) throw err;
      error = err;
    }
    const wait = error[FINAL] ? null
      : retryDelay(policy, made, error.code, pushbackMs(error.metadata), Date.now(), deadline, Math.random() * 2 - 1);
    if (wait === null) {
      if (made === 1) throw error;
      throw new DgmmError(error.code, `${error.details} (after ${made} attempts)`, error.metadata);
    }
    await new Promise((r) => setTimeout(r, wait));
  }
}

function describeJob(a, rows, cols, diag, side, options) {
  const Ctor = a instanceof Float32Array ? Float32Array : a instanceof Float64Array ? Float64Array : null;
  if (!Ctor) throw new TypeError('dgmm: the matrix must be a Float32Array or a Float64Array');
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows * cols !== a.length) {
    throw new RangeError(`dgmm: ${a.length} elements do not make a ${rows} x ${cols} matrix`);
  }
  if (side !== 'right' && side !== 'left') throw new RangeError(`dgmm: side must be "right" or "left", got ${side}`);
  const layout = options.layout || 'row';
  if (layout !== 'row' && layout !== 'col') throw new RangeError(`dgmm: layout must be "row" or "col", got ${layout}`);
  const d = diag instanceof Ctor ? diag : Ctor.from(diag); // In the matrix's dtype.
  const colMajor = layout === 'col';
  return {
    Ctor,
    a,
    header: {
      rows,
      cols,
      dtype: Ctor === Float32Array ? 'DTYPE_FLOAT32' : 'DTYPE_FLOAT64',
      layout: colMajor ? 'LAYOUT_COL_MAJOR' : 'LAYOUT_ROW_MAJOR',
      side: side === 'left' ? 'SIDE_LEFT' : 'SIDE_RIGHT',
      backend: `BACKEND_${(options.backend || 'auto').toUpperCase()}`,
      diagonal: bytesOf(d),
    },
    numLines: colMajor ? cols : rows,
    lineBytes: (colMajor ? rows : cols) * Ctor.BYTES_PER_ELEMENT,
  };
}

// The typed array's bytes, without a copy.
function bytesOf(typed, begin = 0, end = typed.byteLength) {
  return Buffer.from(typed.buffer, typed.byteOffset + begin, end - begin);
}

// One attempt of a job; a rejection with a DgmmError marked FINAL is not retried.
function multiplyUnary(client, job, options, deadline, retried) {
  return new Promise((resolve, reject) => {
    client.Multiply({ header: job.header, matrix: bytesOf(job.a) }, callMetadata(retried),
      { deadline: callDeadline(deadline) },
      (err, response) => {
        if (err) return reject(DgmmError.fromServiceError(err));
        if (response.result.length !== job.a.byteLength) {
          return reject(final(protocolError(`result has ${response.result.length} bytes, expected ${job.a.byteLength}`)));
        }
        const out = new job.Ctor(job.a.length);
        bytesOf(out).set(response.result);
        resolve({ result: out, stats: response.stats });
      });
  });
}

// One attempt of a job; an error after a result block has arrived is FINAL.
function multiplyStream(client, job, options, deadline, retried) {
  const blockBytes = options.blockBytes || DEFAULT_BLOCK_BYTES;
  if (job.lineBytes > blockBytes) {
    return Promise.reject(new RangeError(
      `dgmm: one line of the matrix is ${job.lineBytes} bytes, over the ${blockBytes}-byte block limit; use the other layout`));
  }
  const linesPerBlock = Math.floor(blockBytes / job.lineBytes);
  const out = new job.Ctor(job.a.length);
  const outBytes = bytesOf(out);
  const call = client.MultiplyStream(callMetadata(retried), { deadline: callDeadline(deadline) });
  const ended = new Promise((resolve) => call.on('status', resolve));

  const result = new Promise((resolve, reject) => {
    let accepted = false;
    let linesDone = 0;
    let stats = null;
    const fail = (err) => { call.cancel(); reject(final(err)); };
    call.on('data', (message) => {
      if (message.kind === 'accepted' && !accepted) {
        accepted = true;
      } else if (message.kind === 'block' && accepted && !stats) {
        const { firstLine, data } = message.block;
        const lines = data.length / job.lineBytes;
        if (firstLine !== linesDone || !Number.isInteger(lines) || lines === 0 || linesDone + lines > job.numLines) {
          return fail(protocolError(`result block at line ${firstLine} of ${data.length} bytes, expected whole lines from line ${linesDone}`));
        }
        outBytes.set(data, linesDone * job.lineBytes);
        linesDone += lines;
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
      if (linesDone !== job.numLines || !stats) {
        reject(final(protocolError(`the call ended after ${linesDone} of ${job.numLines} lines`)));
      } else {
        resolve({ result: out, stats });
      }
    };
    call.on('error', () => {});
    call.on('end', () => { readEnded = true; finish(); });
    call.on('status', (status) => {
      if (status.code !== grpc.status.OK) {
        // Once part of the result has been delivered the job is not repeated.
        const err = new DgmmError(status.code, status.details, status.metadata);
        return reject(linesDone > 0 ? final(err) : err);
      }
      statusOk = true;
      finish();
    });
  });

  (async () => {
    // Respect flow control: wait for 'drain' when write() says the buffer is full.
    const send = async (message) => {
      if (!call.write(message)) await Promise.race([new Promise((r) => call.once('drain', r)), ended]);
    };
    await send({ header: job.header });
    for (let first = 0; first < job.numLines; first += linesPerBlock) {
      const last = Math.min(first + linesPerBlock, job.numLines);
      await send({ block: { firstLine: first, data: bytesOf(job.a, first * job.lineBytes, last * job.lineBytes) } });
    }
    call.end();
  })().catch(() => call.cancel());
  return result;
}

// Computes C = A·diag(diag) (side "right") or diag(diag)·A (side "left") for
// the rows x cols matrix `a` (Float32Array or Float64Array, row-major unless
// options.layout is "col"). Resolves to C as a new array of a's type and
// layout, or, with options.returnStats, to { result, stats }. Rejects with a
// DgmmError when the call fails, after the retries of the client's retry
// policy (see DEFAULT_RETRY_POLICY).
// options: layout ("row" | "col"), backend ("auto" | "cpu" | "cuda_kernel" |
// "cublas"), timeoutMs (for the whole job, all attempts included), stream
// (true/false forces MultiplyStream/Multiply; default: by size against
// unaryLimitBytes), unaryLimitBytes, blockBytes.
async function multiply(client, a, rows, cols, diag, side = 'right', options = {}) {
  const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
  const job = describeJob(a, rows, cols, diag, side, options);
  const stream = options.stream ??
    a.byteLength + job.header.diagonal.length > (options.unaryLimitBytes || DEFAULT_UNARY_LIMIT_BYTES);
  const attempt = stream ? multiplyStream : multiplyUnary;
  const done = await withRetries(client, deadline, (retried) => attempt(client, job, options, deadline, retried));
  return options.returnStats ? done : done.result;
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
  createClient, multiply, serverInfo, health, DgmmError, grpc, DEFAULT_RETRY_POLICY, retryDelay,
};
