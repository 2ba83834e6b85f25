"""README.md's Python blocks run as written: in order, in one namespace, in a fresh
interpreter (as a user pasting them into one session would), on the CPU and, where there is
one, on a CUDA device. A failure names the block (number and README line) and its error."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import octopus
from conftest import HAS_CUDA

README = Path(__file__).resolve().parents[2] / "README.md"
# Each block is run with this many seconds to spare (the whole README on a loaded 2-core machine
# takes about a minute).
TIMEOUT_S = 900

# Runs the blocks of the README given as argv[1]; exits 1 after printing which block failed.
RUNNER = r'''
import re, sys, traceback

text = open(sys.argv[1], encoding="utf-8").read()
blocks = [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
          for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]
namespace = {"__name__": "__main__"}
for number, (line, source) in enumerate(blocks, 1):
    print(f"--- block {number} of {len(blocks)} (README.md line {line})", flush=True)
    try:
        # Padded with newlines so that tracebacks give README's own line numbers.
        exec(compile("\n" * (line - 1) + source, "README.md", "exec"), namespace)
    except BaseException as e:
        traceback.print_exc()
        print(f"README_BLOCK_FAILED {number} (README.md line {line}): {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
print(f"README_BLOCKS_OK {len(blocks)}", flush=True)
'''


def python_blocks(text):
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def run_readme(tmp_path, env_overrides):
    runner = tmp_path / "run_readme_blocks.py"
    runner.write_text(RUNNER)
    env = dict(os.environ)
    # The octopus this test imported, whether installed or from a source tree on PYTHONPATH.
    package_root = str(Path(octopus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["OCTOPUS_CACHE_DIR"] = str(tmp_path / "cache")  # autotune's choice stays in this test
    env.update(env_overrides)
    proc = subprocess.run([sys.executable, str(runner), str(README)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    output = proc.stdout + proc.stderr
    failed = re.search(r"^README_BLOCK_FAILED (.*)$", output, re.M)
    if failed:
        pytest.fail(f"README.md python block {failed.group(1)}\n\n{output}", pytrace=False)
    if proc.returncode != 0 or "README_BLOCKS_OK" not in output:
        pytest.fail(f"running README.md's python blocks exited with {proc.returncode}\n\n{output}", pytrace=False)
    return output


def test_readme_has_python_blocks():
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    assert "device = " in blocks[0], "the first block defines the device the others use"


def test_readme_blocks_run_on_cpu(tmp_path):
    output = run_readme(tmp_path, {"CUDA_VISIBLE_DEVICES": ""})
    assert f"README_BLOCKS_OK {len(python_blocks(README.read_text(encoding='utf-8')))}" in output


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")
def test_readme_blocks_run_on_cuda(tmp_path):
    output = run_readme(tmp_path, {})
    assert "README_BLOCKS_OK" in output


def test_a_failing_block_is_named(tmp_path):
    """The runner reports the failing block's number, README line and error."""
    readme = tmp_path / "README.md"
    readme.write_text("intro\n\n```python\nx = 1\n```\n\ntext\n\n```python\ny = x + 1\nz = undefined_name\n```\n")
    runner = tmp_path / "run_readme_blocks.py"
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(readme)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "README_BLOCK_FAILED 2 (README.md line 10): NameError: name 'undefined_name' is not defined" in proc.stdout
    assert 'File "README.md", line 11' in proc.stderr  # the traceback points into README
