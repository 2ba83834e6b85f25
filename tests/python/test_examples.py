"""The examples (examples/*.py): each run end to end at its tiny size on the CPU in a
subprocess, as a user runs it, with its CSV, JSON and cross-checks checked; their input
readers (a VisDrone-DET folder, a GeoTIFF), cross-checks and bad input tested in process."""

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import satellite_tiles  # noqa: E402
from octopus.bench.distributions import SizesFileError  # noqa: E402


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


needs_torchvision = pytest.mark.skipif(
    not has_module("torchvision"), reason="drone_crops.py needs torchvision (its resnet18 classifier and roi_align)")
needs_diffusers = pytest.mark.skipif(
    not has_module("diffusers"), reason="serve_diffusion.py needs diffusers (its UNet2DModel and reference schedulers)")


def run_example(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--tiny", "--device", "cpu",
                           "--out", str(tmp_path / "out"), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def read_csv(path: Path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------ drone crops
@needs_torchvision
def test_drone_crops_end_to_end(tmp_path):
    proc = run_example("drone_crops.py", tmp_path, "--json", str(tmp_path / "d.json"), "--csv", str(tmp_path / "s.csv"))
    result = json.loads((tmp_path / "d.json").read_text())
    assert result["schema"] == "octopus-examples/drone-crops/1"
    assert result["environment"]["device_type"] == "cpu"
    annotations = sorted((tmp_path / "out" / "synthetic-visdrone" / "annotations").glob("*.txt"))
    lines = {p.stem + ".jpg": p.read_text().splitlines() for p in annotations}
    data = result["data"]
    assert data["frames"] == len(lines) == 2 and data["frame_sizes"] == [[240, 320]]
    assert data["crops"] == sum(len(v) for v in lines.values()) == data["csv_rows"]

    rows = read_csv(tmp_path / "s.csv")
    assert len(rows) == data["crops"]
    for row in rows:  # each row is the annotation line it names, with its top-5 classes
        fields = lines[row["image"]][int(row["detection"])].split(",")
        assert [row[k] for k in ("left", "top", "width", "height")] == fields[:4]
        assert int(row["category"]) == int(fields[5])
        probs = [float(row[f"prob_{k}"]) for k in range(1, 6)]
        assert all(0 < p <= 1 for p in probs) and probs == sorted(probs, reverse=True)
        assert len({row[f"class_{k}"] for k in range(1, 6)}) == 5

    methods = {r["method"]: r for r in result["rows"]}
    assert set(methods) == {"octopus crop_resize", "torch F.interpolate per crop", "torchvision roi_align"}
    for r in methods.values():
        assert 0 < r["preprocess_ms"] and 0 < r["model_ms"] <= r["end_to_end_ms"]
        assert r["crops_per_s"] == pytest.approx(data["crops"] / r["end_to_end_ms"] * 1e3)
        assert 0 <= r["outside_model_pct"] <= 100
        assert len(r["latency_ms"]) == data["frames"]
    checks = result["checks"]["methods"]
    assert checks["torch F.interpolate per crop"]["max_abs_diff"] <= result["checks"]["tolerance"] == 1e-5
    assert checks["torchvision roi_align"]["max_abs_diff"] > 1e-3  # not the same function: the check can tell
    assert "check: octopus crops vs F.interpolate per crop" in proc.stdout


def write_visdrone_folder(root: Path):
    """Two frames of different sizes with boxes to clip and to drop, and a frame with none;
    returns the frames' pixels (PNG: read back exactly)."""
    from PIL import Image
    g = torch.Generator().manual_seed(3)
    (root / "images").mkdir(parents=True)
    (root / "annotations").mkdir()
    pixels = {name: torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
              for name, (h, w) in {"a": (40, 60), "b": (50, 30), "c": (20, 20)}.items()}
    for name, image in pixels.items():
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(root / "images" / f"{name}.png")
    (root / "annotations" / "a.txt").write_text(
        "10,5,20,15,1,4,0,0\n"      # inside
        "50,30,20,20,1,1,0,1\n"     # partly outside: clipped to 10 x 10
        "70,10,5,5,0,0,-1,-1\n"     # wholly outside: dropped
        "0,0,60,40,1,2\n")          # the whole frame, six fields
    (root / "annotations" / "b.txt").write_text("3,4,0,10,1,3,0,0\n1,2,28,47,0.75,9,0,0\n")  # zero width: dropped
    (root / "annotations" / "c.txt").write_text("")
    return pixels


@needs_torchvision
def test_drone_crops_reads_a_visdrone_folder(tmp_path):
    import drone_crops
    pixels = write_visdrone_folder(tmp_path / "visdrone")
    seq = drone_crops.load_visdrone(str(tmp_path / "visdrone"), torch.device("cpu"))
    assert seq.names == ["a.png", "b.png"] and seq.frames_without_boxes == 1 and seq.boxes_outside == 2
    assert torch.equal(seq.views[0], pixels["a"]) and torch.equal(seq.views[1], pixels["b"])
    assert seq.host_boxes == [[[0, 5, 10, 20, 30], [0, 30, 50, 40, 60], [0, 0, 0, 40, 60]], [[1, 2, 1, 49, 29]]]
    assert [r.tolist() for r in seq.rows] == [[0, 1, 3], [1]]
    assert seq.annotations[1].score.tolist() == [0.75] and seq.annotations[0].category.tolist() == [4, 1, 2]
    mean, std = torch.tensor(drone_crops.IMAGENET_MEAN), torch.tensor(drone_crops.IMAGENET_STD)
    for f in range(2):
        got = drone_crops.octopus_crops(seq, 32, mean, std)(f)
        want = drone_crops.interpolate_crops(seq, 32, mean, std)(f)
        assert got.shape == (len(seq.host_boxes[f]), 3, 32, 32)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@needs_torchvision
@pytest.mark.parametrize("layout, message", [
    ("no annotations", "needs images/ and annotations/"),
    ("no images", "holds no"),
    ("missing file", "has no annotation file"),
    ("bad line", "expected 6 or 8 fields"),
    ("negative", "non-negative"),
])
def test_drone_crops_bad_folders(tmp_path, layout, message):
    import drone_crops
    root = tmp_path / "v"
    write_visdrone_folder(root)
    if layout == "no annotations":
        for p in (root / "annotations").iterdir():
            p.unlink()
        (root / "annotations").rmdir()
    elif layout == "no images":
        for p in (root / "images").iterdir():
            p.unlink()
    elif layout == "missing file":
        (root / "annotations" / "b.txt").unlink()
    else:
        (root / "annotations" / "b.txt").write_text("1,2,3,4,1\n" if layout == "bad line" else "1,2,-3,4,1,1,0,0\n")
    with pytest.raises((drone_crops.DataError, SizesFileError), match=message):
        drone_crops.load_visdrone(str(root), torch.device("cpu"))


# ------------------------------------------------------------------------------------ satellite tiles
def test_satellite_tiles_end_to_end(tmp_path):
    proc = run_example("satellite_tiles.py", tmp_path, "--json", str(tmp_path / "s.json"))
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["schema"] == "octopus-examples/satellite-tiles/1"
    data = result["data"]
    assert data["bands"][1] == "B02" and data["cloud_band"] == "B02"
    assert (len(data["bands"]), data["height"], data["width"]) == (13, 256, 256)
    assert data["kept"] + data["dropped"] == data["tiles"] and data["kept"] > 0 and data["dropped"] > 0

    rows = read_csv(tmp_path / "out" / "tiles.csv")
    assert len(rows) == data["tiles"]
    covered = sum((int(r["y1"]) - int(r["y0"])) * (int(r["x1"]) - int(r["x0"])) for r in rows)
    assert covered == 256 * 256  # the tiles cut the image without gaps or overlaps
    for r in rows:
        kept = r["kept"] == "1"
        assert kept == (float(r["cloud_fraction"]) <= data["max_fraction"])
        assert (r["class"] != "") == kept
    assert sum(r["kept"] == "1" for r in rows) == data["kept"]
    assert data["kept_pixels"] == sum((int(r["y1"]) - int(r["y0"])) * (int(r["x1"]) - int(r["x0"]))
                                      for r in rows if r["kept"] == "1")

    methods = {r["method"]: r for r in result["rows"]}
    assert set(methods) == {satellite_tiles.OCTOPUS, satellite_tiles.LOOP}
    for r in methods.values():
        assert 0 < r["model_ms"] <= r["end_to_end_ms"] and 0 < r["preprocess_ms"]
        assert r["tiles_per_s"] == pytest.approx(data["tiles"] / r["end_to_end_ms"] * 1e3)
        assert (r["kept"], r["dropped"]) == (data["kept"], data["dropped"])
    checks = result["checks"]
    assert checks["same_tiles_kept"] and checks["gathered_tiles_identical"]
    assert checks["max_abs_input_diff"] <= checks["input_tolerance"] == 1e-4
    assert "check: same" in proc.stdout


def cloudy_image(bands: int = 13, height: int = 96, width: int = 128) -> np.ndarray:
    """uint16 digital numbers: dim ground, a bright square in the top-left corner."""
    rng = np.random.default_rng(5)
    image = rng.integers(500, 1500, size=(bands, height, width), dtype=np.uint16)
    image[:, :48, :64] += 5000
    return image


@pytest.mark.parametrize("interleaved", [False, True])
def test_read_geotiff(tmp_path, interleaved):
    tifffile = pytest.importorskip("tifffile", reason="reading a GeoTIFF needs tifffile (or rasterio)")
    image = cloudy_image()
    path = tmp_path / "scene.tif"
    if interleaved:
        tifffile.imwrite(path, np.moveaxis(image, 0, -1), photometric="minisblack", planarconfig="contig")
    else:
        tifffile.imwrite(path, image, photometric="minisblack", planarconfig="separate")
    scene = satellite_tiles.read_geotiff(str(path), 1e-4, torch.device("cpu"))
    assert scene.bands == list(satellite_tiles.BANDS)
    torch.testing.assert_close(scene.image, torch.from_numpy(image.astype(np.float32)) * 1e-4)


def test_satellite_tiles_geotiff_end_to_end(tmp_path):
    tifffile = pytest.importorskip("tifffile", reason="reading a GeoTIFF needs tifffile (or rasterio)")
    image = cloudy_image()
    tifffile.imwrite(tmp_path / "scene.tif", image, photometric="minisblack", planarconfig="separate")
    run_example("satellite_tiles.py", tmp_path, "--input", str(tmp_path / "scene.tif"), "--tile-min", "16",
                "--tile-max", "40")
    result = json.loads((tmp_path / "out" / "satellite_tiles.json").read_text())
    assert (result["data"]["height"], result["data"]["width"]) == (96, 128)
    blue = image[1].astype(np.float32) * np.float32(1e-4)
    threshold = np.float32(0.3)
    for r in read_csv(tmp_path / "out" / "tiles.csv"):  # every keep decision from the file's own pixels
        tile = blue[int(r["y0"]):int(r["y1"]), int(r["x0"]):int(r["x1"])]
        assert (r["kept"] == "1") == ((tile > threshold).mean() <= 0.3)
    assert 0 < result["data"]["kept"] < result["data"]["tiles"]


@pytest.mark.parametrize("args, message", [
    (["--cloud-band", "B99"], "not a band"),
    (["--cloud-band", "13"], "not a band"),
    (["--tile-min", "80", "--tile-max", "40"], "larger than --tile-max"),
    (["--input", "missing.tif"], "cannot read"),
])
def test_satellite_tiles_bad_arguments(tmp_path, capsys, args, message):
    if "--input" in args and not any(has_module(m) for m in ("rasterio", "tifffile")):
        message = "needs rasterio or tifffile"
    with pytest.raises(SystemExit) as exit_info:
        satellite_tiles.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------------------------------------ serving diffusion
@needs_diffusers
def test_serve_diffusion_end_to_end(tmp_path):
    proc = run_example("serve_diffusion.py", tmp_path, "--json", str(tmp_path / "s.json"))
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["schema"] == "octopus-examples/serve-diffusion/1"
    assert result["environment"]["device_type"] == "cpu"
    data, records = result["data"], result["requests"]
    assert data["model"]["name"] == "tiny" and not data["cuda_graphs"]
    assert [r["id"] for r in records] == list(range(data["requests"])) and data["requests"] == 16
    # A mixed workload from every client: shapes, samplers, step counts, both priorities.
    assert {r["client"] for r in records} == set(range(data["clients"])) and data["clients"] >= 2
    assert {tuple(r["shape"]) for r in records} == {tuple(s) for s in data["shapes"]} and len(data["shapes"]) == 3
    assert len({r["scheduler"] for r in records}) >= 3 and len({r["steps"] for r in records}) >= 3
    assert all(data["steps"][0] <= r["steps"] <= data["steps"][1] for r in records)
    high = [r for r in records if r["priority"] == "high"]
    assert high and len(high) < len(records) and all(r["deadline_s"] == data["high_deadline_s"] for r in high)

    rows = {r["priority"]: r for r in result["rows"]}
    assert set(rows) == {"all", "high", "normal"}
    for name, row in rows.items():
        mine = [r for r in records if name in ("all", r["priority"])]
        done = [r for r in mine if r["status"] == "completed"]
        assert row["requests"] == len(mine)
        assert (row["completed"], row["deadline_missed"], row["failed"]) == (
            len(done), sum(r["status"] == "deadline_missed" for r in mine), sum(r["status"] == "failed" for r in mine))
        latencies = np.array([1e3 * r["latency_s"] for r in done])
        for q in (50, 90, 99):  # nearest rank, octopus's one rule (numpy's "inverted_cdf" method)
            assert row[f"p{q}_ms"] == pytest.approx(np.percentile(latencies, q, method="inverted_cdf"))
        assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
    assert rows["all"]["failed"] == 0  # nothing here fails; a missed deadline (5 s) would be timing
    assert rows["high"]["requests"] + rows["normal"]["requests"] == rows["all"]["requests"]
    for r in records:
        if r["status"] == "completed":
            assert 0 <= r["queued_s"] <= r["latency_s"] and 0 < r["sampling_s"] <= r["latency_s"]
        else:
            assert r["status"] == "deadline_missed" and "DeadlineMissed" in r["error"]

    completed = [r for r in records if r["status"] == "completed"]
    throughput = result["throughput"]
    assert throughput["images_per_s"] == pytest.approx(len(completed) / throughput["wall_s"])
    assert throughput["sample_steps_per_s"] == pytest.approx(sum(r["steps"] for r in completed) / throughput["wall_s"])
    sampler = result["sampler"]
    assert sampler["submitted"] == 16 and sampler["completed"] == len(completed)
    assert sampler["sample_steps"] == sum(r["steps"] for r in completed)
    assert 2 <= sampler["max_batch"] <= data["max_batch"]  # requests shared iterations
    thumbnails = result["thumbnails"]
    assert thumbnails["requests"] == len(completed) and 1 <= thumbnails["calls"] <= len(completed)
    assert result["stream_scheduler"]["active"] == 0  # every lease came back

    checks = result["checks"]
    assert 0 < checks["thumbnails"]["max_abs_diff"] <= checks["thumbnails"]["tolerance"] == 1e-4
    diffusers_check = checks["diffusers"]
    assert diffusers_check["tolerance"] == 1e-5 and diffusers_check["dtype"] == "float64"
    assert len(diffusers_check["requests"]) == 5 and len({r["scheduler"] for r in diffusers_check["requests"]}) == 5
    assert all(r["max_relative_diff"] <= diffusers_check["tolerance"] for r in diffusers_check["requests"])
    assert "check: 5 requests" in proc.stdout and "check: 8 thumbnails" in proc.stdout


@needs_diffusers
@needs_diffusers
def test_serve_diffusion_with_strict_priority(tmp_path):
    run_example("serve_diffusion.py", tmp_path, "--strict-priority", "--check-requests", "0",
                "--json", str(tmp_path / "s.json"))
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["data"]["strict_priority"] and result["data"]["priority_lane"]
    assert result["sampler"]["completed"] == 16 and result["sampler"]["normal_lane_paused_s"] >= 0
    assert result["stream_scheduler"]["active"] == 0


def test_serve_diffusion_check_tells_wrong_latents():
    """The float64 cross-check against diffusers passes the right latents and rejects
    latents one step short or of another request's seed."""
    import serve_diffusion
    from octopus.bench.serving import make_model
    model = make_model("tiny", torch.device("cpu"), torch.float64)
    spec = serve_diffusion.check_workload([(4, 8, 8)], (3, 3), 4, seed=0)[3]  # DPM-Solver++, 3 steps
    right = serve_diffusion.diffusers_alone(model, spec)
    assert serve_diffusion.compare_with_diffusers(model, [spec], {spec["id"]: right})[0]["max_relative_diff"] == 0
    for wrong in (serve_diffusion.diffusers_alone(model, dict(spec, steps=2)),
                  serve_diffusion.diffusers_alone(model, dict(spec, seed=spec["seed"] + 1))):
        with pytest.raises(AssertionError, match="octopus and diffusers differ"):
            serve_diffusion.compare_with_diffusers(model, [spec], {spec["id"]: wrong})


@needs_diffusers
@pytest.mark.parametrize("args, message", [
    (["--shapes", "3x8x8"], "takes 4 channels"),
    (["--shapes", "4x9x8"], "multiples of 2"),
    (["--shapes", "4x8"], "looks like 4x64x64"),
    (["--steps", "5", "2"], "larger than MAX"),
    (["--rate", "0"], "must be positive"),
    (["--cuda-graphs"], "needs --device cuda"),
])
def test_serve_diffusion_bad_arguments(tmp_path, capsys, args, message):
    import serve_diffusion
    with pytest.raises(SystemExit) as exit_info:
        serve_diffusion.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(not (has_module("diffusers") and has_module("transformers")),
                    reason="serve_text_to_image.py needs diffusers and transformers (a tiny pipeline)")
def test_serve_text_to_image_end_to_end(tmp_path):
    """Prompts in, PNG files out: every request's image written, the checked ones equal to the
    pipeline called alone (the example asserts it), latencies for both priorities."""
    run_example("serve_text_to_image.py", tmp_path, "--json", str(tmp_path / "t.json"))
    result = json.loads((tmp_path / "t.json").read_text())
    summary, records = result["summary"], result["requests"]
    assert summary["requests"] == len(records) == 12 and summary["check_max_pixel_diff"] <= 1
    pngs = sorted((tmp_path / "out").glob("*.png"))
    assert [p.name for p in pngs] == [f"{r['id']:04d}_{r['priority']}.png" for r in records]
    assert {r["priority"] for r in records} == {"high", "normal"} and len({r["scheduler"] for r in records}) >= 3
    assert summary["all_p50_s"] <= summary["all_p99_s"] and all(r["latency_s"] > 0 for r in records)
