'use strict';
// The same-host path of multiply() (docs/protocol.md section 9,
// rule 0), without a native addon: a job of at least 1 MiB of matrix, with
// no RPC forced, goes through memory when the server is on this host and
// takes regions. Each client keeps one staging SharedMemoryRegion
// (regions.js: a 0600 POSIX shared-memory object the server opens through
// the client's local-socket session), made on first use with the next power
// of two of the job's bytes from 1 MiB, kept and reused, and replaced by a
// larger one when a job needs more. A is written into it (one pwrite), one
// MultiplyRegion computes in place, and C is read back (one pread) into the
// caller's output. The jobs of one client take the staging region one at a
// time. When the session cannot open (a remote server, regions off, another
// server's socket) or the staging region cannot be registered for another
// reason than the region budget (e.g. PERMISSION_DENIED: a server of another
// uid), that finding is kept for 60 s and jobs use the socket meanwhile; a
// full budget (RESOURCE_EXHAUSTED) or a region job that fails in a way the
// socket path may not sends that one job over the socket (jobs are pure).
// Either way multiply()'s info.socketReason says why.

const crypto = require('node:crypto');
const { DgmmError, grpc } = require('./dgmm');
const regions = require('./regions');

const MIB = 1 << 20;
const SAME_HOST_MIN_BYTES = MIB;
const RECHECK_AFTER_MS = 60000;
// Region-job failures after which the socket may still do the job.
const SOCKET_CAN_STILL_DO_IT = new Set([
  grpc.status.UNAVAILABLE,         // the transport: the socket path retries
  grpc.status.NOT_FOUND,           // the staging region is gone
  grpc.status.UNAUTHENTICATED,     // the session closed
  grpc.status.FAILED_PRECONDITION, // regions off now
  grpc.status.RESOURCE_EXHAUSTED,  // no room for a region job
  grpc.status.INTERNAL,
  grpc.status.UNKNOWN,
]);
// After these the staging region is not used again (it, or its session, is gone).
const STAGING_GONE = new Set([grpc.status.NOT_FOUND, grpc.status.UNAUTHENTICATED, grpc.status.UNAVAILABLE]);
const STATE = Symbol('dgmm.sameHost');
let made = 0;

function stagingSize(need) {
  let size = MIB;
  while (size < need) size *= 2;
  return size;
}

function reasonOf(err) {
  return err instanceof DgmmError ? `${err.codeName}: ${err.details}` : String((err && err.message) || err);
}

// The client's same-host state, made on first use; client.close() closes
// (and unlinks) the staging object, at once or when its job ends. The
// server drops the region itself when the client's session closes.
function stateOf(client) {
  let st = client[STATE];
  if (!st) {
    st = { offUntil: 0, offReason: '', staging: null, inUse: false, lock: Promise.resolve(), closed: false };
    client[STATE] = st;
    const closeBefore = client.close;
    client.close = function close(...args) {
      st.closed = true;
      if (!st.inUse) dropStaging(st);
      return closeBefore.apply(this, args);
    };
  }
  return st;
}

function dropStaging(st) {
  if (st.staging) st.staging.closeFile();
  st.staging = null;
}

// The client's staging region, registered and at least `bytes` large.
// Resolves to the region, or to { socketReason } when this job goes over the
// socket.
async function staging(client, st, bytes, timeoutMs) {
  let region = st.staging;
  if (region && region.registered && region.byteSize >= bytes) return region;
  if (region) {
    // Too small (or its session is gone): its bytes go back to the budget first.
    st.staging = null;
    await region.close({ timeoutMs });
  }
  region = regions.createSharedMemoryRegion(stagingSize(bytes));
  const name = `dgmm-node-staging-${process.pid}-${made++}-${crypto.randomBytes(4).toString('hex')}`;
  try {
    await region.register(client, name, { timeoutMs });
  } catch (err) {
    region.closeFile();
    if (err instanceof DgmmError && err.code === grpc.status.RESOURCE_EXHAUSTED) {
      return { socketReason: reasonOf(err) }; // The region budget: this job only.
    }
    throw err;
  }
  st.staging = region;
  return region;
}

// Runs `job` (dgmm.describeJob's) through memory into `out`. Resolves to
// { stats } when it ran there, or to { socketReason } when it must go over
// the socket; rejects with the region job's DgmmError when the socket could
// not do better (INVALID_ARGUMENT, DEADLINE_EXCEEDED, ...).
async function sameHostJob(client, job, out, options, deadline) {
  const st = stateOf(client);
  if (st.closed) return { socketReason: 'the client is closed' };
  if (Date.now() < st.offUntil) return { socketReason: st.offReason };
  const remaining = () => (deadline === Infinity ? undefined : Math.max(1, deadline - Date.now()));
  // Remembered for RECHECK_AFTER_MS, unless the job's own deadline ran out.
  const off = (err) => {
    if (Date.now() >= deadline) return { socketReason: reasonOf(err) };
    st.offUntil = Date.now() + RECHECK_AFTER_MS;
    st.offReason = reasonOf(err);
    return { socketReason: st.offReason };
  };
  try {
    // Once per client (regions.js keeps the session; a closed one is opened again).
    await regions.regionSession(client, { timeoutMs: remaining() });
  } catch (err) {
    return off(err);
  }
  // One job at a time in the staging region.
  const previous = st.lock;
  let release;
  st.lock = new Promise((resolve) => { release = resolve; });
  await previous;
  st.inUse = true;
  try {
    if (st.closed) return { socketReason: 'the client is closed' };
    // C over A (in place), or after A when C is wider.
    const resultAt = job.outBytes === job.a.byteLength ? 0 : Math.ceil(job.a.byteLength / 256) * 256;
    let region;
    try {
      // A, and C after it when C's dtype is wider than A's.
      region = await staging(client, st, resultAt + job.outBytes, remaining());
    } catch (err) {
      return off(err);
    }
    if (!(region instanceof regions.SharedMemoryRegion)) return region;
    let stats;
    try {
      region.write(job.a, 0);
      stats = await regions.multiplyRegion(client,
        { header: job.header, matrix: region.ref(0), result: region.ref(resultAt) }, { timeoutMs: remaining() });
      region.read(out, resultAt);
    } catch (err) {
      if (!(err instanceof DgmmError)) {
        dropStaging(st); // A file error (ENOSPC, ...): the socket does it.
        return { socketReason: `the same-host path failed, so the socket carried the job: ${reasonOf(err)}` };
      }
      if (STAGING_GONE.has(err.code)) dropStaging(st);
      if (!SOCKET_CAN_STILL_DO_IT.has(err.code)) throw err;
      return { socketReason: `the same-host job failed, so the socket carried it: ${reasonOf(err)}` };
    }
    if (options.progress) options.progress(job.numLines, job.numLines);
    return { stats };
  } finally {
    st.inUse = false;
    if (st.closed) dropStaging(st);
    release();
  }
}

// The client's staging region (a SharedMemoryRegion) or null: for tests.
function stagingOf(client) {
  return (client[STATE] && client[STATE].staging) || null;
}

module.exports = { sameHostJob, stagingOf, stagingSize, SAME_HOST_MIN_BYTES, RECHECK_AFTER_MS };
