"""Builds loom's Python package with CMake for pip (see pyproject.toml).

The extension loom._loom is loom's own CMake target `loom_python`: this configures the
repository one level up (Release, no tests, no tools) in a build folder of its own, builds
that one target, and puts the module next to the package's .py files. Set LOOM_BUILD_DIR to
an existing build folder of this source tree to build there instead (make test does, so the
install test reuses what the Release build made).
"""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = Path(__file__).resolve().parent.parent  # the repository: its CMakeLists.txt


class MissingTool(SystemExit):
    pass


def require(condition, what, package):
    if not condition:
        raise MissingTool(
            f"loom: building the Python package needs {what}; on Debian: "
            f"sudo apt-get install {package} (scripts/install-deps.sh installs everything loom needs)"
        )


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        require(shutil.which("cmake"), "CMake", "cmake")
        require(shutil.which("c++") or shutil.which("g++") or os.environ.get("CXX"),
                "a C++20 compiler", "build-essential")
        try:
            import pybind11  # noqa: F401
            have_pybind11 = True
        except ImportError:
            have_pybind11 = Path("/usr/share/cmake/pybind11/pybind11Config.cmake").exists() or \
                Path("/usr/lib/cmake/pybind11/pybind11Config.cmake").exists()
        require(have_pybind11, "pybind11", "pybind11-dev")

        build_dir = Path(os.environ.get("LOOM_BUILD_DIR") or Path(self.build_temp).resolve() / "cmake")
        if not (build_dir / "CMakeCache.txt").exists():
            self.run_step(["cmake", "-S", str(SOURCE), "-B", str(build_dir), "-Wno-dev",
                           "-DCMAKE_BUILD_TYPE=Release", "-DLOOM_BUILD_PYTHON=ON",
                           "-DLOOM_BUILD_TESTS=OFF", "-DLOOM_BUILD_TOOLS=OFF",
                           f"-DPython3_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        self.run_step(["cmake", "--build", str(build_dir), "--target", "loom_python", "-j", jobs])

        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build_dir / "python" / "loom" / f"_loom{suffix}"
        if not built.exists():
            raise SystemExit(f"loom: the build made no {built.name} in {built.parent} "
                             f"(is that build folder configured for {sys.executable}?)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)

    @staticmethod
    def run_step(command):
        print("loom:", " ".join(command), flush=True)
        subprocess.run(command, check=True)


setup(ext_modules=[Extension("loom._loom", sources=[])], cmdclass={"build_ext": CMakeBuild})
