"""The build's options as README documents them: CMakeLists.txt configured (not built) in a
scratch directory with each value of OCTOPUS_WITH_CUDA, and against stand-in torch packages whose
CMake configs declare torch's C++ standard in each way torch releases have (or not at all)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cmake_version():
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        return None
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


pytestmark = pytest.mark.skipif((cmake_version() or (0, 0)) < (3, 26), reason="needs cmake >= 3.26 and ninja")


def configure(tmp_path, with_cuda, env=None):
    return subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-G", "Ninja",
                           f"-DOCTOPUS_WITH_CUDA={with_cuda}", f"-DPython_EXECUTABLE={sys.executable}"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_off_builds_the_cpu_kernels_only_even_with_nvcc_present(tmp_path):
    result = configure(tmp_path, "OFF")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CUDA kernels: OFF" in result.stdout, result.stdout


def test_an_unknown_value_is_refused_naming_the_choices(tmp_path):
    result = configure(tmp_path, "maybe")
    assert result.returncode != 0
    assert "OCTOPUS_WITH_CUDA must be ON, OFF or AUTO, got 'maybe'" in result.stdout + result.stderr


# What each torch release's TorchConfig.cmake says about its C++ standard, on its `torch` target.
DECLARATIONS = {
    "property": "set_target_properties(torch PROPERTIES CXX_STANDARD {std})",  # torch <= 2.14
    "feature": "target_compile_features(torch INTERFACE cxx_std_{std})",       # torch 2.15
    "option": 'set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_OPTIONS '
              '"$<$<COMPILE_LANGUAGE:CXX>:-std=c++{std}>")',                     # 2.15, compiler without features
    "nothing": "",
}


def stand_in_torch(root, version, declaration, std=20, pybind11=True):
    """A package named torch, importable from `root`, with just what CMakeLists.txt reads: the
    version, no CUDA, its include directory (with pybind11's header where `pybind11`, as torch
    ships it), and a CMake config defining the `torch` target as `declaration` says."""
    package = root / "torch"
    config = package / "share" / "cmake" / "Torch"
    config.mkdir(parents=True)
    (package / "include" / "pybind11").mkdir(parents=True)
    if pybind11:
        (package / "include" / "pybind11" / "pybind11.h").write_text("")
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        from types import SimpleNamespace
        __version__ = "{version}"
        version = SimpleNamespace(cuda=None)
        utils = SimpleNamespace(cmake_prefix_path={str(package / "share" / "cmake")!r})
    """))
    (config / "TorchConfig.cmake").write_text(textwrap.dedent("""
        add_library(torch INTERFACE IMPORTED)
        set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=1")
        set(TORCH_LIBRARIES torch)
        set(Torch_FOUND TRUE)
    """) + f'set(TORCH_INCLUDE_DIRS "{(package / "include").as_posix()}")\n'
        + DECLARATIONS[declaration].format(std=std) + "\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *sys.path]))


def compile_standard(build):
    """The -std flag the generated build gives the extension's C++ sources."""
    flags = set(re.findall(r"-std=c\+\+(\d+)", (build / "build.ninja").read_text()))
    assert len(flags) == 1, flags
    return int(flags.pop())


@pytest.mark.parametrize("version, declaration, std, expected", [
    ("2.14.1", "property", 20, 20),
    ("2.11.0", "property", 17, 17),
    ("2.15.0", "feature", 20, 20),
    ("2.15.0", "option", 20, 20),
    ("2.15.0", "nothing", None, 20),   # torch's documented requirement: C++20 from 2.13
    ("2.13.0", "nothing", None, 20),
    ("2.12.1", "nothing", None, 17),   # ... C++17 before
    ("3.0.0", "nothing", None, 20),
])
def test_the_cxx_standard_is_the_one_torch_declares(tmp_path, version, declaration, std, expected):
    pytest.importorskip("pybind11")
    env = stand_in_torch(tmp_path / "site", version, declaration, std)
    result = configure(tmp_path, "OFF", env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"octopus: torch {version} in " in result.stdout, result.stdout
    assert f", C++{expected}, CUDA kernels: OFF" in result.stdout, result.stdout
    assert compile_standard(tmp_path / "build") == expected


def test_a_torch_that_declares_no_standard_and_has_no_version_is_refused_naming_it(tmp_path):
    pytest.importorskip("pybind11")
    env = stand_in_torch(tmp_path / "site", "nightly", "nothing")
    result = configure(tmp_path, "OFF", env)
    assert result.returncode != 0
    assert "cannot tell which C++ standard torch 'nightly'" in result.stdout + result.stderr


def test_a_torch_without_its_own_pybind11_headers_is_refused_naming_them(tmp_path):
    # octopus._graph_replay must share torch's pybind11 internals (CMakeLists.txt).
    pytest.importorskip("pybind11")
    env = stand_in_torch(tmp_path / "site", "2.14.1", "property", 20, pybind11=False)
    result = configure(tmp_path, "OFF", env)
    assert result.returncode != 0
    assert "this torch ships no pybind11 headers" in result.stdout + result.stderr
