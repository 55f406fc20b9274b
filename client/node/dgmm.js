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

// A dgmm.v1.Dgmm client for "host:port" (plaintext unless `credentials`,
// e.g. grpc.credentials.createSsl(rootCa, clientKey, clientCert)). With
// `{ token }`, every call carries `authorization: Bearer <token>`, for
// servers started with --auth_token_file.
function createClient(address, credentials = grpc.credentials.createInsecure(), { token } = {}) {
  const options = {
    'grpc.max_send_message_length': -1,
    'grpc.max_receive_message_length': -1,
  };
  if (token) {
    options.interceptors = [(callOptions, nextCall) => new grpc.InterceptingCall(nextCall(callOptions), {
      start(metadata, listener, next) {
        metadata.set('authorization', `Bearer ${token}`);
        next(metadata, listener);
      },
    })];
  }
  return new dgmmProto.Dgmm(address, credentials, options);
}

function deadlineOf(options) {
  return options.timeoutMs === undefined ? undefined : new Date(Date.now() + options.timeoutMs);
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

function multiplyUnary(client, job, options) {
  return new Promise((resolve, reject) => {
    client.Multiply({ header: job.header, matrix: bytesOf(job.a) }, { deadline: deadlineOf(options) },
      (err, response) => {
        if (err) return reject(DgmmError.fromServiceError(err));
        if (response.result.length !== job.a.byteLength) {
          return reject(protocolError(`result has ${response.result.length} bytes, expected ${job.a.byteLength}`));
        }
        const out = new job.Ctor(job.a.length);
        bytesOf(out).set(response.result);
        resolve({ result: out, stats: response.stats });
      });
  });
}

function multiplyStream(client, job, options) {
  const blockBytes = options.blockBytes || DEFAULT_BLOCK_BYTES;
  if (job.lineBytes > blockBytes) {
    return Promise.reject(new RangeError(
      `dgmm: one line of the matrix is ${job.lineBytes} bytes, over the ${blockBytes}-byte block limit; use the other layout`));
  }
  const linesPerBlock = Math.floor(blockBytes / job.lineBytes);
  const out = new job.Ctor(job.a.length);
  const outBytes = bytesOf(out);
  const call = client.MultiplyStream({ deadline: deadlineOf(options) });
  const ended = new Promise((resolve) => call.on('status', resolve));

  const result = new Promise((resolve, reject) => {
    let accepted = false;
    let linesDone = 0;
    let stats = null;
    const fail = (err) => { call.cancel(); reject(err); };
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
        reject(protocolError(`the call ended after ${linesDone} of ${job.numLines} lines`));
      } else {
        resolve({ result: out, stats });
      }
    };
    call.on('error', () => {});
    call.on('end', () => { readEnded = true; finish(); });
    call.on('status', (status) => {
      if (status.code !== grpc.status.OK) return reject(new DgmmError(status.code, status.details, status.metadata));
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
// DgmmError when the call fails.
// options: layout ("row" | "col"), backend ("auto" | "cpu" | "cuda_kernel" |
// "cublas"), timeoutMs, stream (true/false forces MultiplyStream/Multiply;
// default: by size against unaryLimitBytes), unaryLimitBytes, blockBytes.
async function multiply(client, a, rows, cols, diag, side = 'right', options = {}) {
  const job = describeJob(a, rows, cols, diag, side, options);
  const stream = options.stream ??
    a.byteLength + job.header.diagonal.length > (options.unaryLimitBytes || DEFAULT_UNARY_LIMIT_BYTES);
  const done = await (stream ? multiplyStream : multiplyUnary)(client, job, options);
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

module.exports = { createClient, multiply, serverInfo, health, DgmmError, grpc };
