"""The build's options as README documents them: CMakeLists.txt configured (not built) in a
scratch directory with each value of OCTOPUS_WITH_CUDA."""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cmake_version():
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        return None
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


pytestmark = pytest.mark.skipif((cmake_version() or (0, 0)) < (3, 26), reason="needs cmake >= 3.26 and ninja")


def configure(tmp_path, with_cuda):
    return subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-G", "Ninja",
                           f"-DOCTOPUS_WITH_CUDA={with_cuda}", f"-DPython_EXECUTABLE={sys.executable}"],
                          capture_output=True, text=True, timeout=300)


def test_off_builds_the_cpu_kernels_only_even_with_nvcc_present(tmp_path):
    result = configure(tmp_path, "OFF")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CUDA kernels: OFF" in result.stdout, result.stdout


def test_an_unknown_value_is_refused_naming_the_choices(tmp_path):
    result = configure(tmp_path, "maybe")
    assert result.returncode != 0
    assert "OCTOPUS_WITH_CUDA must be ON, OFF or AUTO, got 'maybe'" in result.stdout + result.stderr
