"""A dgmm-server process on an ephemeral loopback port, for the Python tests,
the conformance harness and the Python benchmarks (one implementation of
"start it, wait for its port file, keep its log, stop it with SIGTERM"); and
the one float64 reference and tolerance those check results with
(reference, tolerance, max_relative_error).

    server = ServerProcess(flags=["--allow_regions"])   # DGMM_SERVER_BIN
    client = dgmm.Client(server.address)
    ...
    server.stop()
"""

import os
import signal
import subprocess
import tempfile
import time


class ServerProcess:
    """dgmm-server listening on 127.0.0.1:<ephemeral>; `address` and `port`
    once started. `binary` defaults to $DGMM_SERVER_BIN. `backend` is added
    as --backend=<backend> unless `flags` name one (None: add nothing).
    --allow_regions=false is added unless `flags` name --allow_regions or
    `server_defaults` is true: the server's default is on, and a client on
    this host then takes the same-host path, so a test of the gRPC socket
    gets the socket unless it asks for regions."""

    def __init__(self, binary=None, flags=(), backend="cpu", start_timeout=30,
                 stop_timeout=15, prefix="dgmm-server-", server_defaults=False):
        binary = binary or os.environ.get("DGMM_SERVER_BIN")
        if not binary or not os.access(binary, os.X_OK):
            raise RuntimeError("set DGMM_SERVER_BIN to the built dgmm-server (got %r)" % binary)
        flags = list(flags)
        if backend and not any(f.startswith("--backend") for f in flags):
            flags.insert(0, "--backend=" + backend)
        if not server_defaults and not any(f.startswith(("--allow_regions", "--noallow_regions"))
                                           for f in flags):
            flags.insert(0, "--allow_regions=false")
        self.stop_timeout = stop_timeout
        self.dir = tempfile.TemporaryDirectory(prefix=prefix)
        port_file = os.path.join(self.dir.name, "port")
        self.log_path = os.path.join(self.dir.name, "server.log")
        self.argv = [binary, "--listen=127.0.0.1:0", "--port_file=" + port_file, *flags]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("dgmm-server exited with %s:\n%s"
                                   % (self.process.returncode, self.log()))
            try:
                with open(port_file) as f:
                    text = f.read()
                if text.endswith("\n"):
                    self.port = int(text)
                    self.address = "127.0.0.1:%d" % self.port
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("dgmm-server did not write its port within %d s:\n%s"
                           % (start_timeout, self.log()))

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.dir.cleanup()


def reference(a, d, side):
    """C = A·diag(d) (side "right") or diag(d)·A ("left"), computed
    independently of dgmm in float64 with NumPy (a, d: anything
    numpy.asarray takes)."""
    import numpy as np
    a64, d64 = np.asarray(a, dtype=np.float64), np.asarray(d, dtype=np.float64)
    return a64 * d64 if side == "right" else d64[:, None] * a64


def tolerance(dtype):
    """The relative error allowed in a result of `dtype` against reference():
    one product rounded to float32, or to float64."""
    import numpy as np
    return 1e-6 if np.dtype(dtype) == np.float32 else 1e-15


def running_jobs(client):
    """Jobs the server runs or queues now, over its devices (GetServerInfo)."""
    return sum(d.running_jobs + d.queued_jobs for d in client.server_info().devices)


def completed_jobs(client):
    """Jobs the server has completed with OK, over its devices."""
    return sum(d.completed_jobs for d in client.server_info().devices)
