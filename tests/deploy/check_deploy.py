#!/usr/bin/python3
"""Checks the deployment artifacts (docker/, .dockerignore, docs/operations.md)
against each other and against the code they deploy: every YAML parses; the
Kubernetes objects carry what a GPU gRPC service needs (GPU request, gRPC
probes, headless Service, PodDisruptionBudget, a grace period longer than the
drain); the Dockerfile builds with the CI's scripts, from base images given as
build arguments (CUDA 13 by default), with a HEALTHCHECK that follows
DGMM_LISTEN's port; every DGMM_* variable and
--flag named anywhere in docker/ and docs/operations.md is a real flag of
dgmm-server (or of dgmm-cli, or of the tool the line runs); the flags table of
docs/operations.md is what docker/flags_table.py generates from service/flags.cc.

Each check is a function from parsed artifacts to a list of problems, so the
tests below also feed them broken copies and expect the problem to be found.
Runs with Debian's /usr/bin/python3 (python3-yaml); no network, well under 5 s.
"""
import copy
import json
import pathlib
import re
import shlex
import sys
import unittest

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
K8S_REGIONS = DOCKER / "k8s-regions"  # kustomize overlay of K8S: shared-memory regions
DOC = ROOT / "docs" / "operations.md"
sys.path.insert(0, str(DOCKER))
import flags_table  # noqa: E402  (docker/flags_table.py)

GRPC_PORT = 50051
METRICS_PORT = 9464
DEFAULT_DRAIN_S = None  # read from service/flags.cc below
HEALTH_SERVICES = {"", "dgmm.v1.Dgmm"}

# Variables named DGMM_* that are not server flags, and where each is read.
BUILD_VARIABLES = {"DGMM_CUDA": ROOT / "scripts" / "build.sh"}

# Options of the other tools that docker/ and docs/operations.md show, by tool.
# Anything else spelled --name must be a dgmm-server or dgmm-cli flag.
OTHER_TOOL_FLAGS = {
    "docker": {"file", "tag", "gpus", "stop_timeout", "publish", "env", "rm", "name",
               "detach", "build", "profile", "interval", "timeout", "start_period",
               "retries", "from", "format", "prefix", "strip", "install", "target", "build_arg",
               "read_only", "health_cmd", "ipc", "pid", "user", "network", "entrypoint"},
    "podman": {"runtime", "ulimit"},
    "kubectl": {"namespace", "dry_run", "selector", "grace_period", "timeout", "for"},
    "useradd/groupadd": {"system", "uid", "gid", "no_create_home", "shell"},
    "grpcurl/curl": {"plaintext", "silent", "fail", "cacert", "insecure"},
    "docker/flags_table.py": {"check", "write", "doc"},
    "tests/deploy/run_container.py": {"prepare", "cli", "work", "no_compose"},
    "abseil (built into dgmm-server)": {"help", "helpfull", "version", "flagfile"},
}


def norm(flag):
    """Flag names with dashes or underscores are the same flag."""
    return flag.replace("-", "_")


def absl_flags(paths):
    names = set()
    for path in paths:
        names |= {name for name, *_ in flags_table.parse_flags(path.read_text(encoding="utf-8"))}
    return names


SERVER_FLAGS = {name for name, *_ in flags_table.server_flags()}
SERVER_DEFAULTS = {name: default for name, _, default, _ in flags_table.server_flags()}
CLI_FLAGS = absl_flags(sorted((ROOT / "client" / "cpp" / "cli").glob("*.cc")))
CLI_DEFAULTS = {name: default for path in sorted((ROOT / "client" / "cpp" / "cli").glob("*.cc"))
                for name, _, default, _ in flags_table.parse_flags(path.read_text(encoding="utf-8"))}
# dgmm-cli without --server talks to 127.0.0.1 on DGMM_LISTEN's port (common.cc).
CLI_SERVER_FOLLOWS_LISTEN = (CLI_DEFAULTS.get("server") == "" and 'getenv("DGMM_LISTEN")' in
                             (ROOT / "client" / "cpp" / "cli" / "common.cc").read_text(encoding="utf-8"))
OTHER_FLAGS = set().union(*OTHER_TOOL_FLAGS.values())


def load_yaml(path):
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def k8s_objects():
    objs = []
    for path in sorted(K8S.glob("*.yaml")):
        objs += [(path.name, o) for o in load_yaml(path)]
    return objs


def port_of(address):
    return int(str(address).rsplit(":", 1)[1])


def dig(obj, *keys, default=None):
    for k in keys:
        if isinstance(obj, dict) and k in obj:
            obj = obj[k]
        elif isinstance(obj, list) and isinstance(k, int) and k < len(obj):
            obj = obj[k]
        else:
            return default
    return obj


def flags_in_argv(argv):
    """{flag: value or None} of the --flags in an argument list."""
    out = {}
    args = list(argv)
    for i, a in enumerate(args):
        if not a.startswith("--") or a == "--":
            continue
        name, eq, value = a[2:].partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else None
        out[norm(name)] = value
    return out


def duration_s(text):
    """Compose durations: 45s, 1m30s, 2m."""
    total = 0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", str(text)):
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
    return total


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*", str(text), re.I)
    if not m:
        return None
    unit = (m.group(2) or "B").lower().rstrip("b") or "b"
    scale = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
             "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}[unit]
    return float(m.group(1)) * scale


def k8s_quantity_bytes(q):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T|k)?", str(q))
    if not m:
        return None
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]
    return float(m.group(1)) * scale


# ---------------------------------------------------------------- Kubernetes


def check_k8s(objs, kustomization_resources=None, manifest_files=None):
    problems = []
    by_kind = {}
    for _, o in objs:
        by_kind.setdefault(o.get("kind"), []).append(o)
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        if len(by_kind.get(kind, [])) != 1:
            problems.append(f"expected exactly one {kind}, found {len(by_kind.get(kind, []))}")
    if problems:
        return problems
    (dep,), (svc,), (pdb,) = by_kind["Deployment"], by_kind["Service"], by_kind["PodDisruptionBudget"]
    for name, o in objs:
        if not dig(o, "metadata", "name"):
            problems.append(f"{name}: {o.get('kind')} has no metadata.name")
    if dep.get("apiVersion") != "apps/v1":
        problems.append("Deployment: apiVersion must be apps/v1")
    if pdb.get("apiVersion") != "policy/v1":
        problems.append("PodDisruptionBudget: apiVersion must be policy/v1")

    pod = dig(dep, "spec", "template", "spec", default={})
    labels = dig(dep, "spec", "template", "metadata", "labels", default={})
    match = dig(dep, "spec", "selector", "matchLabels", default={})
    if not match or any(labels.get(k) != v for k, v in match.items()):
        problems.append("Deployment: spec.selector.matchLabels must match the pod template's labels")
    containers = pod.get("containers", [])
    if len(containers) != 1:
        problems.append("Deployment: expected one container")
        return problems
    c = containers[0]
    env = {e.get("name"): e.get("value") for e in c.get("env", [])}
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    args = flags_in_argv([str(a) for a in c.get("args", [])])

    # Ports: the container listens where the probes, ports and annotations say.
    listen = args.get("listen", env.get("DGMM_LISTEN"))
    if listen is None or port_of(listen) != GRPC_PORT or not str(listen).startswith("0.0.0.0"):
        problems.append(f"Deployment: dgmm-server must listen on 0.0.0.0:{GRPC_PORT} (DGMM_LISTEN or --listen), got {listen!r}")
    if ports.get("grpc") != GRPC_PORT:
        problems.append(f"Deployment: container port 'grpc' must be {GRPC_PORT}")
    metrics = args.get("metrics_listen", env.get("DGMM_METRICS_LISTEN"))
    if metrics is None or port_of(metrics) != METRICS_PORT:
        problems.append(f"Deployment: metrics must be served on :{METRICS_PORT} (DGMM_METRICS_LISTEN), got {metrics!r}")
    if ports.get("metrics") != METRICS_PORT:
        problems.append(f"Deployment: container port 'metrics' must be {METRICS_PORT}")
    ann = dig(dep, "spec", "template", "metadata", "annotations", default={})
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(METRICS_PORT):
        problems.append(f"Deployment: pod annotations prometheus.io/scrape \"true\" and prometheus.io/port \"{METRICS_PORT}\" are required")

    # Resources: one GPU, CPU and memory requests, a memory limit.
    res = c.get("resources", {})
    if str(dig(res, "limits", "nvidia.com/gpu")) != "1":
        problems.append("Deployment: resources.limits must request nvidia.com/gpu: 1")
    if dig(res, "requests", "nvidia.com/gpu") is not None and str(dig(res, "requests", "nvidia.com/gpu")) != str(dig(res, "limits", "nvidia.com/gpu")):
        problems.append("Deployment: nvidia.com/gpu requests must equal limits")
    for section, key in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
        if dig(res, section, key) is None:
            problems.append(f"Deployment: resources.{section}.{key} is required")
    budget = env.get("DGMM_HOST_MEMORY_BUDGET", SERVER_DEFAULTS.get("host_memory_budget"))
    mem_limit = k8s_quantity_bytes(dig(res, "limits", "memory"))
    if str(budget).strip().endswith("%"):
        problems.append("Deployment: DGMM_HOST_MEMORY_BUDGET must be absolute: a percentage is of the node's MemAvailable, not the container's memory limit")
    elif mem_limit is not None and (parse_bytes(budget) or 0) >= mem_limit:
        problems.append(f"Deployment: DGMM_HOST_MEMORY_BUDGET {budget} must be below the memory limit {dig(res, 'limits', 'memory')}")

    # Probes: native gRPC health checks on the gRPC port.
    for probe in ("livenessProbe", "readinessProbe"):
        grpc = dig(c, probe, "grpc")
        if not isinstance(grpc, dict):
            problems.append(f"Deployment: {probe} must be a native gRPC probe (grpc: {{port: {GRPC_PORT}}})")
            continue
        if grpc.get("port") != GRPC_PORT:
            problems.append(f"Deployment: {probe}.grpc.port must be the integer {GRPC_PORT}")
        if grpc.get("service", "") not in HEALTH_SERVICES:
            problems.append(f"Deployment: {probe}.grpc.service must be one of {sorted(HEALTH_SERVICES)}")

    # Drain: the grace period covers the preStop hook plus the drain timeout.
    drain = drain_timeout_k8s(c)
    if "drain_timeout_s" not in args:
        problems.append("Deployment: pass --drain_timeout_s explicitly in args, next to terminationGracePeriodSeconds")
    pre_stop = pre_stop_seconds(c)
    grace = pod.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace <= drain + pre_stop:
        problems.append(f"Deployment: terminationGracePeriodSeconds ({grace}) must exceed preStop ({pre_stop} s) + --drain_timeout_s ({drain} s)")
    if dig(pod, "securityContext", "runAsNonRoot") is not True:
        problems.append("Deployment: the pod must run as non-root (securityContext.runAsNonRoot: true)")

    # Headless Service for client-side round_robin, selecting the pods.
    if dig(svc, "spec", "clusterIP") != "None":
        problems.append("Service: must be headless (clusterIP: None) for gRPC client-side round_robin")
    sel = dig(svc, "spec", "selector", default={})
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        problems.append("Service: selector must match the Deployment's pod labels")
    svc_ports = {p.get("name"): p for p in dig(svc, "spec", "ports", default=[])}
    if dig(svc_ports, "grpc", "port") != GRPC_PORT or dig(svc_ports, "grpc", "targetPort") not in (GRPC_PORT, "grpc"):
        problems.append(f"Service: port 'grpc' must be {GRPC_PORT} targeting the container's grpc port")

    # PodDisruptionBudget over the same pods, that still lets a drain proceed.
    psel = dig(pdb, "spec", "selector", "matchLabels", default={})
    if not psel or any(labels.get(k) != v for k, v in psel.items()):
        problems.append("PodDisruptionBudget: selector must match the Deployment's pod labels")
    spec = pdb.get("spec", {})
    if ("minAvailable" in spec) == ("maxUnavailable" in spec):
        problems.append("PodDisruptionBudget: set exactly one of minAvailable and maxUnavailable")
    replicas = dig(dep, "spec", "replicas", default=1)
    if isinstance(spec.get("minAvailable"), int) and spec["minAvailable"] >= replicas:
        problems.append("PodDisruptionBudget: minAvailable >= replicas would block every voluntary eviction")
    if spec.get("maxUnavailable") == 0:
        problems.append("PodDisruptionBudget: maxUnavailable 0 would block every voluntary eviction")

    if kustomization_resources is not None and manifest_files is not None:
        if sorted(kustomization_resources) != sorted(manifest_files):
            problems.append(f"kustomization.yaml: resources {sorted(kustomization_resources)} must list every manifest {sorted(manifest_files)}")
    return problems


def drain_timeout_k8s(container):
    args = flags_in_argv([str(a) for a in container.get("args", [])])
    env = {e.get("name"): e.get("value") for e in container.get("env", [])}
    value = args.get("drain_timeout_s", env.get("DGMM_DRAIN_TIMEOUT_S", dockerfile_env().get("DGMM_DRAIN_TIMEOUT_S", SERVER_DEFAULTS["drain_timeout_s"])))
    return int(value)


def pre_stop_seconds(container):
    hook = dig(container, "lifecycle", "preStop", default={})
    if "sleep" in hook:
        return int(hook["sleep"].get("seconds", 0))
    cmd = dig(hook, "exec", "command", default=[])
    if cmd and cmd[0] == "sleep":
        return int(cmd[1])
    return 0


# ---------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text):
    """[(INSTRUCTION, arguments)] with continuations joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        current = ""
    return out


def dockerfile_env(text=None):
    text = text if text is not None else (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    env = {}
    for ins, rest in dockerfile_instructions(text):
        if ins == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
    return env


def exec_form(rest):
    try:
        value = json.loads(rest)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def expand_args(text, args):
    """${NAME} and $NAME replaced with the ARG defaults known so far."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def stage_arg(instructions, name):
    """The default of `ARG name=...` in one stage's instructions, or None."""
    for word, rest in instructions:
        key, eq, value = rest.partition("=")
        if word == "ARG" and key.strip() == name:
            return value.strip().strip("\"'") if eq else ""
    return None


def healthcheck_problem(server, listen, where):
    """None when a health probe with --server `server` (None: not given) reaches DGMM_LISTEN `listen`."""
    want = f"127.0.0.1:{port_of(listen)}"
    if server is None:
        if not CLI_SERVER_FOLLOWS_LISTEN:
            return f"{where}: without --server the probe goes to 127.0.0.1:50051, but dgmm-cli no longer derives --server from DGMM_LISTEN"
        return None
    if server != want:
        return f"{where}: --server {server} must be {want} (DGMM_LISTEN's port), or left out so that dgmm-cli follows DGMM_LISTEN"
    return None


def check_dockerfile(text):
    problems = []
    ins = dockerfile_instructions(text)
    args = {}
    stages = []  # [(image, name, [instructions])]
    for word, rest in ins:
        if word == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key.strip()] = expand_args(value.strip(), args)
        elif word == "FROM":
            image = expand_args(rest.split()[0], args)
            name = rest.split()[2] if len(rest.split()) >= 3 and rest.split()[1].upper() == "AS" else None
            stages.append((image, name, []))
        elif stages:
            stages[-1][2].append((word, rest))
    if len(stages) < 2:
        return ["Dockerfile: must be multi-stage (a build stage and a runtime stage)"]
    build_image, build_name, build = stages[0]
    run_image, _, runtime = stages[-1]
    cuda = re.fullmatch(r"nvidia/cuda:(\d+)\.[\d.]+-(devel|runtime)-ubuntu24\.04", build_image)
    if not cuda or cuda.group(1) != "13" or cuda.group(2) != "devel":
        problems.append(f"Dockerfile: the build stage must be FROM a CUDA 13 devel image on Ubuntu 24.04, got {build_image}")
    cuda = re.fullmatch(r"nvidia/cuda:(\d+)\.[\d.]+-(devel|runtime)-ubuntu24\.04", run_image)
    if not cuda or cuda.group(1) != "13" or cuda.group(2) != "runtime":
        problems.append(f"Dockerfile: the runtime stage must be FROM the CUDA 13 runtime image on Ubuntu 24.04, got {run_image}")

    build_runs = [r for w, r in build if w == "RUN"]
    runtime_runs = [r for w, r in runtime if w == "RUN"]
    if not any(re.search(r"(^|[\s;&|/])scripts/install-deps\.sh\s+compile\b", r) for r in build_runs):
        problems.append("Dockerfile: the build stage must RUN scripts/install-deps.sh compile (the CI's "
                        "install step less its test tools)")
    build_sh = [r for r in build_runs if re.search(r"(^|[\s;&|/])scripts/build\.sh\b", r)]
    if not build_sh:
        problems.append("Dockerfile: the build stage must RUN scripts/build.sh (the CI's build step)")
    else:
        r = build_sh[0]
        targets = re.search(r"BUILD_TARGETS=(\"[^\"]*\"|'[^']*'|\S+)", r)
        if not targets or not {"dgmm-server", "dgmm-cli"} <= set(targets.group(1).strip("\"'").split()):
            problems.append("Dockerfile: scripts/build.sh must get BUILD_TARGETS with dgmm-server and dgmm-cli")
        cuda_on = re.search(r"\bDGMM_CUDA=ON\b", r)
        cuda_arg = re.search(r"\bDGMM_CUDA=\"?\$\{?DGMM_CUDA\}?\"?(\s|$)", r)
        if not cuda_on and not (cuda_arg and stage_arg(build, "DGMM_CUDA") == "ON"):
            problems.append("Dockerfile: scripts/build.sh must get DGMM_CUDA=ON, or DGMM_CUDA=\"${DGMM_CUDA}\" "
                            "from a build-stage ARG DGMM_CUDA=ON (the default image is for GPUs)")
    if not any(re.search(r"install-deps\.sh\s+runtime\b", r) for r in runtime_runs):
        problems.append("Dockerfile: the runtime stage must RUN install-deps.sh runtime")
    for r in build_runs + runtime_runs:
        if re.search(r"apt-get\s+install|apt\s+install|cmake\s+-S|cmake\s+--build", r):
            problems.append(f"Dockerfile: '{r[:60]}...' repeats what scripts/install-deps.sh or scripts/build.sh do; call them instead")
    if any(w == "COPY" and not r.startswith("--from") and r.split()[0] == "." for w, r in runtime):
        problems.append("Dockerfile: the runtime stage must not copy the source tree")
    if build_name and not any(w == "COPY" and r.startswith(f"--from={build_name}") for w, r in runtime):
        problems.append("Dockerfile: the runtime stage must COPY --from the build stage")

    users = [r for w, r in runtime if w == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("Dockerfile: the runtime stage must switch to a non-root USER")
    exposed = {p.split("/")[0] for w, r in runtime if w == "EXPOSE" for p in r.split()}
    for port in (GRPC_PORT, METRICS_PORT):
        if str(port) not in exposed:
            problems.append(f"Dockerfile: EXPOSE {port}")
    env = dockerfile_env("\n".join(f"{w} {r}" for w, r in runtime))
    if env.get("DGMM_LISTEN") != f"0.0.0.0:{GRPC_PORT}":
        problems.append(f"Dockerfile: ENV DGMM_LISTEN=0.0.0.0:{GRPC_PORT} is required")
    entry = [exec_form(r) for w, r in runtime if w == "ENTRYPOINT"]
    if not entry or entry[-1] is None or pathlib.PurePath(entry[-1][0]).name != "dgmm-server":
        problems.append("Dockerfile: ENTRYPOINT must be the exec form [\"dgmm-server\"]")
    hc = [r for w, r in runtime if w == "HEALTHCHECK"]
    cmd = None
    if hc and " CMD " in f" {hc[-1]} ":
        cmd = exec_form(hc[-1].split("CMD", 1)[1].strip())
    if not cmd or cmd[:2] != ["dgmm-cli", "health"]:
        problems.append("Dockerfile: HEALTHCHECK must run [\"dgmm-cli\", \"health\", ...] (exec form)")
    else:
        problem = healthcheck_problem(flags_in_argv(cmd).get("server"), env.get("DGMM_LISTEN", ":0"), "Dockerfile: HEALTHCHECK")
        if problem:
            problems.append(problem)
    return problems


# ---------------------------------------------------------------- Compose


def compose_servers(services):
    """The services that run dgmm-server (the image's ENTRYPOINT, or an
    entrypoint naming it); the others are clients."""
    servers = {}
    for name, s in services.items():
        entry = s.get("entrypoint")
        entry = shlex.split(entry) if isinstance(entry, str) else list(entry or [])
        if not entry or pathlib.PurePath(str(entry[0])).name == "dgmm-server":
            servers[name] = s
    return servers


def service_env(s):
    env = s.get("environment", {})
    return dict(e.split("=", 1) for e in env) if isinstance(env, list) else env


REGIONS_ON = ("true", "1", "yes")
DEFAULT_SOCKET_DIR = "/run/dgmm"  # --local_socket=auto in the image: /run/dgmm/dgmm-<port>.sock


def socket_dir(env):
    """The directory of a regions server's local socket (DGMM_LOCAL_SOCKET,
    'auto' in the image: /run/dgmm, which the Dockerfile gives to uid 10001)."""
    path = str(env.get("DGMM_LOCAL_SOCKET", "auto"))
    return DEFAULT_SOCKET_DIR if path == "auto" else str(pathlib.PurePosixPath(path).parent)


def compose_mounts(s):
    """[(source, target, read_only)] of a service's volumes (short or long syntax)."""
    out = []
    for v in s.get("volumes", []) or []:
        if isinstance(v, dict):
            out.append((str(v.get("source", "")), str(v.get("target", "")), bool(v.get("read_only"))))
        else:
            parts = str(v).split(":")
            if len(parts) >= 2:
                out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def check_compose_regions(services, volumes=None):
    """A regions server (DGMM_ALLOW_REGIONS) keeps its local socket in a
    named volume mounted at the socket's directory; a client container
    mounts that volume at the same path (the client takes the path from
    GetServerInfo; dgmm-cli has no flag for another) and depends on the
    server. Host memory then needs nothing else shared: a client that joins
    an IPC namespace (ipc: service:NAME, for CUDA IPC) needs a server that
    shares it (ipc: shareable)."""
    problems = []
    servers = compose_servers(services)
    volumes = {} if volumes is None else volumes
    regions = {n: s for n, s in servers.items()
               if str(service_env(s).get("DGMM_ALLOW_REGIONS", "false")).lower() in REGIONS_ON}
    socket_volume = {}  # volume name -> (server, socket dir)
    for name, s in regions.items():
        where = socket_dir(service_env(s))
        named = [src for src, dst, _ in compose_mounts(s) if dst == where and src and src[0] not in "/.~"]
        if not named:
            problems.append(f"compose.yaml: {name} (regions on) must mount a named volume at its local socket's directory {where}")
            continue
        if named[0] not in volumes:
            problems.append(f"compose.yaml: volume {named[0]} of {name} must be declared under the top-level volumes:")
        socket_volume[named[0]] = (name, where)
    clients = {}
    for name, s in services.items():
        if name in servers:
            continue
        for src, dst, _ in compose_mounts(s):
            if src in socket_volume:
                owner, where = socket_volume[src]
                clients.setdefault(owner, []).append(name)
                if dst != where:
                    problems.append(f"compose.yaml: {name} must mount {src} at {where}, where {owner}'s socket is (got {dst})")
                if owner not in dig(s, "depends_on", default={}):
                    problems.append(f"compose.yaml: {name} must depend on {owner} (it uses its local socket)")
        ipc = str(s.get("ipc", ""))
        if ipc.startswith("service:"):
            owner = ipc[len("service:"):]
            if owner not in servers:
                problems.append(f"compose.yaml: {name} joins the IPC namespace of {owner}, which is no dgmm-server service")
            elif servers[owner].get("ipc") != "shareable":
                problems.append(f"compose.yaml: {owner} must have ipc: shareable for {name} to join it")
    for name in regions:
        if name in {o for o, _ in socket_volume.values()} and not clients.get(name):
            problems.append(f"compose.yaml: no client service mounts {name}'s socket volume")
    return problems


def check_compose(doc):
    problems = []
    services = doc.get("services", {})
    gpu = services.get("dgmm")
    if gpu is None:
        return ["compose.yaml: a service named dgmm is required"]
    devices = dig(gpu, "deploy", "resources", "reservations", "devices", default=[])
    if not any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
               and (d.get("count") == "all" or (isinstance(d.get("count"), int) and d["count"] >= 1) or d.get("device_ids"))
               for d in devices):
        problems.append("compose.yaml: dgmm must reserve GPUs (deploy.resources.reservations.devices: driver nvidia, count all or N, capabilities [gpu])")
    cpu = [n for n, s in services.items() if "cpu" in s.get("profiles", [])]
    if not cpu:
        problems.append("compose.yaml: a CPU-only service under profiles: [cpu] is required")
    for name in cpu:
        s = services[name]
        if dig(s, "deploy", "resources", "reservations", "devices"):
            problems.append(f"compose.yaml: {name} (profile cpu) must not reserve GPUs")
        if str(dig(s, "environment", "DGMM_BACKEND")) != "cpu":
            problems.append(f"compose.yaml: {name} (profile cpu) must set DGMM_BACKEND: cpu")
    host_ports = {}
    for name, s in compose_servers(services).items():
        env = s.get("environment", {})
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env)
        listen = env.get("DGMM_LISTEN", dockerfile_env().get("DGMM_LISTEN"))
        published = [str(p) for p in s.get("ports", [])]
        if not any(p.endswith(f":{port_of(listen)}") for p in published):
            problems.append(f"compose.yaml: {name} must publish DGMM_LISTEN's port {port_of(listen)}")
        for p in published:
            host = p.rsplit(":", 1)[0]
            if host in host_ports:
                problems.append(f"compose.yaml: host port {host} is published by both {host_ports[host]} and {name}")
            host_ports[host] = name
        test = [str(t) for t in dig(s, "healthcheck", "test", default=[])]
        if test[:3] != ["CMD", "dgmm-cli", "health"]:
            problems.append(f"compose.yaml: {name}'s healthcheck must be [CMD, dgmm-cli, health, ...]")
        elif healthcheck_problem(flags_in_argv(test).get("server"), listen, ""):
            problems.append(f"compose.yaml: {name}'s healthcheck" + healthcheck_problem(flags_in_argv(test).get("server"), listen, ""))
        if s.get("restart") not in ("always", "unless-stopped", "on-failure") and not dig(s, "deploy", "restart_policy"):
            problems.append(f"compose.yaml: {name} needs a restart policy")
        drain = int(flags_in_argv([str(a) for a in s.get("command", []) or []]).get(
            "drain_timeout_s", env.get("DGMM_DRAIN_TIMEOUT_S", dockerfile_env().get("DGMM_DRAIN_TIMEOUT_S", SERVER_DEFAULTS["drain_timeout_s"]))))
        if duration_s(s.get("stop_grace_period", "10s")) <= drain:
            problems.append(f"compose.yaml: {name}'s stop_grace_period must exceed the drain timeout ({drain} s)")
    return problems + check_compose_regions(services, doc.get("volumes") or {})


# ---------------------------------------------------------------- regions overlay


def check_k8s_regions(kustomization, patches, base_objs):
    """docker/k8s-regions: the base plus a patch that turns regions on in the
    server container and mounts an emptyDir at its local socket's directory
    in the server container and in a client container of the same pod (the
    same path: the client takes it from GetServerInfo), with a region budget
    that is absolute and a memory limit on each client (its regions are its
    own memory)."""
    problems = []
    if kustomization.get("resources") != ["../k8s"]:
        problems.append("k8s-regions/kustomization.yaml: resources must be [../k8s] (the base)")
    patch_paths = [p.get("path") if isinstance(p, dict) else p for p in kustomization.get("patches", [])]
    if sorted(patch_paths) != sorted(patches):
        problems.append(f"k8s-regions/kustomization.yaml: patches {patch_paths} must list {sorted(patches)}")
    base = next((o for _, o in base_objs if o.get("kind") == "Deployment"), {})
    deps = [o for objs in patches.values() for o in objs if o.get("kind") == "Deployment"]
    if len(deps) != 1 or dig(deps[0], "metadata", "name") != dig(base, "metadata", "name"):
        return problems + ["k8s-regions: one patch must be of the base Deployment (same metadata.name)"]
    pod = dig(deps[0], "spec", "template", "spec", default={})
    containers = {c.get("name"): c for c in pod.get("containers", [])}
    server_name = dig(base, "spec", "template", "spec", "containers", 0, "name")
    env = {e.get("name"): e.get("value") for e in containers.get(server_name, {}).get("env", [])}
    if str(env.get("DGMM_ALLOW_REGIONS", "false")).lower() not in REGIONS_ON:
        problems.append("k8s-regions: the server container must set DGMM_ALLOW_REGIONS \"true\"")
    budget = env.get("DGMM_REGION_MEMORY_BUDGET")
    if budget is None or str(budget).strip().endswith("%"):
        problems.append("k8s-regions: DGMM_REGION_MEMORY_BUDGET must be set and absolute (a percentage is of the node's memory)")
    where = socket_dir(env)
    empty_dirs = {v.get("name") for v in pod.get("volumes", []) if "emptyDir" in v}
    at_socket = [m.get("name") for m in containers.get(server_name, {}).get("volumeMounts", [])
                 if m.get("mountPath") == where and m.get("name") in empty_dirs]
    if not at_socket:
        return problems + [f"k8s-regions: the server container ({server_name}) must mount an emptyDir at its local socket's directory {where}"]
    volume = at_socket[0]
    clients = [n for n, c in containers.items() if n != server_name
               and any(m.get("name") == volume for m in c.get("volumeMounts", []))]
    if not clients:
        problems.append(f"k8s-regions: a client container must mount {volume} (the server's local socket) too")
    for name in clients:
        paths = [m.get("mountPath") for m in containers[name]["volumeMounts"] if m.get("name") == volume]
        if paths != [where]:
            problems.append(f"k8s-regions: client {name} must mount {volume} at {where}, where the server's socket is (got {paths})")
        if not dig(containers[name], "resources", "limits", "memory"):
            problems.append(f"k8s-regions: client {name} needs a memory limit (its regions are its own memory)")
    return problems


def k8s_regions_parts():
    kust = load_yaml(K8S_REGIONS / "kustomization.yaml")[0]
    patches = {}
    for p in kust.get("patches", []):
        path = p.get("path") if isinstance(p, dict) else p
        patches[path] = load_yaml(K8S_REGIONS / path) if (K8S_REGIONS / path).exists() else []
    return kust, patches


# ---------------------------------------------------------------- flags and variables

FLAG_TOKEN = re.compile(r"(?<![\w-])--([A-Za-z][A-Za-z0-9_-]*)")
ENV_TOKEN = re.compile(r"\bDGMM_[A-Z0-9_]*[A-Z0-9]\b")


def check_names(files):
    """Every DGMM_* and --flag in `files` ({label: text}) is a real one."""
    problems = []
    for label, text in files.items():
        for lineno, line in enumerate(text.splitlines(), 1):
            for var in ENV_TOKEN.findall(line):
                if var in BUILD_VARIABLES:
                    continue
                if not var.startswith(flags_table.ENV_PREFIX) or var[len(flags_table.ENV_PREFIX):].lower() not in SERVER_FLAGS:
                    problems.append(f"{label}:{lineno}: {var} is not DGMM_<FLAG> of any dgmm-server flag")
            for flag in FLAG_TOKEN.findall(line):
                n = norm(flag)
                if n not in SERVER_FLAGS and n not in CLI_FLAGS and n not in OTHER_FLAGS:
                    problems.append(f"{label}:{lineno}: --{flag} is no flag of dgmm-server, dgmm-cli or the tools listed in OTHER_TOOL_FLAGS")
                elif "dgmm-server" in line and "dgmm-cli" not in line and n not in SERVER_FLAGS and n not in OTHER_FLAGS:
                    problems.append(f"{label}:{lineno}: --{flag} is given to dgmm-server but is no dgmm-server flag")
    return problems


def check_server_argv(objs, compose):
    """Arguments that reach dgmm-server itself must be its flags, exactly."""
    problems = []
    argvs = []
    for name, o in objs:
        for c in dig(o, "spec", "template", "spec", "containers", default=[]):
            argvs.append((f"{name}:{c.get('name')}", c.get("args", []) + c.get("command", [])[1:]))
            for e in c.get("env", []):
                argvs.append((f"{name}:{c.get('name')} env", [f"--{e['name'][5:].lower()}"] if e["name"].startswith("DGMM_") else []))
    for name, s in compose_servers(compose.get("services", {})).items():
        argvs.append((f"compose.yaml:{name}", s.get("command", []) or []))
        env = s.get("environment", {})
        argvs.append((f"compose.yaml:{name} env", [f"--{k[5:].lower()}" for k in env if k.startswith("DGMM_")]))
    for label, argv in argvs:
        for flag in flags_in_argv([str(a) for a in argv]):
            if flag not in SERVER_FLAGS:
                problems.append(f"{label}: --{flag} is not a dgmm-server flag")
    return problems


def check_bases():
    problems = []
    for var, reader in BUILD_VARIABLES.items():
        if var not in reader.read_text(encoding="utf-8"):
            problems.append(f"{var} is allowed as a build variable of {reader.relative_to(ROOT)}, which no longer reads it")
    for tool, flags in OTHER_TOOL_FLAGS.items():
        for f in flags & SERVER_FLAGS:
            problems.append(f"--{f} is listed for {tool} but is a dgmm-server flag: drop it from OTHER_TOOL_FLAGS")
    return problems


def doc_and_docker_texts():
    files = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
             for p in sorted(DOCKER.rglob("*")) if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.parts}
    files[str(DOC.relative_to(ROOT))] = DOC.read_text(encoding="utf-8")
    return files


# ---------------------------------------------------------------- tests


class Artifacts(unittest.TestCase):
    def test_every_yaml_parses(self):
        paths = sorted(DOCKER.rglob("*.yaml")) + sorted(DOCKER.rglob("*.yml"))
        self.assertGreaterEqual(len(paths), 5)
        for path in paths:
            with self.subTest(path=str(path.relative_to(ROOT))):
                self.assertTrue(load_yaml(path), "empty YAML")

    def test_kubernetes_manifests_have_what_a_gpu_grpc_service_needs(self):
        kust = load_yaml(K8S / "kustomization.yaml")[0]
        files = [p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"]
        self.assertEqual(check_k8s([o for o in k8s_objects() if o[1].get("kind") != "Kustomization"],
                                   kust.get("resources"), files), [])

    def test_grace_period_exceeds_the_drain_timeout(self):
        dep = next(o for _, o in k8s_objects() if o.get("kind") == "Deployment")
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        self.assertGreater(pod["terminationGracePeriodSeconds"], drain_timeout_k8s(c) + pre_stop_seconds(c))

    def test_dockerfile_builds_with_the_ci_scripts(self):
        self.assertEqual(check_dockerfile((DOCKER / "Dockerfile").read_text(encoding="utf-8")), [])

    def test_compose_has_gpu_and_cpu_services(self):
        self.assertEqual(check_compose(load_yaml(DOCKER / "compose.yaml")[0]), [])

    def test_compose_shows_a_client_reaching_the_servers_socket(self):
        doc = load_yaml(DOCKER / "compose.yaml")[0]
        services = doc["services"]
        clients = [n for n, s in services.items() if n not in compose_servers(services)
                   and any(dst == DEFAULT_SOCKET_DIR for _, dst, _ in compose_mounts(s))]
        self.assertTrue(clients, "compose.yaml: no client service mounts the regions server's socket volume")
        self.assertEqual(check_compose_regions(services, doc.get("volumes")), [])
        for name in clients:  # memory travels as a descriptor: no IPC namespace or /dev/shm to share
            self.assertNotIn("ipc", services[name])
            self.assertFalse([dst for _, dst, _ in compose_mounts(services[name]) if dst == "/dev/shm"])

    def test_k8s_regions_overlay_shares_the_socket_in_one_pod(self):
        kust, patches = k8s_regions_parts()
        self.assertEqual(check_k8s_regions(kust, patches, k8s_objects()), [])

    def test_every_dgmm_variable_and_flag_named_is_real(self):
        self.assertEqual(check_bases(), [])
        self.assertEqual(check_names(doc_and_docker_texts()), [])
        self.assertEqual(check_server_argv(k8s_objects(), load_yaml(DOCKER / "compose.yaml")[0]), [])

    def test_operations_doc_flags_table_matches_the_flags(self):
        text = DOC.read_text(encoding="utf-8")
        self.assertEqual(flags_table.replace_table(text, flags_table.render(flags_table.server_flags())), text,
                         "docs/operations.md's flags table is stale: run docker/flags_table.py --write")
        for name in SERVER_FLAGS:
            self.assertIn(f"`--{name}`", text)

    def test_dockerignore_keeps_build_trees_and_vcs_out(self):
        lines = {l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")}
        for must in (".git", "build", "build-*", "**/node_modules", ".gpu"):
            self.assertIn(must, lines)
        for needed in ("scripts", "service", "proto", "client", "CMakeLists.txt"):
            self.assertNotIn(needed, lines)


class ChecksCatchBreakage(unittest.TestCase):
    """Each check, fed a broken copy, reports the breakage."""

    def setUp(self):
        self.objs = [o for o in k8s_objects() if o[1].get("kind") != "Kustomization"]
        self.dockerfile = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
        self.compose = load_yaml(DOCKER / "compose.yaml")[0]

    def mutated(self, kind, change):
        objs = copy.deepcopy(self.objs)
        for _, o in objs:
            if o.get("kind") == kind:
                change(o)
        return check_k8s(objs)

    def container(self, dep):
        return dep["spec"]["template"]["spec"]["containers"][0]

    def assertFinds(self, problems, fragment):
        self.assertTrue(any(fragment in p for p in problems), f"expected a problem with {fragment!r}, got {problems}")

    def test_missing_gpu_request(self):
        self.assertFinds(self.mutated("Deployment", lambda d: self.container(d)["resources"]["limits"].pop("nvidia.com/gpu")), "nvidia.com/gpu")

    def test_http_probe_instead_of_grpc(self):
        self.assertFinds(self.mutated("Deployment", lambda d: self.container(d).update(livenessProbe={"tcpSocket": {"port": GRPC_PORT}})), "livenessProbe")

    def test_readiness_on_unknown_health_service(self):
        self.assertFinds(self.mutated("Deployment", lambda d: self.container(d)["readinessProbe"]["grpc"].update(service="dgmm")), "readinessProbe.grpc.service")

    def test_grace_period_not_longer_than_drain(self):
        self.assertFinds(self.mutated("Deployment", lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=30)), "terminationGracePeriodSeconds")
        self.assertFinds(self.mutated("Deployment", lambda d: self.container(d).update(args=["--drain_timeout_s=60"])), "terminationGracePeriodSeconds")

    def test_service_not_headless(self):
        self.assertFinds(self.mutated("Service", lambda s: s["spec"].pop("clusterIP")), "headless")

    def test_pdb_that_blocks_every_eviction(self):
        self.assertFinds(self.mutated("PodDisruptionBudget", lambda p: p["spec"].update(maxUnavailable=0)), "block")

    def test_percentage_host_budget_in_a_memory_limited_pod(self):
        def to_pct(d):
            for e in self.container(d)["env"]:
                if e["name"] == "DGMM_HOST_MEMORY_BUDGET":
                    e["value"] = "50%"
        self.assertFinds(self.mutated("Deployment", to_pct), "absolute")

    def test_missing_pdb(self):
        self.assertFinds(check_k8s([o for o in self.objs if o[1]["kind"] != "PodDisruptionBudget"]), "PodDisruptionBudget")

    def test_dockerfile_that_installs_by_itself(self):
        broken = self.dockerfile.replace("scripts/install-deps.sh compile", "apt-get install -y cmake")
        problems = check_dockerfile(broken)
        self.assertFinds(problems, "install-deps.sh compile")
        self.assertFinds(problems, "repeats")

    def test_dockerfile_without_build_script_or_targets(self):
        self.assertFinds(check_dockerfile(self.dockerfile.replace("scripts/build.sh", "make")), "scripts/build.sh")
        self.assertFinds(check_dockerfile(self.dockerfile.replace("dgmm-server dgmm-cli", "dgmm-server")), "BUILD_TARGETS")

    def test_dockerfile_running_as_root_or_on_cuda_12(self):
        self.assertFinds(check_dockerfile(self.dockerfile.replace("USER 10001:10001", "USER root")), "non-root")
        self.assertFinds(check_dockerfile(self.dockerfile.replace("CUDA_VERSION=13.0.0", "CUDA_VERSION=12.8.0")), "CUDA 13")

    def test_dockerfile_bases_and_cuda_switch_are_build_arguments(self):
        ins = dockerfile_instructions(self.dockerfile)
        globals_ = [r.split("=")[0] for w, r in ins[:[w for w, _ in ins].index("FROM")] if w == "ARG"]
        self.assertIn("BUILD_BASE", globals_)
        self.assertIn("RUNTIME_BASE", globals_)
        self.assertFinds(check_dockerfile(self.dockerfile.replace("ARG DGMM_CUDA=ON", "ARG DGMM_CUDA=OFF")), "DGMM_CUDA")
        self.assertFinds(check_dockerfile(self.dockerfile.replace("-runtime-${UBUNTU_RELEASE}", "-base-${UBUNTU_RELEASE}")), "runtime stage")
        self.assertFinds(check_dockerfile(self.dockerfile.replace("ARG BUILD_BASE=nvidia/cuda:", "ARG BUILD_BASE=debian:bookworm #")), "build stage")

    def test_healthcheck_on_another_port_than_dgmm_listen(self):
        broken = self.dockerfile.replace('CMD ["dgmm-cli", "health",', 'CMD ["dgmm-cli", "health", "--server", "127.0.0.1:50052",')
        self.assertNotEqual(broken, self.dockerfile)
        self.assertFinds(check_dockerfile(broken), "HEALTHCHECK")
        fixed = self.dockerfile.replace('CMD ["dgmm-cli", "health",', 'CMD ["dgmm-cli", "health", "--server", "127.0.0.1:50051",')
        self.assertEqual(check_dockerfile(fixed), [])
        c = copy.deepcopy(self.compose)
        c["services"]["dgmm-cpu"]["healthcheck"] = {"test": ["CMD", "dgmm-cli", "health", "--server", "127.0.0.1:50052"]}
        self.assertFinds(check_compose(c), "dgmm-cpu's healthcheck")

    def test_compose_without_gpu_reservation_or_cpu_profile(self):
        c = copy.deepcopy(self.compose)
        c["services"]["dgmm"].pop("deploy")
        self.assertFinds(check_compose(c), "reserve GPUs")
        c = copy.deepcopy(self.compose)
        for s in c["services"].values():
            s.pop("profiles", None)
        self.assertFinds(check_compose(c), "profiles: [cpu]")

    def test_compose_stop_grace_shorter_than_drain(self):
        c = copy.deepcopy(self.compose)
        c["services"]["dgmm"]["stop_grace_period"] = "10s"
        self.assertFinds(check_compose(c), "stop_grace_period")

    def test_unknown_flag_or_variable(self):
        self.assertFinds(check_names({"doc": "run dgmm-server --drain-timeout=30"}), "--drain-timeout")
        self.assertFinds(check_names({"doc": "set DGMM_GPU_BUDGET=1GiB"}), "DGMM_GPU_BUDGET")
        self.assertFinds(check_names({"doc": "dgmm-server --server=x:1"}), "given to dgmm-server")
        self.assertEqual(check_names({"doc": "dgmm-server --max-queue=8 --help; DGMM_MAX_QUEUE=8"}), [])

    def test_unknown_flag_in_k8s_args(self):
        objs = copy.deepcopy(self.objs)
        for _, o in objs:
            if o["kind"] == "Deployment":
                self.container(o)["args"].append("--gpu_budget=1GiB")
        self.assertFinds(check_server_argv(objs, self.compose), "--gpu_budget")

    def test_stale_flags_table(self):
        text = DOC.read_text(encoding="utf-8").replace("`DGMM_MAX_QUEUE`", "`DGMM_QUEUE`")
        self.assertNotEqual(flags_table.replace_table(text, flags_table.render(flags_table.server_flags())), text)

    def test_compose_regions_client_without_the_socket_volume(self):
        def mounts(s, *v):
            s["volumes"] = list(v)
        for change, fragment in (
                (lambda c: mounts(c["services"]["dgmm-regions"]), "must mount a named volume"),
                (lambda c: mounts(c["services"]["dgmm-regions"], "/srv/dgmm:/run/dgmm"), "must mount a named volume"),
                (lambda c: c["services"]["dgmm-regions"]["environment"].update(DGMM_LOCAL_SOCKET="/var/run/x/d.sock"), "/var/run/x"),
                (lambda c: c.pop("volumes"), "top-level volumes"),
                (lambda c: mounts(c["services"]["dgmm-regions-client"]), "no client service mounts"),
                (lambda c: mounts(c["services"]["dgmm-regions-client"], "dgmm-run:/sock"), "at /run/dgmm"),
                (lambda c: c["services"]["dgmm-regions-client"].pop("depends_on"), "must depend on"),
                (lambda c: c["services"]["dgmm-regions-client"].update(ipc="service:dgmm-regions"), "shareable"),
                (lambda c: c["services"]["dgmm-regions-client"].update(ipc="service:nowhere"), "no dgmm-server service")):
            c = copy.deepcopy(self.compose)
            change(c)
            self.assertFinds(check_compose(c), fragment)
        c = copy.deepcopy(self.compose)  # the long syntax, read-only, is the same mount
        c["services"]["dgmm-regions-client"]["volumes"] = [{"type": "volume", "source": "dgmm-run", "target": "/run/dgmm", "read_only": True}]
        self.assertEqual(check_compose(c), [])
        c["services"]["dgmm-regions"]["environment"]["DGMM_ALLOW_REGIONS"] = "false"  # not a regions server: no rules
        self.assertEqual(check_compose_regions(c["services"], c["volumes"]), [])

    def test_compose_client_is_not_held_to_the_servers_checks(self):
        c = copy.deepcopy(self.compose)
        self.assertEqual([p for p in check_compose(c) if "dgmm-regions-client" in p], [])
        c["services"]["dgmm-regions-client"].pop("entrypoint")  # now it would run dgmm-server
        self.assertFinds(check_compose(c), "dgmm-regions-client must publish")

    def test_k8s_regions_overlay_breakage(self):
        kust, patches = k8s_regions_parts()
        base = k8s_objects()

        def broken(change):
            p = copy.deepcopy(patches)
            change(next(o for objs in p.values() for o in objs if o.get("kind") == "Deployment")["spec"]["template"]["spec"])
            return check_k8s_regions(kust, p, base)

        def env(pod, name, value):
            pod["containers"][0]["env"] = [e for e in pod["containers"][0]["env"] if e["name"] != name] + [{"name": name, "value": value}]

        self.assertEqual(broken(lambda pod: None), [])
        self.assertFinds(broken(lambda pod: pod.pop("volumes")), "must mount an emptyDir")
        self.assertFinds(broken(lambda pod: pod["containers"][0].pop("volumeMounts")), "must mount an emptyDir")
        self.assertFinds(broken(lambda pod: env(pod, "DGMM_LOCAL_SOCKET", "/tmp/d.sock")), "at its local socket's directory /tmp")
        self.assertEqual(broken(lambda pod: env(pod, "DGMM_LOCAL_SOCKET", "auto")), [])  # the image's /run/dgmm
        self.assertFinds(broken(lambda pod: pod["containers"][1].pop("volumeMounts")), "a client container must mount")
        self.assertFinds(broken(lambda pod: pod["containers"][1]["volumeMounts"][0].update(mountPath="/sock")), "at /run/dgmm")
        self.assertFinds(broken(lambda pod: env(pod, "DGMM_ALLOW_REGIONS", "false")), "DGMM_ALLOW_REGIONS")
        self.assertFinds(broken(lambda pod: env(pod, "DGMM_REGION_MEMORY_BUDGET", "50%")), "absolute")
        self.assertFinds(broken(lambda pod: pod["containers"][1]["resources"].pop("limits")), "memory limit")
        self.assertFinds(check_k8s_regions(dict(kust, resources=["../k8s/deployment.yaml"]), patches, base), "resources")


if __name__ == "__main__":
    unittest.main()
