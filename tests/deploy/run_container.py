#!/usr/bin/python3
"""The container image, built and run with podman (deploy suite).

  run_container.py --cli BUILD/client/cpp/dgmm-cli --work BUILD/tests/deploy/container
  run_container.py --prepare --work BUILD/tests/deploy/container

--prepare does steps 1 to 3 only (no checks, no --cli needed): ./test.sh runs
it in the background while it compiles the host build, so that the image's
downloads and compile overlap with that build. Both hold an exclusive lock
on --work/lock for their run: the test waits for a prepare in progress, then
finds the base image and every layer cached (it still runs steps 1 to 3, so a
failed prepare is reported by the test, with its own output).

1. Installs podman, buildah, debootstrap, runc and podman-compose from
   Debian's packages (scripts/install-deps.sh container) and points podman at
   a containers.conf in --work (runc, cgroupfs, rlimits this machine allows):
   nothing is written to /etc/containers.
2. Makes the base image localhost/debian:bookworm once with debootstrap from
   the machine's own Debian mirror (reused while `podman image exists`).
3. Builds the CPU image from docker/Dockerfile (DGMM_CUDA=OFF, both bases
   localhost/debian:bookworm, --format docker so that HEALTHCHECK is kept),
   with podman's layer cache: a rebuild with unchanged sources is all cache.
4. Image hygiene: no compiler or build tree in it, ldd clean, user 10001, the
   HEALTHCHECK without a fixed --server; prints its size.
5. Runs it with DGMM_LISTEN on a non-default port, published on 127.0.0.1 at
   a free host port; the image's own HEALTHCHECK (`podman healthcheck run`)
   must turn healthy, a probe of the old fixed port 50051 must fail, a
   checked job from the host's dgmm-cli must pass through the published port,
   the server must run as uid 10001, and `podman stop` (SIGTERM) must drain
   ("draining", "stopped" in its log) and exit 0.
6. With TLS and a bearer token (DGMM_TLS_CERT, DGMM_AUTH_TOKEN_FILE): the
   image's plaintext probe fails, the documented --health-cmd override with
   --tls_ca is healthy without a token, a job needs the token.
7. Regions from a second container: the server with --allow_regions and a
   named volume at /run/dgmm (its local socket, 'auto'), and a client
   container from the same image as uid 65534 that shares only that volume
   (read-only: no --ipc, no shared /dev/shm). There the socket is mode 0666
   and owned by 10001; a static probe (local_socket_probe.c) gets a session
   as uid 65534, a by-name open of an object in the client's /dev/shm is
   NOT_FOUND and the same object passed as a descriptor gets a ticket;
   `dgmm-cli multiply --shm on --check` runs in mode shm and passes, and the
   server logs the region as uid 65534's. Without the volume --shm on fails.
8. docker/compose.yaml's CPU service (dgmm-cpu) through podman-compose, with
   the test's image and a free loopback host port: healthy through the
   compose healthcheck, answers a checked job.
9. Removes the containers and volumes it made (the images stay, as the cache).

Exits 77 (ctest: skipped) with the reason when this machine cannot run
containers at all (podman missing and not installable, or podman unable to
start any container); any failure after that is a failure.
"""
import argparse
import fcntl
import json
import os
import pathlib
import re
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SKIP = 77
BASE_IMAGE = "localhost/debian:bookworm"
IMAGE = "localhost/dgmm:cpu-test"
BUILD_STAGE_IMAGE = "localhost/dgmm:cpu-test-build"  # the build stage, tagged so that it can be replaced
CONTAINER_PORT = 50061  # not the default 50051: the HEALTHCHECK must follow DGMM_LISTEN
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


class Skip(Exception):
    pass


class Failure(Exception):
    pass


def run(cmd, check=True, timeout=600, quiet=False, **kw):
    """Runs cmd, returns CompletedProcess with text stdout+stderr in .out."""
    if not quiet:
        log("$ " + " ".join(str(c) for c in cmd))
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout, **kw)
    p.out = p.stdout
    if check and p.returncode != 0:
        raise Failure(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} exited {p.returncode}:\n{p.out[-4000:]}")
    return p


def expect(cond, what):
    if not cond:
        raise Failure(what)
    log(f"ok: {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def debian_mirror():
    """The Debian archive apt uses here (deb822 .sources or one-line sources.list)."""
    for path in sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.sources")):
        text = path.read_text()
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.*)$", stanza, re.M)
            if uris and suites and "bookworm" in suites.group(1).split():
                return uris.group(1)
    lists = [pathlib.Path("/etc/apt/sources.list")] + sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.list"))
    for path in lists:
        if path.exists():
            for line in path.read_text().splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if m:
                    return m.group(1)
    return "http://deb.debian.org/debian"


def setup_podman(work):
    """Installs the tools; returns the environment podman runs with."""
    p = run([ROOT / "scripts" / "install-deps.sh", "container"], check=False, timeout=900)
    print(p.out[-2000:])
    if p.returncode != 0 or not shutil.which("podman"):
        raise Skip(f"podman is not installed and scripts/install-deps.sh container could not install it (exit {p.returncode})")
    # Rootful podman without systemd on a cgroup v1 (hybrid) host: crun refuses
    # hybrid cgroups and podman's default rlimits exceed this machine's hard
    # limits (EPERM), so runc, cgroupfs and the limits we actually have.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    conf = work / "containers.conf"
    conf.write_text(f"""# Written by tests/deploy/run_container.py; used through CONTAINERS_CONF.
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
""")
    env = dict(os.environ, CONTAINERS_CONF=str(conf))
    p = run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} "
             "{{.Host.CgroupsVersion}} {{.Store.GraphDriverName}} {{.Host.NetworkBackend}}"],
            check=False, env=env, timeout=120)
    if p.returncode != 0:
        raise Skip(f"podman info fails here: {p.out[-1500:]}")
    log(f"podman: {run(['podman', '--version'], env=env, quiet=True).out.strip()}; {p.out.strip().splitlines()[-1]}")
    return env


def base_image(env, work):
    if run(["podman", "image", "exists", BASE_IMAGE], check=False, env=env).returncode == 0:
        log(f"{BASE_IMAGE} is cached")
        return
    mirror = debian_mirror()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        rootfs = pathlib.Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", "bookworm", rootfs, mirror], env=env, timeout=900)
        # apt's downloaded packages and lists: install-deps.sh fetches fresh lists.
        for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / d).glob("*"):
                if f.is_file():
                    f.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["podman", "import", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE],
                             stdin=tar.stdout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        tar.stdout.close()
        if tar.wait() != 0 or imp.returncode != 0:
            raise Failure(f"podman import of the debootstrap tree failed: {imp.stdout[-2000:]}")
    log(f"made {BASE_IMAGE} from {mirror} in {time.monotonic() - started:.0f} s")


def can_run_containers(env):
    p = run(["podman", "run", "--rm", "--network=none", BASE_IMAGE, "true"], check=False, env=env, timeout=120)
    if p.returncode != 0:
        raise Skip(f"podman cannot start a container on this machine: {p.out[-1500:]}")


def image_id(env, ref):
    p = run(["podman", "image", "inspect", "--format", "{{.Id}}", ref], check=False, env=env, quiet=True)
    return p.out.strip() if p.returncode == 0 else None


def run_build(cmd, env, timeout):
    """Runs a podman build, logging each of its STEP lines as it starts (with
    the time, so that the log shows where a build spends it); returns an
    object with the output in .out and the exit status in .returncode."""
    log("$ " + " ".join(str(c) for c in cmd))
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    deadline = time.monotonic() + timeout
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.match(r"(\[\d+/\d+\] )?STEP \d+/\d+: ", line) or line.startswith("--> Using cache"):
            log("  " + line.rstrip()[:160])
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(cmd, timeout)
    proc.wait()
    return argparse.Namespace(out="".join(lines), returncode=proc.returncode)


def build_image(env):
    """Builds the build stage (tagged) and then the image, with the layer cache;
    removes the images they replace, so that each source change does not
    leave a 1.5 GB build stage behind."""
    started = time.monotonic()
    old = {ref: image_id(env, ref) for ref in (BUILD_STAGE_IMAGE, IMAGE)}
    cached = steps = 0
    for target, tag in (("build", BUILD_STAGE_IMAGE), ("runtime", IMAGE)):
        p = run_build(["podman", "build", "--format", "docker", "--layers", "--target", target,
                       "-f", ROOT / "docker" / "Dockerfile",
                       "--build-arg", "DGMM_CUDA=OFF",
                       "--build-arg", f"BUILD_BASE={BASE_IMAGE}",
                       "--build-arg", f"RUNTIME_BASE={BASE_IMAGE}",
                       "-t", tag, ROOT], env=env, timeout=1800)
        lines = p.out.splitlines()
        for i, line in enumerate(lines):  # RUN and COPY steps, and which came from the cache
            if re.search(r"STEP \d+/\d+: (RUN|COPY) ", line):
                steps += 1
                cached += i + 1 < len(lines) and lines[i + 1].startswith("--> Using cache")
        print("\n".join(p.out.splitlines()[-8:]))
        if p.returncode != 0:
            raise Failure(f"podman build --target {target} failed (exit {p.returncode}):\n{p.out[-6000:]}")
    log(f"built {IMAGE} in {time.monotonic() - started:.0f} s ({cached} of {steps} RUN/COPY steps from the layer cache)")
    for ref, old_id in old.items():
        if old_id and old_id != image_id(env, ref):
            p = run(["podman", "rmi", old_id], check=False, env=env, quiet=True)
            log(f"removed the {ref} it replaces ({old_id[:12]}): {'ok' if p.returncode == 0 else p.out.strip()[-200:]}")


def check_image(env):
    info = json.loads(run(["podman", "image", "inspect", IMAGE], env=env, quiet=True).out)[0]
    log(f"image size: {info['Size'] / 2**20:.0f} MiB ({info['Size']} bytes) for {IMAGE}")
    cfg = info.get("Config", {})
    expect(cfg.get("User") == "10001:10001", f"image user is 10001:10001 (got {cfg.get('User')!r})")
    hc = (info.get("Healthcheck") or cfg.get("Healthcheck") or {}).get("Test") or []
    expect(hc[:3] == ["CMD", "dgmm-cli", "health"] and "--server" not in hc,
           f"HEALTHCHECK is kept (docker format) and has no fixed --server: {hc}")
    # Anything a build leaves behind: compilers, the source or build tree.
    probe = ("for t in cc gcc g++ c++ clang nvcc cmake make ld as; do command -v $t; done;"
             " for d in /src /src/build-image /usr/local/cuda/bin/nvcc /usr/include/grpcpp; do"
             " [ -e $d ] && echo $d; done; true")
    p = run(["podman", "run", "--rm", "--network=none", "--no-healthcheck", "--user", "0", "--entrypoint", "sh", IMAGE, "-c", probe], env=env)
    expect(p.out.strip() == "", f"no compiler, linker, headers or build tree in the runtime image ({p.out.strip()!r})")
    p = run(["podman", "run", "--rm", "--network=none", "--no-healthcheck", "--entrypoint", "ldd", IMAGE,
             "/usr/local/bin/dgmm-server", "/usr/local/bin/dgmm-cli"], env=env)
    expect("not found" not in p.out and "libgrpc++" in p.out, "ldd of dgmm-server and dgmm-cli: every library found")


def wait_healthy(env, name, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = run(["podman", "healthcheck", "run", name], check=False, env=env, quiet=True)
        if last.returncode == 0:
            return last.out.strip()
        state = run(["podman", "inspect", "--format", "{{.State.Status}}", name], check=False, env=env, quiet=True).out.strip()
        if state not in ("running", "created", "configured"):
            raise Failure(f"{name} is {state} before it became healthy:\n"
                          + run(["podman", "logs", name], check=False, env=env, quiet=True).out[-3000:])
        time.sleep(1)
    raise Failure(f"{name} not healthy within {timeout_s} s: {last.out if last else ''}\n"
                  + run(["podman", "logs", name], check=False, env=env, quiet=True).out[-3000:])


def job_through(cli, port):
    p = run([cli, "multiply", "--random", "1000", "--check", "--deadline", "60", "--server", f"127.0.0.1:{port}"])
    print(p.out.strip())
    expect(re.search(r"^max relative error: .*: OK$", p.out, re.M) is not None and "backend:    cpu" in p.out,
           "dgmm-cli --check: the CPU backend's result matches the reference")
    return p


def run_image(env, cli, started):
    name = f"dgmm-deploy-test-{os.getpid()}"
    host_port = free_port()
    started.append(name)
    run(["podman", "run", "-d", "--name", name,
         "-e", f"DGMM_LISTEN=0.0.0.0:{CONTAINER_PORT}", "-e", "DGMM_BACKEND=cpu", "-e", "DGMM_DRAIN_TIMEOUT_S=5",
         "-p", f"127.0.0.1:{host_port}:{CONTAINER_PORT}", IMAGE], env=env)
    t = time.monotonic()
    out = wait_healthy(env, name)
    expect(True, f"podman healthcheck run {name}: healthy after {time.monotonic() - t:.1f} s with DGMM_LISTEN=0.0.0.0:{CONTAINER_PORT} ({out or 'exit 0'})")
    status = run(["podman", "inspect", "--format", "{{.State.Health.Status}}", name], env=env, quiet=True).out.strip()
    expect(status == "healthy", f"podman inspect reports State.Health.Status {status!r}")
    # The probe the image used to run: nothing listens on 50051, so it fails.
    p = run(["podman", "exec", name, "dgmm-cli", "health", "--server", "127.0.0.1:50051", "--deadline", "2"], check=False, env=env)
    expect(p.returncode != 0, f"a probe of the fixed port 50051 fails in that container (exit {p.returncode})")
    job_through(cli, host_port)
    expect(True, f"checked 1000x1000 job through 127.0.0.1:{host_port} -> container port {CONTAINER_PORT}")
    status = run(["podman", "exec", name, "cat", "/proc/1/status"], env=env, quiet=True).out
    uids = re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()
    expect(set(uids) == {"10001"}, f"dgmm-server (pid 1 in the container) runs as uid 10001 (Uid: {' '.join(uids)})")
    t = time.monotonic()
    run(["podman", "stop", "-t", "30", name], env=env, timeout=60)
    stop_s = time.monotonic() - t
    code = run(["podman", "inspect", "--format", "{{.State.ExitCode}}", name], env=env, quiet=True).out.strip()
    logs = run(["podman", "logs", name], env=env, quiet=True).out
    print("container log (last lines):\n" + "\n".join(logs.splitlines()[-6:]))
    expect(code == "0", f"podman stop (SIGTERM) after {stop_s:.1f} s: exit code {code}")
    expect("draining" in logs and re.search(r"\bstopped\b", logs) is not None, "the log has the drain lines ('draining', 'stopped')")
    run(["podman", "rm", "-f", name], env=env, quiet=True)
    started.remove(name)


PKI_SCRIPT = r"""set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
key ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj "/CN=dgmm deploy test ca"
key server.key
openssl req -new -key server.key -out server.csr -subj /CN=dgmm.test
printf 'subjectAltName=DNS:dgmm.test,IP:127.0.0.1\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem
printf 'tok-%s-%s\n' $$ $RANDOM > token
chmod 644 server.key token   # read by uid 10001 in the container
"""


def run_tls_and_token(env, cli, work, started):
    """TLS and a bearer token on: the image's plaintext probe fails (as
    documented), the documented --health-cmd override with --tls_ca turns
    healthy without a token, and a job needs the token."""
    if not shutil.which("openssl"):
        raise Failure("openssl missing (scripts/install-deps.sh build installs it)")
    pki = pathlib.Path(tempfile.mkdtemp(dir=work, prefix="pki-"))
    pki.chmod(0o755)
    run(["sh", "-c", PKI_SCRIPT], cwd=pki, quiet=True)
    name = f"dgmm-deploy-tls-{os.getpid()}"
    host_port, port = free_port(), CONTAINER_PORT + 1
    started.append(name)
    run(["podman", "run", "-d", "--name", name, "-v", f"{pki}:/run/dgmm-tls:ro",
         "-e", f"DGMM_LISTEN=0.0.0.0:{port}", "-e", "DGMM_BACKEND=cpu", "-e", "DGMM_HOST_MEMORY_BUDGET=1GiB",
         "-e", "DGMM_TLS_CERT=/run/dgmm-tls/server.pem", "-e", "DGMM_TLS_KEY=/run/dgmm-tls/server.key",
         "-e", "DGMM_AUTH_TOKEN_FILE=/run/dgmm-tls/token",
         "--health-cmd", "dgmm-cli health --tls_ca /run/dgmm-tls/ca.pem --deadline 3 --quiet",
         "-p", f"127.0.0.1:{host_port}:{port}", IMAGE], env=env)
    t = time.monotonic()
    wait_healthy(env, name)
    expect(True, f"TLS + token: healthy after {time.monotonic() - t:.1f} s through --health-cmd with --tls_ca and no token")
    p = run(["podman", "exec", name, "dgmm-cli", "health", "--deadline", "2"], check=False, env=env)
    expect(p.returncode != 0, f"TLS: the image's plaintext probe fails, so TLS needs the override (exit {p.returncode})")
    tls = ["--tls_ca", pki / "ca.pem", "--server", f"127.0.0.1:{host_port}", "--deadline", "30"]
    p = run([cli, "multiply", "--random", "64", "--check"] + tls, check=False)
    expect(p.returncode != 0 and "UNAUTHENTICATED" in p.out, f"TLS + token: a job without the token is refused ({p.out.strip()[-120:]})")
    t = time.monotonic()
    p = run([cli, "multiply", "--random", "256", "--check", "--auth_token_file", pki / "token"] + tls)
    print(p.out.strip())
    log(f"that job took {time.monotonic() - t:.1f} s of wall time")
    expect(re.search(r"^max relative error: .*: OK$", p.out, re.M) is not None, "TLS + token: a checked job with the token passes")
    run(["podman", "rm", "-f", "-t", "10", name], env=env, quiet=True)
    started.remove(name)
    shutil.rmtree(pki)


PROBE_SOURCE = ROOT / "tests" / "deploy" / "local_socket_probe.c"


def build_probe(work):
    """tests/deploy/local_socket_probe.c, static (the image has no compiler,
    and the host's glibc is not the image's concern), in a directory of its
    own that a container mounts read-only."""
    cc = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc")]
    if not cc[0]:
        raise Failure("no C compiler (cc) for tests/deploy/local_socket_probe.c")
    out = work / "probe"
    out.mkdir(exist_ok=True)
    out.chmod(0o755)
    run(cc + ["-static", "-O2", "-o", out / "local_socket_probe", PROBE_SOURCE], quiet=True, timeout=120)
    return out


CLIENT_SCRIPT = r"""
echo "id: $(id -u):$(id -g)"
echo "ipc: $(readlink /proc/self/ns/ipc)"
echo "dir: $(stat -c '%a %u:%g %F' /run/dgmm)"
echo "socket: $(stat -c '%a %u:%g %F' "$1")"
/probe/local_socket_probe "$1"; echo "probe exit: $?"
dgmm-cli multiply --server "$2" --random 1000 --shm on --check --deadline 60; echo "cli exit: $?"
"""


def run_regions(env, work, started):
    """Regions from a second container. The server (the image's uid 10001,
    --allow_regions, --local_socket 'auto') has a fresh named volume at
    /run/dgmm; a client container from the same image, as uid 65534, shares
    only that volume (read-only; its own IPC namespace and /dev/shm, the
    default network) and runs a checked job with --shm on. A second client
    without the volume cannot use regions."""
    probe = build_probe(work)
    pid = os.getpid()
    volume, name, client = f"dgmm-deploy-run-{pid}", f"dgmm-deploy-regions-{pid}", f"dgmm-deploy-client-{pid}"
    port = CONTAINER_PORT + 2
    started.append(("volume", volume))
    run(["podman", "volume", "create", volume], env=env, quiet=True)
    started.append(name)
    run(["podman", "run", "-d", "--name", name, "-v", f"{volume}:/run/dgmm",
         "-e", f"DGMM_LISTEN=0.0.0.0:{port}", "-e", "DGMM_BACKEND=cpu", "-e", "DGMM_HOST_MEMORY_BUDGET=1GiB",
         "-e", "DGMM_ALLOW_REGIONS=true", "-e", "DGMM_REGION_MEMORY_BUDGET=256MiB", IMAGE], env=env)
    t = time.monotonic()
    wait_healthy(env, name)
    sock = f"/run/dgmm/dgmm-{port}.sock"
    logs = run(["podman", "logs", name], env=env, quiet=True).out
    expect(f"regions: local socket {sock}" in logs,
           f"regions server healthy after {time.monotonic() - t:.1f} s, its local socket ('auto') in the volume: {sock}")
    ip = run(["podman", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", name], env=env, quiet=True).out.strip()
    server_ipc = run(["podman", "exec", name, "readlink", "/proc/1/ns/ipc"], env=env, quiet=True).out.strip()
    t = time.monotonic()
    p = run(["podman", "run", "--rm", "--name", client, "--no-healthcheck", "--user", "65534:65534",
             "-v", f"{volume}:/run/dgmm:ro", "-v", f"{probe}:/probe:ro", "--entrypoint", "sh",
             IMAGE, "-c", CLIENT_SCRIPT, "sh", sock, f"{ip}:{port}"], env=env, timeout=180)
    print(p.out.strip())
    log(f"the client container took {time.monotonic() - t:.1f} s")

    def field(key):
        m = re.search(rf"^{key}: (.*)$", p.out, re.M)
        return m.group(1) if m else ""

    expect(field("id") == "65534:65534", f"the client container runs as uid:gid 65534:65534, not the server's 10001 ({field('id')})")
    expect(field("ipc") and server_ipc and field("ipc") != server_ipc,
           f"its IPC namespace (and with it /dev/shm) is its own: {field('ipc')} vs the server's {server_ipc}")
    dir_mode, dir_owner, _ = (field("dir").split(" ", 2) + ["", ""])[:3]
    mode, owner, kind = (field("socket").split(" ", 2) + ["", ""])[:3]
    expect(dir_owner == "10001:10001" and int(dir_mode or "0", 8) & 0o001,
           f"/run/dgmm in the volume belongs to the server's uid and others may traverse it ({field('dir')})")
    expect(kind == "socket" and owner == "10001:10001" and int(mode or "0", 8) & 0o777 == 0o666,
           f"the socket file is mode 0666 (--local_socket_mode's default), so uid 65534 may connect ({field('socket')})")
    hello = re.search(r"^hello: code (\d+) uid (\d+) gid (\d+)", p.out, re.M)
    expect(hello is not None and hello.group(1) == "0" and hello.group(2) == "65534" and hello.group(3) == "65534",
           f"local socket hello from the client container: OK, the kernel tells the server uid/gid 65534 ({field('hello')})")
    by_name = re.search(r"^open_shm: code (\d+)", p.out, re.M)
    expect(by_name is not None and by_name.group(1) == "5",
           f"by name: an object in the client's /dev/shm is NOT_FOUND by the server (LocalOpenShm: {field('open_shm')})")
    by_fd = re.search(r"^pass_fd: code (\d+) ticket (\w+) object_bytes (\d+)", p.out, re.M)
    expect(by_fd is not None and by_fd.group(1) == "0" and by_fd.group(3) == "4096",
           f"by descriptor: the same object passed with SCM_RIGHTS gets a ticket ({field('pass_fd')})")
    expect(field("probe exit") == "0", "the probe's exchanges all got replies")
    expect(field("cli exit") == "0" and re.search(r"^mode:\s+shm\b", p.out, re.M) is not None
           and re.search(r"^max relative error: .*: OK$", p.out, re.M) is not None,
           f"dgmm-cli multiply --shm on --check from the client container: mode shm, check OK (exit {field('cli exit')})")
    logs = run(["podman", "logs", name], env=env, quiet=True).out
    expect(re.search(r"region registered: '[^']*' of uid 65534\b", logs) is not None,
           "the server's log: the region was registered for uid 65534 (the client's, through SO_PEERCRED)")
    # The same client without the volume: the socket's path is not there.
    p = run(["podman", "run", "--rm", "--name", client, "--no-healthcheck", "--user", "65534:65534",
             "--entrypoint", "dgmm-cli", IMAGE, "multiply", "--server", f"{ip}:{port}", "--random", "64",
             "--shm", "on", "--deadline", "30"], env=env, check=False, timeout=120)
    expect(p.returncode != 0 and "cannot reach the server's local socket" in p.out,
           f"without the volume --shm on fails: {p.out.strip().splitlines()[-1][:200] if p.out.strip() else p.returncode}")
    run(["podman", "rm", "-f", "-t", "10", name], env=env, quiet=True)
    started.remove(name)
    run(["podman", "volume", "rm", "-f", volume], env=env, quiet=True)
    started.remove(("volume", volume))


def run_compose(env, cli, work, started):
    if not shutil.which("podman-compose"):
        raise Failure("podman-compose missing although scripts/install-deps.sh container installs it")
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    svc = compose["services"]["dgmm-cpu"]  # anchors and << merges resolved by the YAML loader
    host_port = free_port()
    # The service as written (environment, healthcheck, restart, stop signal),
    # but: the test's image instead of building the GPU default, its gRPC port
    # on a free loopback port, metrics not published.
    container_port = int(str(svc["environment"]["DGMM_LISTEN"]).rsplit(":", 1)[1])
    published = [str(p) for p in svc.get("ports", [])]
    if not any(p.endswith(f":{container_port}") for p in published):
        raise Failure(f"compose dgmm-cpu does not publish DGMM_LISTEN's port {container_port}: {published}")
    svc = dict(svc, image=IMAGE, ports=[f"127.0.0.1:{host_port}:{container_port}"])
    svc.pop("build", None)
    project = f"dgmmtest{os.getpid()}"
    path = work / "compose-cpu.yaml"
    path.write_text(yaml.safe_dump({"services": {"dgmm-cpu": svc}}, sort_keys=False))
    base = ["podman-compose", "-p", project, "-f", path]
    started.append(("compose", base, project))
    p = run(base + ["up", "-d", "--no-build", "dgmm-cpu"], env=env, timeout=120, check=False)
    print(p.out[-3000:])
    if p.returncode != 0:
        raise Failure(f"podman-compose up failed (exit {p.returncode})")
    names = run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "--format", "{{.Names}}"],
                env=env, quiet=True).out.split()
    expect(len(names) == 1, f"podman-compose started one container for dgmm-cpu: {names}")
    hc = run(["podman", "inspect", "--format", "{{json .Config.Healthcheck}}", names[0]], env=env, quiet=True).out.strip()
    log(f"compose healthcheck as podman got it: {hc}")
    out = wait_healthy(env, names[0])
    expect(True, f"compose service dgmm-cpu healthy through its healthcheck ({out or 'exit 0'})")
    job_through(cli, host_port)
    expect(True, f"compose service dgmm-cpu answered a checked job through 127.0.0.1:{host_port}")
    # podman-compose 1.0.3 does not pass stop_grace_period to podman (its stop
    # waits podman's default 10 s, then SIGKILL): give it the file's value.
    grace = int(re.fullmatch(r"(\d+)s", str(svc.get("stop_grace_period", "10s"))).group(1))
    t = time.monotonic()
    run(base + ["stop", "-t", str(grace), "dgmm-cpu"], env=env, timeout=grace + 60)
    code = run(["podman", "inspect", "--format", "{{.State.ExitCode}}", names[0]], env=env, quiet=True).out.strip()
    logs = run(["podman", "logs", names[0]], env=env, quiet=True).out
    expect(code == "0" and "draining" in logs and "stopped" in logs,
           f"podman-compose stop -t {grace} (stop_grace_period): drained and exit code {code} after {time.monotonic() - t:.1f} s")
    run(base + ["down"], env=env, timeout=120)
    started.remove(("compose", base, project))
    run(["podman", "network", "rm", f"{project}_default"], check=False, env=env, quiet=True)


STALE = re.compile(r"^(?:dgmm-deploy-(?:test|tls|regions|client|run)-|dgmmtest)(\d+)(?:_|$)")


def remove_stale(env):
    """Containers and networks of an earlier run that was killed (its pid is gone)."""
    for kind, listing in (("container", ["podman", "ps", "-a", "--format", "{{.Names}}"]),
                          ("network", ["podman", "network", "ls", "--format", "{{.Name}}"]),
                          ("volume", ["podman", "volume", "ls", "--format", "{{.Name}}"])):
        for name in run(listing, check=False, env=env, quiet=True).out.split():
            m = STALE.match(name)
            if m and not pathlib.Path(f"/proc/{m.group(1)}").exists():
                cmd = ["podman", "rm", "-f", "-t", "0", name] if kind == "container" else ["podman", kind, "rm", "-f", name]
                run(cmd, check=False, env=env)


def cleanup(env, started):
    for item in reversed(started):
        if isinstance(item, tuple) and item[0] == "volume":
            run(["podman", "volume", "rm", "-f", item[1]], check=False, env=env, timeout=60)
        elif isinstance(item, tuple):
            run(item[1] + ["down"], check=False, env=env, timeout=120)
            run(["podman", "network", "rm", f"{item[2]}_default"], check=False, env=env, timeout=60)
        else:
            run(["podman", "rm", "-f", "-t", "5", item], check=False, env=env, timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", help="the host's dgmm-cli (required unless --prepare)")
    ap.add_argument("--prepare", action="store_true",
                    help="only steps 1 to 3: podman, the base image and the image (./test.sh, in the background)")
    ap.add_argument("--work", required=True, help="a directory for containers.conf and scratch files")
    ap.add_argument("--no-compose", action="store_true", help="skip step 8")
    a = ap.parse_args()
    if not a.prepare and not a.cli:
        ap.error("--cli is required unless --prepare")
    work = pathlib.Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    lock = open(work / "lock", "w")
    waited = time.monotonic()
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process exits
    waited = time.monotonic() - waited
    if a.prepare:
        return prepare(work)
    prepared = work / "prepare.log"
    if prepared.exists():
        # What the prepare that ./test.sh started did (steps and times), then
        # the same steps again here, which find everything cached.
        log(f"waited {waited:.0f} s for the image build ./test.sh started; its log ({prepared}) ends:")
        print("\n".join(prepared.read_text(errors="replace").splitlines()[-25:]), flush=True)
        prepared.rename(work / "prepare.last.log")
    env, started = None, []
    try:
        env = setup_podman(work)
        remove_stale(env)
        base_image(env, work)
        can_run_containers(env)
        build_image(env)
        check_image(env)
        run_image(env, a.cli, started)
        run_tls_and_token(env, a.cli, work, started)
        run_regions(env, work, started)
        if not a.no_compose:
            run_compose(env, a.cli, work, started)
    except Skip as e:
        print(f"SKIPPED: {e}", flush=True)
        return SKIP
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}", flush=True)
        return 1
    finally:
        if env is not None:
            cleanup(env, started)
    log("container test passed")
    return 0


def prepare(work):
    """Steps 1 to 3, for ./test.sh to start early; the checks are the test's."""
    try:
        env = setup_podman(work)
        base_image(env, work)
        build_image(env)
    except Skip as e:
        print(f"SKIPPED: {e}", flush=True)
        return SKIP
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}", flush=True)
        return 1
    log("prepared: base image and image built (the test checks them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
