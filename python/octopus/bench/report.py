"""What ``octopus-bench`` writes: the environment record, the terminal table, the JSON
schema check and the PNG plots."""

from __future__ import annotations

import datetime
import math
import os
import platform
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

import octopus

SCHEMA = "octopus-bench/1"

# key -> type(s) its value must have in every row (None allowed where a measurement is missing).
ROW_FIELDS: Dict[str, Union[type, Tuple[type, ...]]] = {
    "workload": str, "distribution": str, "items": int, "elements": int, "method": str,
    "strategy": (str, type(None)), "block_elems": (int, type(None)), "setup_ms": (float, int),
    "h2d_ms": (float, int), "metadata_mb": (float, int), "kernel_ms": (float, type(None)),
    "d2h_ms": (float, int, type(None)), "total_ms": (float, type(None)), "gbs": (float, type(None)),
    "pct_copy": (float, type(None)), "peak_mb": (float, type(None)), "energy_mj": (float, type(None)),
    "note": str,
}
TOP_FIELDS: Dict[str, type] = {"schema": str, "environment": dict, "copy_gbs": float, "scale_down": int, "energy": str,
              "autotune": dict, "rows": list, "scaling": list, "plots": list}
ENVIRONMENT_FIELDS = ("date", "device", "device_type", "torch", "octopus", "python", "driver", "cuda")


def environment(device: torch.device) -> dict:
    from .energy import driver_version
    env: Dict[str, Any] = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               torch=torch.__version__, octopus=octopus.__version__, python=platform.python_version(),
               device_type=device.type, cuda=torch.version.cuda, driver=None)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, multiprocessors=props.multi_processor_count,
                   l2_mb=getattr(props, "L2_cache_size", 0) / 2**20, memory_gb=props.total_memory / 1e9,
                   driver=driver_version())
    else:
        env.update(device=platform.processor() or platform.machine(), cpu_count=os.cpu_count(),
                   threads=torch.get_num_threads())
    return env


def validate(result: dict) -> List[str]:
    """Problems with a result against the schema (empty when it is valid)."""
    problems = []
    for key, kind in TOP_FIELDS.items():
        if not isinstance(result.get(key), kind):
            problems.append(f"top-level {key!r} must be {kind.__name__}, got {type(result.get(key)).__name__}")
    if result.get("schema") != SCHEMA:
        problems.append(f"schema must be {SCHEMA!r}")
    for key in ENVIRONMENT_FIELDS:
        if key not in result.get("environment", {}):
            problems.append(f"environment lacks {key!r}")
    for where in ("rows", "scaling"):
        for k, row in enumerate(result.get(where) or []):
            for key, row_kind in ROW_FIELDS.items():
                if key not in row:
                    problems.append(f"{where}[{k}] lacks {key!r}")
                elif not isinstance(row[key], row_kind) or isinstance(row[key], bool):
                    problems.append(f"{where}[{k}][{key!r}] has type {type(row[key]).__name__}")
            if row.get("kernel_ms") is None and not row.get("note"):
                problems.append(f"{where}[{k}] has no measurement and no note saying why")
    return problems


def _fmt(value, spec: str, width: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return format(value, spec).rjust(width)


COLUMNS = [("setup_ms", "setup ms", ".3f", 9), ("h2d_ms", "H2D ms", ".3f", 8), ("metadata_mb", "meta MB", ".2f", 9),
           ("kernel_ms", "kernel ms", ".3f", 10), ("d2h_ms", "D2H ms", ".3f", 8), ("total_ms", "total ms", ".3f", 10),
           ("gbs", "GB/s", ".0f", 7), ("pct_copy", "% copy", ".1f", 7), ("peak_mb", "peak MB", ".1f", 9),
           ("energy_mj", "mJ", ".2f", 8)]
METHOD_WIDTH = 44


def format_rows(rows: List[Dict], title) -> List[str]:
    """Rows grouped by (workload, distribution, items), one header per group."""
    lines, group = [], None
    header = "method".ljust(METHOD_WIDTH) + "".join(name.rjust(w) for _, name, _, w in COLUMNS)
    for r in rows:
        key = (r["workload"], r["distribution"], r["items"])
        if key != group:
            group = key
            lines += ["", title(r), header]
        if r["kernel_ms"] is None:
            lines.append(r["method"][:METHOD_WIDTH].ljust(METHOD_WIDTH) + "  " + r["note"])
            continue
        lines.append(r["method"][:METHOD_WIDTH].ljust(METHOD_WIDTH)
                     + "".join(_fmt(r[key], spec, w) for key, _, spec, w in COLUMNS))
    return lines


def format_report(result: dict, describe) -> str:
    env = result["environment"]
    lines = [f"octopus {env['octopus']} on {env['device']} (torch {env['torch']}, driver {env['driver'] or '-'}); "
             f"measured copy bandwidth {result['copy_gbs']:.0f} GB/s (read + write); energy: {result['energy']}",
             "total = setup + H2D + kernel (D2H: the output copied to pinned host memory, shown apart); "
             "peak MB: device memory one call allocates beyond its inputs"]
    if smoke_note(result):
        lines.insert(0, smoke_note(result))
    lines += format_rows(result["rows"], lambda r: f"{r['workload']} / {r['distribution']}: "
                                                   f"{r['items']} items, {r['elements']} elements ({describe(r)})")
    if result["scaling"]:
        lines += format_rows(result["scaling"], lambda r: f"scaling {r['workload']} / {r['distribution']}: "
                                                          f"{r['items']} items, {r['elements']} elements")
    tune = result["autotune"]
    if tune:
        by_class = "".join(f", {name}: {s} with {b}" for name, (s, b) in sorted(tune.get("by_class", {}).items()))
        lines += ["", f"autotune chose {tune['strategy']} with block_elems={tune['block_elems']}{by_class} "
                      f"({tune['source']}; {tune.get('device_name', '')})"]
        for v in tune.get("verdicts", []):
            verdict = "right" if v["right"] else "WRONG"
            chosen = v.get("chosen", "chosen")
            lines.append(f"  {v['workload']} / {v['distribution']}: {verdict} — {chosen} {v['chosen_ms']:.4f} ms, "
                         f"best {v['best']} {v['best_ms']:.4f} ms")
    return "\n".join(lines)


def autotune_verdicts(rows: List[Dict], choice_for: Callable[[Optional[int], Optional[int]], Tuple[str, int]],
                      tolerance: float = 1.03) -> List[Dict]:
    """Per (workload, distribution): was autotune's choice for that batch (``choice_for(items,
    elements)``: ``TunedChoice.for_layout``) within ``tolerance`` (a ratio: 1.03 is 3%) of the
    fastest octopus strategy measured there (by total time)?"""
    groups: Dict[tuple, List[Dict]] = {}
    for r in rows:
        if r["strategy"] is not None and r["total_ms"] is not None:
            groups.setdefault((r["workload"], r["distribution"]), []).append(r)
    verdicts = []
    for (workload, dist), group in groups.items():
        strategy, block = choice_for(group[0].get("items"), group[0].get("elements"))
        chosen = [r for r in group if r["strategy"] == strategy and r["block_elems"] == block]
        if not chosen:
            continue
        best = min(group, key=lambda r: r["total_ms"])
        verdicts.append(dict(workload=workload, distribution=dist, chosen=chosen[0]["method"],
                             chosen_ms=chosen[0]["total_ms"], best=best["method"], best_ms=best["total_ms"],
                             tolerance=tolerance, right=chosen[0]["total_ms"] <= tolerance * best["total_ms"]))
    return verdicts


HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def series_styles(methods: List[str]) -> Dict[str, Dict[str, Any]]:
    """A colour family per kind of method (octopus's strategies in blues, what PyTorch users
    write in oranges, ceilings and floors in grey), a distinct shade, hatch and marker within
    it: fifteen series stay apart in a bar chart and in a legend printed in grey."""
    import matplotlib.pyplot as plt

    def family(method: str) -> str:
        if method.startswith("octopus"):
            return "Blues"
        if "copy" in method or "floor" in method or "ceiling" in method:
            return "Greys"
        return "Oranges"

    groups: Dict[str, List[str]] = {}
    for m in methods:
        groups.setdefault(family(m), []).append(m)
    styles = {}
    for cmap_name, members in groups.items():
        cmap = plt.get_cmap(cmap_name)
        for k, m in enumerate(members):
            shade = 0.45 + 0.5 * (k / max(1, len(members) - 1)) if len(members) > 1 else 0.7
            styles[m] = dict(color=cmap(shade), hatch=HATCHES[k % len(HATCHES)], marker=MARKERS[k % len(MARKERS)])
    return styles


def smoke_note(result: dict) -> str:
    """'' for a GPU run; for the CPU smoke run, what its numbers are not."""
    if result.get("scale_down", 1) <= 1:
        return ""
    return (f"CPU smoke run: batches {result['scale_down']}x smaller than the GPU benchmark's, small enough to sit "
            f"in the CPU's caches, so no '% copy' (the copy ceiling is DRAM bandwidth); not a performance figure")


def plot(result: dict, out_dir: str) -> List[str]:
    """``time_per_method.png`` (per workload: total time of every method per distribution)
    and, with scaling rows, ``scaling.png`` (total time against the number of items)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    suffix = f"\nCPU smoke run: batches {result['scale_down']}x smaller (not the GPU benchmark)" \
        if result.get("scale_down", 1) > 1 else ""
    workloads = list(dict.fromkeys(r["workload"] for r in result["rows"]))
    if workloads:
        fig, axes = plt.subplots(len(workloads), 1, figsize=(12, 4.5 * len(workloads)), squeeze=False)
        for ax, workload in zip(axes[:, 0], workloads):
            rows = [r for r in result["rows"] if r["workload"] == workload and r["total_ms"]]
            # A group per distribution (and sampler, for diffusion), a bar per method in it.
            group = [r["distribution"] + (f"\n{r['sampler']}" if r.get("sampler") else "") for r in rows]
            series = [r.get("mode") or r["method"] for r in rows]
            dists = list(dict.fromkeys(group))
            methods = list(dict.fromkeys(series))
            width = 0.8 / max(1, len(methods))
            styles = series_styles(methods)
            for k, method in enumerate(methods):
                picked = [(dists.index(g), r["total_ms"]) for g, m, r in zip(group, series, rows) if m == method]
                ax.bar([d + (k + 0.5) * width - 0.4 for d, _ in picked], [ms for _, ms in picked], width=width,
                       label=method, color=styles[method]["color"], hatch=styles[method]["hatch"],
                       edgecolor="black", linewidth=0.3)
            ax.set_xticks(range(len(dists)), dists)
            ax.set_yscale("log")
            ax.set_ylabel("total ms (log)")
            ax.set_title(f"{workload} on {result['environment']['device']}{suffix}")
            ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        path = os.path.join(out_dir, "time_per_method.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    if result["scaling"]:
        fig, ax = plt.subplots(figsize=(8, 5))
        methods = list(dict.fromkeys(r["method"] for r in result["scaling"]))
        styles = series_styles(methods)
        for method in methods:
            pts = sorted((r["items"], r["total_ms"]) for r in result["scaling"] if r["method"] == method and r["total_ms"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=styles[method]["marker"],
                        color=styles[method]["color"], label=method)
        first = result["scaling"][0]
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("items")
        ax.set_ylabel("total ms")
        ax.set_title(f"{first['workload']} / {first['distribution']}: scaling on {result['environment']['device']}"
                     f"{suffix}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, "scaling.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def describe_distribution(name: str, sizes_file: Optional[str]) -> str:
    from .distributions import DISTRIBUTIONS
    if name == "file":
        return f"sizes from {sizes_file}"
    return DISTRIBUTIONS[name][1] if name in DISTRIBUTIONS else name
