'use strict';
// The server's local socket (docs/protocol.md "The local socket"; the
// messages are LocalRequest / LocalResponse in dgmm.proto): a Unix stream
// socket on the server's host where a client gets a region session. Every
// message is a frame, its length as 4 bytes little-endian then its protobuf
// bytes; requests are answered one by one, in order. The first request is a
// hello; the session it returns lasts while the connection stays open, and
// the server unregisters the session's regions when it closes.
//
// Node.js cannot send a descriptor (SCM_RIGHTS) without a native addon, so
// this client never sends pass_fd. It asks the server to open a POSIX
// shared-memory object by key instead (open_shm), which the server does only
// when the object is owned by this connection's uid and is neither group-
// nor world-writable.

const net = require('node:net');
const path = require('node:path');
const { DgmmError, grpc, PROTO_DIR, LOADER_OPTIONS } = require('./dgmm');

const MAX_FRAME = 4096;
const DEFAULT_TIMEOUT_MS = 10000;

// protobuf.js, the very copy @grpc/proto-loader loads dgmm.proto with, for
// the two messages that are not in any RPC (proto-loader makes serializers
// for methods only).
function loadLocalMessages() {
  const loaderDir = path.dirname(require.resolve('@grpc/proto-loader/package.json'));
  const protobuf = require(require.resolve('protobufjs', { paths: [loaderDir] }));
  const root = new protobuf.Root();
  root.resolvePath = (origin, target) => (path.isAbsolute(target) ? target : path.join(PROTO_DIR, target));
  root.loadSync('dgmm/v1/dgmm.proto', { keepCase: LOADER_OPTIONS.keepCase });
  root.resolveAll();
  return {
    LocalRequest: root.lookupType('dgmm.v1.LocalRequest'),
    LocalResponse: root.lookupType('dgmm.v1.LocalResponse'),
  };
}
let messages = null;

function encodeRequest(request) {
  messages ??= loadLocalMessages();
  const body = messages.LocalRequest.encode(messages.LocalRequest.fromObject(request)).finish();
  if (body.length > MAX_FRAME) throw new RangeError(`dgmm: local request of ${body.length} bytes (at most ${MAX_FRAME})`);
  const frame = Buffer.alloc(4 + body.length);
  frame.writeUInt32LE(body.length, 0);
  frame.set(body, 4);
  return frame;
}

function decodeResponse(body) {
  messages ??= loadLocalMessages();
  return messages.LocalResponse.toObject(messages.LocalResponse.decode(body), LOADER_OPTIONS);
}

function socketError(err, socketPath) {
  const code = err.code === 'EACCES' || err.code === 'EPERM' ? grpc.status.PERMISSION_DENIED : grpc.status.UNAVAILABLE;
  return new DgmmError(code, `dgmm: local socket ${socketPath}: ${err.message}` +
    (err.code === 'ENOENT' ? ' (a client in another container or mount namespace: pass the path it sees as localSocket)' : ''));
}

// One connection to the local socket, after its hello. Use open() to make one.
//   session: the secret to send as `dgmm-session` with region RPCs.
//   hello: the server's LocalHelloReply { session, uid, gid, pid, instanceId,
//     maxTickets, ticketTimeoutMs }.
//   path: the socket's path as this process reached it.
//   closed: a promise that resolves when the connection has closed.
class LocalSession {
  constructor(socket, socketPath) {
    this.socket = socket;
    this.path = socketPath;
    this.session = null;
    this.hello = null;
    this.isClosed = false;
    this.pending = []; // { resolve, reject, timer }, in the order sent
    this.input = Buffer.alloc(0);
    this.closed = new Promise((resolve) => socket.once('close', resolve));
    socket.on('data', (data) => this.onData(data));
    socket.on('error', (err) => this.fail(socketError(err, socketPath)));
    socket.on('close', () => this.fail(new DgmmError(grpc.status.UNAVAILABLE,
      `dgmm: the local socket ${socketPath} closed; the session and its regions are gone`)));
  }

  // Connects to socketPath and says hello. expectedInstanceId (from
  // GetServerInfo): the socket must belong to that server, else
  // FAILED_PRECONDITION.
  static async open(socketPath, { expectedInstanceId = null, timeoutMs = DEFAULT_TIMEOUT_MS } = {}) {
    const socket = net.createConnection({ path: socketPath });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new DgmmError(grpc.status.DEADLINE_EXCEEDED, `dgmm: no connection to the local socket ${socketPath} within ${timeoutMs} ms`));
      }, timeoutMs);
      socket.once('connect', () => { clearTimeout(timer); resolve(); });
      socket.once('error', (err) => { clearTimeout(timer); reject(socketError(err, socketPath)); });
    });
    const s = new LocalSession(socket, socketPath);
    try {
      const reply = await s.request({ hello: {} }, timeoutMs).catch((err) => {
        if (err.codeName !== 'UNAVAILABLE') throw err;
        throw new DgmmError(err.code, `${err.details} before its hello reply: the server refused the ` +
          'connection (its --max_local_connections, a quarter of them per uid?)', err.metadata);
      });
      if (!reply.hello || !reply.hello.session) throw new DgmmError(grpc.status.INTERNAL, 'dgmm: the local socket answered hello without a session');
      if (expectedInstanceId !== null && reply.hello.instanceId !== expectedInstanceId) {
        throw new DgmmError(grpc.status.FAILED_PRECONDITION,
          `dgmm: the local socket ${socketPath} belongs to another server (instance ${reply.hello.instanceId}, ` +
          `not ${expectedInstanceId}): pass the path under which this host sees the socket of the server called`);
      }
      s.hello = reply.hello;
      s.session = reply.hello.session;
      return s;
    } catch (err) {
      s.close();
      throw err;
    }
  }

  // Asks the server to open the POSIX shared-memory object `key` ("/name")
  // for this session. Resolves to a LocalTicket { ticket, objectBytes,
  // sealed }: name the ticket in RegisterRegion's localFd within
  // hello.ticketTimeoutMs. Rejects with a DgmmError: NOT_FOUND (no such
  // object), PERMISSION_DENIED (not a regular object of this uid writable by
  // it alone), INVALID_ARGUMENT (a bad key), RESOURCE_EXHAUSTED (too many
  // unclaimed tickets).
  async openShm(key, { timeoutMs = DEFAULT_TIMEOUT_MS } = {}) {
    const reply = await this.request({ openShm: { key } }, timeoutMs);
    if (!reply.ticket || !reply.ticket.ticket) throw new DgmmError(grpc.status.INTERNAL, 'dgmm: the local socket answered open_shm without a ticket');
    return reply.ticket;
  }

  // One request and its response (a LocalResponse object); a response whose
  // code is not OK rejects with a DgmmError of that code. A reply that does
  // not come within timeoutMs closes the connection: replies come in order,
  // and a late one would be taken for the next request's.
  request(request, timeoutMs = DEFAULT_TIMEOUT_MS) {
    if (this.isClosed) {
      return Promise.reject(new DgmmError(grpc.status.UNAVAILABLE, `dgmm: the local socket ${this.path} is closed`));
    }
    const frame = encodeRequest(request);
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject, timer: null };
      entry.timer = setTimeout(() => {
        this.fail(new DgmmError(grpc.status.DEADLINE_EXCEEDED, `dgmm: the local socket ${this.path} did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.push(entry);
      this.socket.ref(); // An answer is awaited: keep the process alive for it.
      this.socket.write(frame);
    }).then((response) => {
      if (response.code !== 0) throw new DgmmError(response.code, response.message);
      return response;
    });
  }

  onData(data) {
    this.input = this.input.length === 0 ? data : Buffer.concat([this.input, data]);
    while (this.input.length >= 4) {
      const length = this.input.readUInt32LE(0);
      if (length > 1 << 20) {
        this.fail(new DgmmError(grpc.status.INTERNAL, `dgmm: the local socket sent a frame of ${length} bytes`));
        return;
      }
      if (this.input.length < 4 + length) break;
      const body = this.input.subarray(4, 4 + length);
      this.input = this.input.subarray(4 + length);
      const entry = this.pending.shift();
      if (!entry) {
        this.fail(new DgmmError(grpc.status.INTERNAL, 'dgmm: the local socket sent a reply nobody asked for'));
        return;
      }
      clearTimeout(entry.timer);
      let response;
      try {
        response = decodeResponse(body);
      } catch (err) {
        entry.reject(new DgmmError(grpc.status.INTERNAL, `dgmm: a local socket reply does not parse: ${err.message}`));
        this.fail(null);
        return;
      }
      entry.resolve(response);
    }
    // Idle: the open connection alone does not keep the process alive (its
    // exit closes it, and the server drops the session's regions).
    if (this.pending.length === 0 && !this.isClosed) this.socket.unref();
  }

  // Ends the connection; pending requests reject with `err`.
  fail(err) {
    if (!this.isClosed) {
      this.isClosed = true;
      this.socket.destroy();
    }
    const pending = this.pending;
    this.pending = [];
    for (const entry of pending) {
      clearTimeout(entry.timer);
      entry.reject(err || new DgmmError(grpc.status.UNAVAILABLE, `dgmm: the local socket ${this.path} is closed`));
    }
  }

  // Closes the connection: the server unregisters this session's regions.
  close() {
    this.fail(new DgmmError(grpc.status.CANCELLED, 'dgmm: the session was closed'));
  }
}

module.exports = { LocalSession, encodeRequest, decodeResponse, MAX_FRAME };
