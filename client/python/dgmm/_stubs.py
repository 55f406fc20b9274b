"""Locates, and when needed generates, the Python stubs for dgmm's proto.

The stubs are never committed: they are generated from proto/dgmm/v1/dgmm.proto
by the build (CMake target `dgmm_python_stubs`) or, the first time the package
is imported without them, here by running protoc. protoc writes `dgmm_pb2`
as the module `dgmm.v1.dgmm_pb2`; the package adds `<stub dir>/dgmm` to its
own `__path__` so that name resolves to the generated file.

Environment:
  DGMM_PY_PROTO_DIR  directory holding (or to receive) the generated tree;
                     default: `_proto` next to this file.
  DGMM_PROTO_DIR     directory holding dgmm/v1/dgmm.proto; default: the
                     repository's proto/ (three levels above this package).
  DGMM_PROTOC        protoc binary; default: `protoc` on PATH, then /usr/bin.
  DGMM_GRPC_PYTHON_PLUGIN  grpc_python_plugin binary; same search.
"""

import os
import shutil
import subprocess
import tempfile

PROTO_REL = os.path.join("dgmm", "v1", "dgmm.proto")
_GENERATED = (os.path.join("dgmm", "v1", "dgmm_pb2.py"),
              os.path.join("dgmm", "v1", "dgmm_pb2_grpc.py"))

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class StubGenerationError(ImportError):
    """The stubs are missing and could not be generated."""


def proto_dir():
    """Directory that holds dgmm/v1/dgmm.proto (it may not exist)."""
    env = os.environ.get("DGMM_PROTO_DIR")
    if env:
        return env
    return os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "..", "proto"))


def stub_dir():
    """Directory that holds the generated tree (dgmm/v1/dgmm_pb2*.py)."""
    return os.environ.get("DGMM_PY_PROTO_DIR") or os.path.join(_PACKAGE_DIR, "_proto")


def _find_tool(env_name, name):
    path = os.environ.get(env_name) or shutil.which(name)
    if path:
        return path
    fallback = os.path.join("/usr/bin", name)
    return fallback if os.path.exists(fallback) else None


def _is_current(out_dir, proto_file):
    """True when every stub exists and none is older than the proto (if any)."""
    try:
        stub_mtimes = [os.stat(os.path.join(out_dir, g)).st_mtime for g in _GENERATED]
    except OSError:
        return False
    if not os.path.exists(proto_file):  # Nothing to compare with: trust them.
        return True
    return min(stub_mtimes) >= os.stat(proto_file).st_mtime


def _generate(proto_root, out_dir):
    protoc = _find_tool("DGMM_PROTOC", "protoc")
    plugin = _find_tool("DGMM_GRPC_PYTHON_PLUGIN", "grpc_python_plugin")
    if not protoc or not plugin:
        raise StubGenerationError(
            "dgmm: the generated stubs are missing and protoc/grpc_python_plugin "
            "were not found; install protobuf-compiler and protobuf-compiler-grpc "
            "(Debian) or set DGMM_PROTOC and DGMM_GRPC_PYTHON_PLUGIN")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    # Generate next to the destination and swap it in with a rename, so that
    # concurrent imports never see a half-written tree.
    tmp = tempfile.mkdtemp(prefix=".dgmm-stubs-", dir=parent)
    try:
        cmd = [protoc, "--python_out=" + tmp, "--grpc_out=" + tmp,
               "--plugin=protoc-gen-grpc=" + plugin, "-I", proto_root, PROTO_REL]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise StubGenerationError(
                "dgmm: generating the stubs failed: %s\n%s" % (" ".join(cmd), run.stderr))
        old = None
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=".dgmm-stubs-old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "stubs"))
        try:
            os.rename(tmp, out_dir)
        except OSError:
            # Another process swapped its tree in first; keep it if it is good.
            if not _is_current(out_dir, os.path.join(proto_root, PROTO_REL)):
                raise
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_stubs():
    """Returns the directory whose `dgmm/` subtree holds current stubs.

    Generates them first when they are missing or older than the proto.
    Raises StubGenerationError when that is impossible.
    """
    out_dir = stub_dir()
    proto_root = proto_dir()
    proto_file = os.path.join(proto_root, PROTO_REL)
    if _is_current(out_dir, proto_file):
        return out_dir
    if not os.path.exists(proto_file):
        raise StubGenerationError(
            "dgmm: no generated stubs in %s and no proto at %s to generate them "
            "from; set DGMM_PROTO_DIR to the directory holding dgmm/v1/dgmm.proto"
            % (out_dir, proto_file))
    try:
        _generate(proto_root, out_dir)
    except PermissionError:
        # A read-only install: generate into a per-user cache instead.
        cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                             os.path.join(os.path.expanduser("~"), ".cache"),
                             "dgmm", "proto-stubs")
        if not _is_current(cache, proto_file):
            _generate(proto_root, cache)
        return cache
    return out_dir
