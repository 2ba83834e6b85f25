"""octopus refuses to load its extension under a torch other than the one it was compiled
against, with an ImportError that names both and says how to rebuild (never an undefined-symbol
traceback from the loader)."""

import os
import subprocess
import sys
import textwrap

import pytest

from octopus._library import REBUILD_COMMAND, check_torch


@pytest.mark.parametrize("running, running_cuda", [
    ("2.14.1+cu130", "13.0"),   # the same torch
    ("2.14.0+cu130", "13.0"),   # another patch release
    ("2.14.1+cu132", "13.2"),   # another CUDA minor version
])
def test_same_release_and_cuda_major_load(running, running_cuda):
    check_torch("2.14.1+cu130", "13.0", running, running_cuda)


def test_cpu_only_torch_matches_cpu_only_build():
    check_torch("2.14.1+cpu", None, "2.14.0", None)


@pytest.mark.parametrize("running, running_cuda, described", [
    ("2.13.0+cu130", "13.0", "torch 2.13.0+cu130 (CUDA 13.0)"),   # another release
    ("3.14.1+cu130", "13.0", "torch 3.14.1+cu130 (CUDA 13.0)"),   # another major release
    ("2.14.1+cpu", None, "torch 2.14.1+cpu (CPU-only)"),          # no CUDA libraries to link
    ("2.14.1+cu128", "12.8", "torch 2.14.1+cu128 (CUDA 12.8)"),   # another CUDA runtime
])
def test_other_torch_raises_naming_both_and_how_to_rebuild(running, running_cuda, described):
    with pytest.raises(ImportError) as info:
        check_torch("2.14.1+cu130", "13.0", running, running_cuda)
    message = str(info.value)
    assert "compiled against torch 2.14.1+cu130 (CUDA 13.0)" in message
    assert f"this Python has {described}" in message
    assert 'pip install "torch==2.14.*"' in message
    assert REBUILD_COMMAND in message


def test_import_under_another_torch_fails_before_loading_the_extension(tmp_path):
    build_info = pytest.importorskip(
        "octopus._build_info", reason="a source tree without the build's _build_info.py (development)")
    script = textwrap.dedent("""
        import sys
        import torch
        torch.__version__ = "1.0.0"
        try:
            import octopus
        except ImportError as e:
            print("octopus._C" in sys.modules)
            print(e)
        else:
            print("imported")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    loaded, message = out.stdout.split("\n", 1)
    assert loaded == "False"
    assert f"compiled against torch {build_info.TORCH_VERSION}" in message
    assert "this Python has torch 1.0.0" in message
