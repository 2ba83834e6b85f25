#!/usr/bin/env python3
"""Drone crops: the detections of a drone video cropped, resized, normalized and classified,
end to end, with octopus beside what a PyTorch user writes today.

Input: a folder in VisDrone-DET's layout, ``images/*.jpg`` and ``annotations/<image>.txt``
(``left,top,width,height,score,category,truncation,occlusion`` per line). Without one, a
synthetic sequence is written in that layout (textured frames with a filled box per
detection; box sizes from the benchmark's long-tail distribution, log-normal around 45 x 50
px) and read back like a real one.

Per frame, every detection is cropped and resized to 3 x S x S (bilinear, as
``F.interpolate(..., align_corners=False)``) with ImageNet normalization, and a torchvision
``resnet18`` (random weights: nothing is downloaded) scores the crops. The preprocessing runs as

* ``octopus crop_resize``: one launch per frame, reading the uint8 frame, normalization fused;
* ``torch F.interpolate per crop``: the frame converted and normalized once, then a loop over
  its boxes (coordinates already on the host);
* ``torchvision roi_align``: one call per frame on the normalized frame (one sample per output
  pixel, ``aligned=True``: F.interpolate's sampling points, but near a box's edges it blends in
  pixels outside the box, so it is not the same function);
* on a GPU also octopus under ``torch.compile``, roi_align under ``torch.compile``, and octopus
  replayed from CUDA graphs (``--no-compile``, ``--no-cuda-graph`` leave them out).

Printed and written as JSON per method: preprocessing time, end-to-end time (preprocessing +
classifier over the sequence, frames already decoded on the device), crops/s, the share of the
end-to-end time spent outside the classifier and per-frame latency percentiles. Every crop of
octopus is checked against F.interpolate (max difference at most 1e-5, asserted). The top-k
classes of every detection (octopus path) go to a CSV.

    python3 examples/drone_crops.py                      # synthetic sequence; cuda if available
    python3 examples/drone_crops.py VisDrone2019-DET-val --frames 100 --json drone.json
    python3 examples/drone_crops.py --tiny --device cpu  # seconds, for CI
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F

import octopus
from octopus.bench.distributions import SizesFileError, VisDroneBoxes, make_sizes, read_visdrone_boxes

import example_harness as harness

try:
    import torchvision
    from torchvision.ops import roi_align
    from PIL import Image  # torchvision's own dependency; torchvision.io's image codecs are deprecated
except ImportError as err:
    sys.exit(f"drone_crops.py needs torchvision (pip install torchvision): {err}")

SCHEMA = "octopus-examples/drone-crops/1"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
TOLERANCE = 1e-5  # octopus crops against F.interpolate's
OCTOPUS, INTERPOLATE, ROI_ALIGN = "octopus crop_resize", "torch F.interpolate per crop", "torchvision roi_align"
OCTOPUS_COMPILED, ROI_ALIGN_COMPILED = f"{OCTOPUS}, torch.compile", f"{ROI_ALIGN}, torch.compile"
OCTOPUS_GRAPHED = f"{OCTOPUS}, CUDA graph"


class DataError(ValueError):
    """An input folder that is not in VisDrone-DET's layout."""


class Sequence(NamedTuple):
    """The frames that have detections, decoded onto the device, and their boxes."""
    names: List[str]                    # image file names
    frames: octopus.RaggedBatch         # every frame's [3, H, W] uint8 pixels, packed
    views: List[torch.Tensor]           # frame f as a [3, H, W] view of frames.values
    boxes: List[torch.Tensor]           # frame f's boxes, int64 [K, 5] (f, y0, x0, y1, x1), on the device
    host_boxes: List[List[List[int]]]   # the same on the host
    annotations: List[VisDroneBoxes]    # frame f's annotation rows of those boxes
    rows: List[torch.Tensor]            # their line numbers among the annotation file's boxes
    frames_without_boxes: int
    boxes_outside: int                  # boxes empty once clipped to their frame (dropped)

    @property
    def crops(self) -> int:
        return sum(len(b) for b in self.host_boxes)


def write_synthetic_sequence(folder: str, frames: int, height: int, width: int, detections: int,
                             seed: int) -> None:
    """``frames`` JPEG frames and their VisDrone-DET annotations under ``folder``: a blurred
    colour field with grain, and per frame ``detections`` (+-50%) boxes of long-tail sizes,
    each filled with a colour of its own."""
    g = torch.Generator().manual_seed(seed)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "images"))
    os.makedirs(os.path.join(folder, "annotations"))
    for f in range(frames):
        count = int(torch.randint(max(1, detections // 2), detections + detections // 2 + 1, (1,), generator=g))
        hw = make_sizes("longtail", count, g)
        h, w = hw[:, 0].clamp(max=height), hw[:, 1].clamp(max=width)
        top = (torch.rand(count, generator=g) * (height - h + 1)).long()
        left = (torch.rand(count, generator=g) * (width - w + 1)).long()
        field = F.interpolate(torch.rand(1, 3, 9, 16, generator=g) * 255, size=(height, width), mode="bilinear",
                              align_corners=False)[0]
        pixels = field + torch.randn(3, height, width, generator=g) * 12
        colours = torch.rand(count, 3, generator=g) * 255
        for k, (t, l, bh, bw) in enumerate(zip(top.tolist(), left.tolist(), h.tolist(), w.tolist())):
            box = pixels[:, t:t + bh, l:l + bw]
            box.mul_(0.3).add_(0.7 * colours[k][:, None, None])
        name = f"{f:07d}"
        Image.fromarray(pixels.clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()).save(
            os.path.join(folder, "images", name + ".jpg"), quality=90)
        category = torch.randint(1, 11, (count,), generator=g).tolist()
        with open(os.path.join(folder, "annotations", name + ".txt"), "w") as out:
            for row in zip(left.tolist(), top.tolist(), w.tolist(), h.tolist(), category):
                out.write("{},{},{},{},1,{},0,0\n".format(*row))


def load_visdrone(folder: str, device: torch.device, max_frames: Optional[int] = None) -> Sequence:
    """The frames of a VisDrone-DET folder (sorted by name, the first ``max_frames``) decoded
    and packed into one RaggedBatch on ``device``, and their boxes clipped to the frame.
    Frames without boxes are left out (counted)."""
    image_dir, annotation_dir = os.path.join(folder, "images"), os.path.join(folder, "annotations")
    if not (os.path.isdir(image_dir) and os.path.isdir(annotation_dir)):
        raise DataError(f"{folder!r} is not a VisDrone-DET folder: it needs images/ and annotations/")
    names = sorted(n for n in os.listdir(image_dir) if n.lower().endswith(IMAGE_SUFFIXES))[:max_frames]
    if not names:
        raise DataError(f"{image_dir!r} holds no {'/'.join(IMAGE_SUFFIXES)} images")
    kept_names, pixels, boxes, annotations, rows = [], [], [], [], []
    without, outside = 0, 0
    for name in names:
        path = os.path.join(annotation_dir, os.path.splitext(name)[0] + ".txt")
        if not os.path.isfile(path):
            raise DataError(f"image {name!r} has no annotation file {path!r}")
        ann = read_visdrone_boxes(path)
        with Image.open(os.path.join(image_dir, name)) as img:
            image = torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)
        height, width = image.shape[1:]
        left, top, w, h = ann.boxes.unbind(1)
        y0, x0 = top.clamp(0, height), left.clamp(0, width)
        y1, x1 = (top + h).clamp(0, height), (left + w).clamp(0, width)
        inside = ((y1 > y0) & (x1 > x0)).nonzero().squeeze(1)
        outside += len(ann.boxes) - len(inside)
        if len(inside) == 0:
            without += 1
            continue
        frame = torch.full_like(inside, len(pixels))
        boxes.append(torch.stack([frame, y0[inside], x0[inside], y1[inside], x1[inside]], dim=1))
        annotations.append(VisDroneBoxes(*(t[inside] for t in ann)))
        rows.append(inside)
        kept_names.append(name)
        pixels.append(image)
    if not pixels:
        raise DataError(f"no frame of {folder!r} has a box inside it")
    frames = octopus.RaggedBatch.from_tensors(pixels, device=device)
    return Sequence(kept_names, frames, frames.unbind(), [b.to(device) for b in boxes], [b.tolist() for b in boxes],
                    annotations, rows, without, outside)


# ---------------------------------------------------------------------------- preprocessing
# Each maker returns preprocess(f) -> the crops of frame f, float32 [K, 3, S, S], normalized.

Preprocess = Callable[[int], torch.Tensor]


def octopus_crops(seq: Sequence, size: int, mean: torch.Tensor, std: torch.Tensor) -> Preprocess:
    def preprocess(f: int) -> torch.Tensor:
        return octopus.crop_resize(seq.frames, seq.boxes[f], size, scale=1 / 255, mean=mean, std=std, validate=False)
    return preprocess


def normalized_frame(frame: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """What the PyTorch paths do first: the uint8 [3, H, W] frame as normalized float32 [1, 3, H, W]
    (once per frame: cheaper than normalizing every crop, and the same result up to rounding)."""
    return ((frame.float() / 255 - mean[:, None, None]) / std[:, None, None])[None]


def interpolate_crops(seq: Sequence, size: int, mean: torch.Tensor, std: torch.Tensor) -> Preprocess:
    def preprocess(f: int) -> torch.Tensor:
        frame = normalized_frame(seq.views[f], mean, std)
        return torch.cat([F.interpolate(frame[:, :, y0:y1, x0:x1], size=(size, size), mode="bilinear",
                                        align_corners=False) for _, y0, x0, y1, x1 in seq.host_boxes[f]])
    return preprocess


def roi_align_rois(seq: Sequence) -> List[torch.Tensor]:
    """Each frame's boxes as roi_align's float (0, x0, y0, x1, y1), on the device."""
    return [torch.cat([torch.zeros_like(b[:, :1]), b[:, [2, 1, 4, 3]]], dim=1).float() for b in seq.boxes]


def roi_align_crops(seq: Sequence, size: int, mean: torch.Tensor, std: torch.Tensor) -> Preprocess:
    rois = roi_align_rois(seq)

    def preprocess(f: int) -> torch.Tensor:
        return roi_align(normalized_frame(seq.views[f], mean, std), rois[f], (size, size), spatial_scale=1.0,
                         sampling_ratio=1, aligned=True)
    return preprocess


def compiled_octopus_crops(seq: Sequence, size: int, mean: torch.Tensor, std: torch.Tensor) -> Preprocess:
    values, offsets, sizes = seq.frames.values, seq.frames.offsets, seq.frames.sizes

    # The raw op: octopus.crop_resize of a RaggedBatch reads the channel count from the batch's
    # host layout, which a trace sees as data-dependent.
    @torch.compile(fullgraph=True, dynamic=True)
    def crops(boxes: torch.Tensor) -> torch.Tensor:
        return torch.ops.octopus.crop_resize(values, offsets, sizes, boxes, 3, size, size, 1 / 255, mean, std, False)

    return lambda f: crops(seq.boxes[f])


def compiled_roi_align_crops(seq: Sequence, size: int, mean: torch.Tensor, std: torch.Tensor) -> Preprocess:
    rois = roi_align_rois(seq)

    @torch.compile(fullgraph=True, dynamic=True)
    def crops(frame: torch.Tensor, frame_rois: torch.Tensor) -> torch.Tensor:
        return roi_align(normalized_frame(frame, mean, std), frame_rois, (size, size), spatial_scale=1.0,
                         sampling_ratio=1, aligned=True)

    return lambda f: crops(seq.views[f], rois[f])


class GraphedOctopusCrops:
    """octopus.crop_resize replayed from CUDA graphs. The source is the whole sequence (one
    RaggedBatch of every frame), so one graph serves every frame; a graph's shapes are fixed,
    so each frame's boxes are padded to a capacity (a power of two, at least 8) with 1-pixel
    boxes, and one graph is captured per capacity. The padding crops are computed and dropped."""

    def __init__(self, seq: Sequence, size: int, mean: torch.Tensor, std: torch.Tensor):
        self.counts = [len(b) for b in seq.boxes]
        self.capacity = [max(8, 1 << (k - 1).bit_length()) for k in self.counts]
        self.padded = [torch.cat([b, b.new_tensor([[f, 0, 0, 1, 1]]).expand(cap - len(b), 5)])
                       for f, (b, cap) in enumerate(zip(seq.boxes, self.capacity))]
        self.inputs: Dict[int, torch.Tensor] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        for f, cap in enumerate(self.capacity):
            if cap in self.graphs:
                continue
            boxes = self.padded[f].clone()

            def run(boxes=boxes):
                return octopus.crop_resize(seq.frames, boxes, size, scale=1 / 255, mean=mean, std=std, validate=False)

            side = torch.cuda.Stream()  # warm-up on a side stream before capture, as torch's docs do
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs[cap] = run()
            self.inputs[cap], self.graphs[cap] = boxes, graph

    def __call__(self, f: int) -> torch.Tensor:
        cap = self.capacity[f]
        self.inputs[cap].copy_(self.padded[f])
        self.graphs[cap].replay()
        return self.outputs[cap][:self.counts[f]]


# ---------------------------------------------------------------------------- checks
def check(seq: Sequence, methods: Dict[str, Preprocess], clock: harness.Clock) -> Dict:
    """Every frame's crops from every method against eager octopus's: F.interpolate within
    TOLERANCE, the compiled and graphed octopus bit for bit, compiled roi_align against eager
    roi_align within TOLERANCE (all asserted); roi_align's difference is reported only (not
    the same function at box edges). Also times each method's first pass over the sequence
    (where torch.compile compiles)."""
    result = {name: dict(max_abs_diff=0.0, mean_abs_diff=0.0, first_pass_s=0.0) for name in methods}
    roi_gap, elements = 0.0, 0
    for f in range(len(seq.boxes)):
        crops = {}
        for name, preprocess in methods.items():
            t0 = time.perf_counter()
            crops[name] = preprocess(f)
            clock.sync()
            result[name]["first_pass_s"] += time.perf_counter() - t0
        want = crops[OCTOPUS]
        elements += want.numel()
        for name, got in crops.items():
            diff = (got - want).abs()
            result[name]["max_abs_diff"] = max(result[name]["max_abs_diff"], float(diff.max()))
            result[name]["mean_abs_diff"] += float(diff.double().sum())
        if ROI_ALIGN_COMPILED in crops:
            roi_gap = max(roi_gap, float((crops[ROI_ALIGN_COMPILED] - crops[ROI_ALIGN]).abs().max()))
    for name, r in result.items():
        r["mean_abs_diff"] /= elements
        if name.startswith(OCTOPUS):
            r["identical"] = r["max_abs_diff"] == 0.0
            harness.require(r["identical"], f"{name} differs from eager octopus by up to {r['max_abs_diff']}")
    harness.require(result[INTERPOLATE]["max_abs_diff"] <= TOLERANCE,
                    f"octopus crops differ from F.interpolate's by {result[INTERPOLATE]['max_abs_diff']} > {TOLERANCE}")
    if ROI_ALIGN_COMPILED in result:
        result[ROI_ALIGN_COMPILED]["max_abs_diff_from_eager_roi_align"] = roi_gap
        harness.require(roi_gap <= TOLERANCE, f"compiled roi_align differs from eager roi_align by {roi_gap}")
    return result


def write_scores(path: str, seq: Sequence, logits: List[torch.Tensor], topk: int) -> int:
    """One CSV row per detection: where it came from and its top-k classes with softmax
    probabilities. Returns the number of rows."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    header = ["image", "detection", "left", "top", "width", "height", "score", "category"]
    header += [f"{kind}_{k + 1}" for k in range(topk) for kind in ("class", "prob")]
    count = 0
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        for name, ann, rows, frame_logits in zip(seq.names, seq.annotations, seq.rows, logits):
            prob, cls = frame_logits.float().softmax(1).topk(topk, dim=1)
            for k, row in enumerate(rows.tolist()):
                scores = [v for pair in zip(cls[k].tolist(), (round(p, 6) for p in prob[k].tolist())) for v in pair]
                writer.writerow([name, row, *ann.boxes[k].tolist(), float(ann.score[k]), int(ann.category[k]), *scores])
                count += 1
    return count


# ---------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default=None,
                   help="a VisDrone-DET folder (images/ and annotations/); default: a synthetic sequence written "
                        "to OUT/synthetic-visdrone")
    p.add_argument("--frames", type=harness.positive_int, default=None,
                   help="frames to use (a folder: its first N; synthetic: default 32 on cuda, 2 on cpu or with --tiny)")
    p.add_argument("--frame-size", type=harness.positive_int, nargs=2, default=None, metavar=("H", "W"),
                   help="synthetic frames' size (default 1080 1920; 240 320 with --tiny)")
    p.add_argument("--detections", type=harness.positive_int, default=None,
                   help="synthetic detections per frame, on average (default 70; 4 with --tiny)")
    p.add_argument("--crop-size", type=harness.positive_int, default=None,
                   help="crops are 3 x S x S (default 224; 64 with --tiny)")
    p.add_argument("--topk", type=harness.positive_int, default=5, help="classes per detection in the CSV (default 5)")
    p.add_argument("--csv", default=None, metavar="PATH", help="the scores CSV (default OUT/scores.csv)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also time the preprocessing under torch.compile (default: on cuda only)")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="also time octopus's preprocessing replayed from CUDA graphs (default: on cuda)")
    harness.add_common_options(p, "drone-crops")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = harness.resolve_device(parser, args.device)
    repeats = harness.default_repeats(args, device)
    use_compile = device.type == "cuda" if args.compile is None else args.compile
    if args.cuda_graph and device.type != "cuda":
        parser.error("--cuda-graph needs --device cuda")
    use_graph = device.type == "cuda" if args.cuda_graph is None else args.cuda_graph
    torch.manual_seed(args.seed)
    if args.data is None:
        folder = os.path.join(args.out, "synthetic-visdrone")
        frames = args.frames or (32 if device.type == "cuda" and not args.tiny else 2)
        height, width = args.frame_size or ((240, 320) if args.tiny else (1080, 1920))
        write_synthetic_sequence(folder, frames, height, width, args.detections or (4 if args.tiny else 70),
                                 args.seed)
    else:
        folder = args.data
    try:
        seq = load_visdrone(folder, device, args.frames)
    except (DataError, SizesFileError) as err:
        parser.error(str(err))

    classifier = torchvision.models.resnet18(weights=None).eval().to(device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # the warm-up pass meets every batch size of the sequence
    mean = torch.tensor(IMAGENET_MEAN, device=device)
    std = torch.tensor(IMAGENET_STD, device=device)
    size = args.crop_size or (64 if args.tiny else 224)
    methods = {OCTOPUS: octopus_crops(seq, size, mean, std), INTERPOLATE: interpolate_crops(seq, size, mean, std),
               ROI_ALIGN: roi_align_crops(seq, size, mean, std)}
    notes = {INTERPOLATE: "frame normalized once, then one F.interpolate per crop",
             ROI_ALIGN: "sampling_ratio=1, aligned=True; not the same function at box edges",
             OCTOPUS_GRAPHED: "boxes padded to a power of two; one graph per capacity"}
    if use_compile:
        methods[OCTOPUS_COMPILED] = compiled_octopus_crops(seq, size, mean, std)
        methods[ROI_ALIGN_COMPILED] = compiled_roi_align_crops(seq, size, mean, std)
    clock = harness.Clock(device)
    with torch.inference_mode():
        if use_graph:
            methods[OCTOPUS_GRAPHED] = GraphedOctopusCrops(seq, size, mean, std)
        checks = check(seq, methods, clock)
        for name in (OCTOPUS_COMPILED, ROI_ALIGN_COMPILED):
            if name in checks:
                notes[name] = f"first pass, compiling: {checks[name]['first_pass_s']:.1f} s"
        rows = []
        for name, preprocess in methods.items():
            r = dict(method=name, note=notes.get(name, ""),
                     **harness.time_pipeline(preprocess, classifier, len(seq.boxes), clock, args.warmup, repeats))
            r["crops_per_s"] = seq.crops / r["end_to_end_ms"] * 1e3
            r["preprocess_crops_per_s"] = seq.crops / r["preprocess_ms"] * 1e3
            rows.append(r)
        logits = [classifier(methods[OCTOPUS](f)).cpu() for f in range(len(seq.boxes))]

    csv_path = args.csv or os.path.join(args.out, "scores.csv")
    csv_rows = write_scores(csv_path, seq, logits, min(args.topk, logits[0].shape[1]))
    shapes = sorted({tuple(s[1:]) for s in seq.frames.item_shapes()})
    data = dict(source="synthetic" if args.data is None else os.path.abspath(folder), frames=len(seq.names),
                frames_without_boxes=seq.frames_without_boxes, boxes_outside_frame=seq.boxes_outside,
                crops=seq.crops, frame_sizes=[list(s) for s in shapes], crop_size=size,
                classifier="torchvision resnet18, random weights", csv=os.path.abspath(csv_path), csv_rows=csv_rows)
    print(f"drone crops on {harness.describe_device(device)}: {data['frames']} frames "
          f"({data['source']}; {', '.join('x'.join(map(str, s)) for s in shapes)}), {seq.crops} crops to "
          f"3x{size}x{size} -> resnet18; median of {repeats} passes over the sequence")
    harness.print_table(rows, [("method", "method", ""), ("preprocess_ms", "preprocess ms", ".2f"),
                               ("end_to_end_ms", "end-to-end ms", ".2f"), ("crops_per_s", "crops/s", ".0f"),
                               ("outside_model_pct", "outside classifier %", ".1f"),
                               ("latency_p50_ms", "frame p50 ms", ".2f"), ("latency_p99_ms", "frame p99 ms", ".2f")])
    interp, roi = checks[INTERPOLATE], checks[ROI_ALIGN]
    print(f"check: octopus crops vs F.interpolate per crop: max |diff| {interp['max_abs_diff']:.2e} "
          f"(<= {TOLERANCE:g}: ok); vs roi_align: max {roi['max_abs_diff']:.2e}, mean {roi['mean_abs_diff']:.2e} "
          f"(not the same function)")
    identical = [n for n, c in checks.items() if c.get("identical") and n != OCTOPUS]
    if identical:
        print(f"check: bit for bit equal to eager octopus: {', '.join(identical)}")
    print(f"scores: {csv_rows} rows in {csv_path}")
    json_path = args.json or os.path.join(args.out, "drone_crops.json")
    harness.write_json(json_path, SCHEMA, device, data=data, repeats=repeats, warmup=args.warmup, rows=rows,
                       checks=dict(tolerance=TOLERANCE, methods=checks))
    print(f"numbers: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
