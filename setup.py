"""Builds the C++ ledger `hsd_fast._C` with CMake + ninja (after pybind11's cmake_example)."""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()


class CMakeExtension(Extension):
    def __init__(self, name: str, source_dir: Path) -> None:
        super().__init__(name, sources=[])
        self.source_dir = source_dir


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        # pip builds in a fresh isolated environment each time, and a cache left by an earlier build
        # points at that environment's (now deleted) cmake and ninja: configure from scratch.
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        config = "Debug" if self.debug else "Release"
        configure = [
            "cmake",
            str(ext.source_dir),
            "-G",
            "Ninja",
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}{os.sep}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        ]
        try:
            subprocess.run(configure, cwd=build_dir, check=True)
            subprocess.run(["cmake", "--build", ".", "--parallel"], cwd=build_dir, check=True)
        except (OSError, subprocess.CalledProcessError) as err:
            raise RuntimeError(
                "hsd_fast: building the C++ extension hsd_fast._C failed. It needs a C++17 "
                "compiler, CMake >= 3.18 and ninja (the last two come from PyPI as build "
                "requirements). "
                f"Cause: {err}"
            ) from err


setup(ext_modules=[CMakeExtension("hsd_fast._C", ROOT)], cmdclass={"build_ext": CMakeBuild})
