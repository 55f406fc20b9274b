"""Builds the package `dgmm` with its extension dgmm._core and gRPC stubs.

    pip install --no-build-isolation ./client/python

The extension (a pybind11 binding of the C++ client, client/cpp) and the
stubs (dgmm/v1/dgmm_pb2*.py) are made by CMake (client/python/CMakeLists.txt)
and copied into the package:
  - DGMM_BUILD_DIR=<build dir> takes them from a build of the repository
    (scripts/build.sh) made for this Python (CMake's DGMM_PYTHON; files in
    <build dir>/python/dgmm);
  - otherwise `cmake -S client/python` configures a build of its own, of
    dgmm_proto, dgmm_client, the stubs and the extension only, in
    DGMM_CMAKE_BUILD_DIR (default: build/cmake next to this file), with
    ccache when it is installed. Needs cmake, a C++20 compiler, gRPC,
    Protobuf and Abseil (Debian: libgrpc++-dev protobuf-compiler-grpc
    libprotobuf-dev protobuf-compiler libabsl-dev), pybind11 headers
    (pybind11-dev) and Python's headers (python3-dev).
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
EXT_NAME = "_core" + sysconfig.get_config_var("EXT_SUFFIX")
STUBS = ("dgmm_pb2.py", "dgmm_pb2_grpc.py")


def _cmake_build():
    """Builds the extension and stubs with CMake; returns the staging directory."""
    build = os.environ.get("DGMM_CMAKE_BUILD_DIR") or os.path.join(HERE, "build", "cmake")
    configure = ["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DDGMM_PYTHON=" + sys.executable]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    subprocess.run(configure, check=True)
    jobs = os.environ.get("JOBS") or str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", build, "-j", jobs, "--target", "dgmm_python_ext"],
                   check=True)
    return os.path.join(build, "python")


def _stage():
    build_dir = os.environ.get("DGMM_BUILD_DIR")
    stage = os.path.join(build_dir, "python") if build_dir else _cmake_build()
    missing = [p for p in [os.path.join("dgmm", EXT_NAME)] +
               [os.path.join("dgmm", "v1", s) for s in STUBS]
               if not os.path.exists(os.path.join(stage, p))]
    if missing:
        sys.exit("dgmm setup.py: %s lacks %s; build it for this Python (%s) with "
                 "cmake -DDGMM_PYTHON=%s" % (stage, ", ".join(missing), sys.version.split()[0],
                                             sys.executable))
    return stage


class BuildPyWithCore(build_py):
    """Copies the package's sources, then the built extension and stubs."""

    def run(self):
        super().run()
        stage = _stage()
        package = os.path.join(self.build_lib, "dgmm")
        os.makedirs(os.path.join(package, "v1"), exist_ok=True)
        shutil.copy2(os.path.join(stage, "dgmm", EXT_NAME), os.path.join(package, EXT_NAME))
        for stub in STUBS:
            shutil.copy2(os.path.join(stage, "dgmm", "v1", stub), os.path.join(package, "v1", stub))
        with open(os.path.join(package, "v1", "__init__.py"), "w") as f:
            f.write('"""dgmm.v1: generated from proto/dgmm/v1/dgmm.proto at build time."""\n')


class BinaryDistribution(Distribution):
    """The package carries a compiled module: a platform wheel."""

    def has_ext_modules(self):
        return True


# Setuptools' scratch files go to the build tree, not into the sources.
scratch = os.path.join(os.environ.get("DGMM_BUILD_DIR") or os.path.join(HERE, "build"),
                       "python", "setuptools")
os.makedirs(scratch, exist_ok=True)
setup(cmdclass={"build_py": BuildPyWithCore}, distclass=BinaryDistribution,
      options={"build": {"build_base": os.path.relpath(os.path.join(scratch, "build"), HERE)},
               "egg_info": {"egg_base": os.path.relpath(scratch, HERE)}})
