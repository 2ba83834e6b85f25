"""The guide's Python examples run as written: each page's ``.. code-block:: python`` blocks in
order, in one namespace, in a fresh interpreter (as a reader pasting them into one session
would), on the CPU and, where there is one, on a CUDA device. A failure names the page, the
block (number and line) and its error. The docs themselves build with warnings as errors
in CI (.ci/run)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import octopus
from conftest import HAS_CUDA

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide"
PAGES = sorted(p.name for p in GUIDE.glob("*.rst"))
TIMEOUT_S = 900

# Runs the python blocks of the .rst page argv[1]; exits 1 after printing which block failed.
RUNNER = r'''
import re, sys, traceback

lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
blocks, i = [], 0
while i < len(lines):
    if re.match(r"^\s*\.\. code-block:: python\s*$", lines[i]):
        indent = len(lines[i]) - len(lines[i].lstrip()) + 3
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or lines[j].startswith(" " * indent)):
            j += 1
        body = [l[indent:] for l in lines[i + 1:j]]
        start = i + 3  # (1-based) the first line after the directive (i + 1) and its blank line
        blocks.append((start, "\n".join(body).strip("\n") + "\n"))
        i = j
    else:
        i += 1
namespace = {"__name__": "__main__"}
for number, (line, source) in enumerate(blocks, 1):
    print(f"--- block {number} of {len(blocks)} (line {line})", flush=True)
    try:
        exec(compile("\n" * (line - 1) + source, sys.argv[1], "exec"), namespace)
    except BaseException as e:
        traceback.print_exc()
        print(f"GUIDE_BLOCK_FAILED {number} (line {line}): {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
print(f"GUIDE_BLOCKS_OK {len(blocks)}", flush=True)
'''


def run_page(page, tmp_path, env_overrides):
    runner = tmp_path / "run_guide_blocks.py"
    runner.write_text(RUNNER)
    env = dict(os.environ)
    package_root = str(Path(octopus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["OCTOPUS_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(env_overrides)
    proc = subprocess.run([sys.executable, str(runner), str(GUIDE / page)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    if "GUIDE_BLOCK_FAILED" in output or proc.returncode != 0 or "GUIDE_BLOCKS_OK" not in output:
        pytest.fail(f"docs/guide/{page}: a python block failed (exit {proc.returncode})\n\n{output}", pytrace=False)
    return output


def test_every_page_is_in_the_guide_and_most_have_examples():
    assert {"index.rst", "ragged.rst", "strategies.rst", "scheduler.rst", "diffusion.rst", "distributed.rst",
            "bench.rst"} <= set(PAGES)
    with_examples = [p for p in PAGES if ".. code-block:: python" in (GUIDE / p).read_text()]
    assert len(with_examples) >= 6


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_on_cpu(page, tmp_path):
    run_page(page, tmp_path, {"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_on_cuda(page, tmp_path):
    run_page(page, tmp_path, {})


def test_a_failing_block_is_named(tmp_path):
    page = tmp_path / "page.rst"
    page.write_text(textwrap.dedent("""\
        Title
        =====

        .. code-block:: python

           x = 1

        Text.

        .. code-block:: python

           y = x + 1
           z = undefined_name
        """))
    runner = tmp_path / "run_guide_blocks.py"
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(page)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "GUIDE_BLOCK_FAILED 2 (line 12): NameError: name 'undefined_name' is not defined" in proc.stdout
    assert "line 13" in proc.stderr  # the traceback points at the page's own line
