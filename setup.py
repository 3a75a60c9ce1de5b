"""Builds the extension kvengine._kvengine with this repository's CMake build.

pyproject.toml holds the package's metadata; this file only tells setuptools how to
build the one C++ extension: configure the tree (tests and tools off) for the
interpreter that runs the build (sys.executable, a venv's included), build the
`_kvengine` target, and copy the module where setuptools packs it.

Environment (docs/python.md, "pip"):
  KVENGINE_CUDA=ON|OFF|AUTO   the GPU staging Env (default OFF: a CPU build)
  KVENGINE_BUILD_DIR=DIR      CMake's build directory (default: under setuptools' build_temp)
  KVENGINE_CMAKE_ARGS="..."   more -D arguments, split on spaces
  KVENGINE_BUILD_JOBS=N       parallel build jobs (default: CPU count)
  KVENGINE_PREBUILT_MODULE=F  pack this already-built _kvengine*.so instead of building
                              (the CTest's quick mode: the module of the build under test)
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        prebuilt = os.environ.get("KVENGINE_PREBUILT_MODULE")
        if prebuilt:
            shutil.copyfile(prebuilt, target)
            return
        build_dir = os.environ.get("KVENGINE_BUILD_DIR") or os.path.join(
            os.path.abspath(self.build_temp), "cmake")
        os.makedirs(build_dir, exist_ok=True)
        args = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DKV_BUILD_TESTS=OFF", "-DKV_BUILD_TOOLS=OFF", "-DKV_BUILD_PYTHON=ON",
            "-DPython_EXECUTABLE=" + sys.executable,
            "-DKV_WITH_CUDA=" + os.environ.get("KVENGINE_CUDA", "OFF"),
        ]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        args += os.environ.get("KVENGINE_CMAKE_ARGS", "").split()
        subprocess.run(args, check=True)
        jobs = os.environ.get("KVENGINE_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", build_dir, "--target", "_kvengine", "-j", jobs],
                       check=True)
        built = os.path.join(build_dir, "python", "kvengine")
        module = [f for f in os.listdir(built) if f.startswith("_kvengine") and f.endswith(".so")]
        if len(module) != 1:
            raise RuntimeError("expected one _kvengine*.so in %s, found %s" % (built, module))
        shutil.copyfile(os.path.join(built, module[0]), target)


setup(ext_modules=[CMakeExtension("kvengine._kvengine")], cmdclass={"build_ext": CMakeBuild})
