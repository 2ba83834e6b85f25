"""octopus-bench end to end on the CPU at a tiny scale: JSON (schema-checked), plots, and
clear messages for bad arguments."""

import json
import os
import subprocess
import sys

import pytest
import torch

import octopus
from octopus.bench import report
from octopus.bench.distributions import SizesFileError, read_sizes_file, read_visdrone_boxes

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(args, tmp_path, timeout=600):
    env = dict(os.environ, OCTOPUS_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "octopus.bench", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def check_result(path):
    with open(path) as f:
        result = json.load(f)
    assert report.validate(result) == []
    return result


def test_all_workloads_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(["--all", "--items", "200", "--repeats", "2", "--steps", "10", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "No GPU in use" in proc.stdout
    result = check_result(out / "bench.json")
    assert result["scale_down"] == 1000 and result["environment"]["device_type"] == "cpu"
    workloads = {r["workload"] for r in result["rows"]}
    assert workloads == {"affine", "normalize", "padding", "crop_resize", "stencil", "tiles", "diffusion"}
    assert {r["distribution"] for r in result["rows"] if r["workload"] == "stencil"} == {"small-100k", "normal-10k"}
    for w in ("affine", "normalize", "padding"):
        assert {r["distribution"] for r in result["rows"] if r["workload"] == w} == {
            "normal", "small", "tiny", "longtail", "bimodal", "heavytail", "dustgiant"}
    methods = {r["method"] for r in result["rows"]}
    for s in ("plan", "plan_host", "block_search", "search", "lookup"):
        assert any(m.startswith(f"octopus {s}") for m in methods)
    assert {"copy (ceiling)", "torch repeat_interleave", "torch padded batch", "octopus normalize",
            "torch segment_reduce + repeat_interleave", "octopus to_padded", "octopus from_padded (back)",
            "octopus from_padded (back, sizes from the host)",
            "torch.nested.to_padded_tensor", "octopus crop_resize", "torch F.interpolate per crop",
            "octopus gaussian_blur (replicate)", "octopus depthwise_conv3x3 (zero)", "torch conv2d on the padded batch",
            "torch conv2d per image", "octopus tile_filter (stats + keep)", "octopus tile_filter + gather kept tiles",
            "torch per-tile loop (stats + keep)", "torch per-tile loop + gather"} <= methods
    assert sorted({r["items"] for r in result["scaling"]}) == [1, 10, 100, 1000]
    assert result["autotune"]["strategy"] in ("plan", "block_search", "search", "lookup")
    assert result["autotune"]["verdicts"], "autotune's choice was not judged on any workload"
    for r in result["rows"]:
        if r["kernel_ms"] is not None:
            assert r["kernel_ms"] > 0 and r["total_ms"] >= r["kernel_ms"]
            assert "memory floor" in r["method"] or len(r["times_ms"]) >= 1
        if r.get("host_ms") is not None:  # every measured call's host time is kept beside its time
            assert 0 < r["host_ms"] <= 1.5 * max(r["times_ms"]) + 1.0
            # the allocator's counts are the GPU's; a CPU run has none to give
            assert r["device_mallocs"] is None and r["alloc_retries"] is None
    assert sorted(os.path.basename(p) for p in result["plots"]) == ["scaling.png", "time_per_method.png"]
    for p in result["plots"]:
        data = open(p, "rb").read()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert "autotune chose" in proc.stdout and "kernel ms" in proc.stdout


def test_sizes_file_runs(tmp_path):
    coco = tmp_path / "coco.json"
    coco.write_text(json.dumps({"annotations": [{"bbox": [0, 0, 30.4, 12]}, {"bbox": [5, 5, 120, 80]},
                                                {"bbox": [1, 2, 0.2, 7]}]}))
    proc = run_cli(["affine", "--sizes-file", str(coco), "--repeats", "1", "--strategies", "plan", "search",
                    "--no-plots", "--no-baselines", "--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = check_result(tmp_path / "o" / "bench.json")
    assert {r["distribution"] for r in result["rows"]} == {"file"}
    assert {r["elements"] for r in result["rows"]} == {12 * 30 + 80 * 120 + 7 * 1}


@pytest.mark.parametrize("args, message", [
    (["warp"], "unknown workload 'warp'"),
    (["--items", "-5"], "--items: must be positive"),
    (["--items", "many"], "--items: expected a whole number"),
    (["--block-elems", "100"], "multiple of 16"),
    (["--dists", "gaussian"], "unknown distribution 'gaussian'"),
    (["--dists", "file"], "needs --sizes-file"),
    (["--sizes-file", "/nonexistent/boxes.json"], "cannot read sizes file"),
    (["--strategies", "magic"], "unknown strategy 'magic'"),
    (["--device", "tpu"], "--device must be cuda or cpu"),
    (["--energy-window-ms", "-1"], "--energy-window-ms must be 0 or more"),
])
def test_bad_arguments_give_a_clear_message(tmp_path, args, message):
    proc = run_cli(args + ["--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("content, message", [
    ("{broken", "not valid JSON"),
    (json.dumps({"images": []}), "'annotations' list"),
    (json.dumps({"annotations": [{"bbox": [0, 0, -3, 4]}]}), "negative"),
    ("12 30\n-4 5\n", "non-negative"),
    ("12 30\nabc\n", "not numbers"),
    ("12 30\n7\n", "extents after lines"),
    ("1,2,3,4,5,6,7,8,9\n", "or a VisDrone-VID/MOT one"),
    ("", "no item sizes"),
])
def test_bad_sizes_files(tmp_path, content, message):
    path = tmp_path / "sizes.txt"
    path.write_text(content)
    with pytest.raises(SizesFileError, match=message):
        read_sizes_file(str(path))
    proc = run_cli(["--sizes-file", str(path), "--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and message in proc.stderr


def test_sizes_file_formats(tmp_path):
    visdrone = tmp_path / "frames"
    visdrone.mkdir()
    (visdrone / "0001.txt").write_text("684,8,273,116,0,0,0,0\n406,119,265,70,0,0,0,0\n")
    (visdrone / "0002.txt").write_text("1,2,3,4,1,1,0,0\n")
    assert read_sizes_file(str(visdrone)).tolist() == [[116, 273], [70, 265], [4, 3]]
    # VisDrone-VID / -MOT: frame and target id first, then the same box (not read as a box of
    # width = left and height = top).
    video = tmp_path / "uav0000086_00000_v.txt"
    video.write_text("1,0,684,8,273,116,0,0,0,0\n2,3,406,119,265,70,1,4,0,1\n")
    assert read_sizes_file(str(video)).tolist() == [[116, 273], [70, 265]]
    plain = tmp_path / "plain.txt"
    plain.write_text("# H W\n10 20\n30,40\n")
    assert read_sizes_file(str(plain)).tolist() == [[10, 20], [30, 40]]
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("5\n0\n9\n")
    assert read_sizes_file(str(lengths)).tolist() == [[5], [0], [9]]


def test_visdrone_boxes(tmp_path):
    path = tmp_path / "0001.txt"
    path.write_text("684,8,273,116,0,0,0,0\n# a comment\n\n406,119,265,70,0.75,4,\n")
    ann = read_visdrone_boxes(str(path))
    assert ann.boxes.tolist() == [[684, 8, 273, 116], [406, 119, 265, 70]]
    assert ann.score.tolist() == [0.0, 0.75] and ann.category.tolist() == [0, 4]
    assert ann.boxes.dtype == ann.category.dtype == torch.int64
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert read_visdrone_boxes(str(empty)).boxes.shape == (0, 4)


@pytest.mark.parametrize("content, message", [
    ("1,2,3,4,1\n", "expected 6 or 8 fields"),
    ("1,2,3,4,1,1,0\n", "expected 6 or 8 fields"),
    ("1,2,3,-4,1,1\n", "non-negative"),
    ("1,2,inf,4,1,1\n", "finite"),
    ("1,2,x,4,1,1\n", "line 1: not numbers"),
])
def test_bad_visdrone_boxes(tmp_path, content, message):
    path = tmp_path / "a.txt"
    path.write_text(content)
    with pytest.raises(SizesFileError, match=message):
        read_visdrone_boxes(str(path))
    with pytest.raises(SizesFileError, match="cannot read annotation file"):
        read_visdrone_boxes(str(tmp_path / "missing.txt"))


def test_validate_reports_problems():
    assert report.validate({}) != []
    good_row = dict(workload="affine", distribution="tiny", items=1, elements=2, method="m", strategy=None,
                    block_elems=None, setup_ms=0.0, h2d_ms=0.0, metadata_mb=0.0, kernel_ms=None, d2h_ms=None,
                    total_ms=None, gbs=None, pct_copy=None, peak_mb=None, energy_mj=None, note="")
    result = dict(schema=report.SCHEMA, environment={k: "x" for k in report.ENVIRONMENT_FIELDS}, copy_gbs=1.0,
                  scale_down=1, energy="", autotune={}, rows=[good_row], scaling=[], plots=[])
    assert report.validate(result) == ["rows[0] has no measurement and no note saying why"]
    result["rows"][0]["note"] = "skipped"
    assert report.validate(result) == []
    result["rows"][0]["items"] = "1"
    assert report.validate(result) == ["rows[0]['items'] has type str"]


def test_autotune_verdicts_judge_the_choice_within_three_percent():
    def r(dist, strategy, block, total):
        return dict(workload="affine", distribution=dist, method=f"octopus {strategy} b={block}", strategy=strategy,
                    block_elems=block, total_ms=total)
    rows = [r("tiny", "plan", 4096, 1.029), r("tiny", "block_search", 4096, 1.0),
            r("heavytail", "plan", 4096, 1.031), r("heavytail", "block_search", 4096, 1.0),
            r("normal", "plan", 4096, 0.9), r("normal", "block_search", 4096, 1.0),
            r("small", "block_search", 4096, 1.0), dict(r("small", None, None, 0.1), method="copy (ceiling)")]
    verdicts = {v["distribution"]: v for v in report.autotune_verdicts(rows, lambda items, elements: ("plan", 4096))}
    assert set(verdicts) == {"tiny", "heavytail", "normal"}  # "small" never measured the choice
    assert verdicts["tiny"]["right"] and not verdicts["heavytail"]["right"] and verdicts["normal"]["right"]
    assert verdicts["heavytail"]["best"] == "octopus block_search b=4096" and verdicts["heavytail"]["tolerance"] == 1.03
    assert verdicts["normal"]["best_ms"] == 0.9  # the copy ceiling is not a strategy
    # The choice judged is the one for each batch's layout.
    for row in rows:
        row.update(items=10, elements=10 * (100 if row["distribution"] in ("tiny", "heavytail") else 50_000))
    choice = octopus.TunedChoice("plan", 4096, "d", "k", "probe", by_class=dict(small_items=("block_search", 4096)))
    verdicts = {v["distribution"]: v for v in report.autotune_verdicts(rows, choice.for_layout)}
    assert verdicts["heavytail"]["right"] and verdicts["heavytail"]["chosen"] == "octopus block_search b=4096"
    assert verdicts["normal"]["chosen"] == "octopus plan b=4096" and verdicts["normal"]["right"]


def test_hard_distributions_carry_their_tails():
    import torch

    from octopus.bench.distributions import sample_sizes
    heavy = sample_sizes("heavytail", None, 1, torch.Generator().manual_seed(0)).view(-1)
    assert heavy.numel() == 200_000 and int(heavy.median()) == 40
    top = heavy.sort(descending=True).values[:4].tolist()
    assert top[2] >= 10_000_000 > top[3] and top[0] < 100_000_000  # a few of tens of millions
    again = sample_sizes("heavytail", None, 1, torch.Generator().manual_seed(5)).view(-1)
    assert torch.equal(heavy.sort().values, again.sort().values)  # the same tail on every run
    dust = sample_sizes("dustgiant", None, 1, torch.Generator().manual_seed(0)).view(-1)
    assert dust.numel() == 500_001 and int(dust.max()) == 200_000_000
    small = dust[dust != dust.max()]
    assert int(small.min()) == 0 and int(small.max()) == 64
    scaled = sample_sizes("dustgiant", None, 1000, torch.Generator().manual_seed(0)).view(-1)
    assert scaled.numel() == 501 and int(scaled.max()) == 200_000  # the CPU scale-down keeps the proportions
