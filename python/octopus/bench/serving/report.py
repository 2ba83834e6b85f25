"""The serving benchmark's table and latency-vs-throughput plot."""

from __future__ import annotations

import os


def format_table(result: dict) -> str:
    row_format = "{:<26}{:>7}{:>10}{:>9}{:>9}{:>10}{:>10}{:>8}{:>8}{:>7}"
    head = row_format.format(
        "mode", "rate", "images/s", "p50 s", "p99 s", "high p99", "vs alone", "step %", "batch", "gpu %")
    lines = [head]

    def fmt(value, spec):
        return format(value, spec) if value is not None else "-"

    for r in result["rows"] + result["scenarios"]:
        it = r.get("iterations") or {}
        name = r["mode"] + (" (derived)" if r.get("derived") else "") + (" [single]" if r.get("scenario") else "")
        lines.append(row_format.format(
            name, fmt(r["rate"], "g"), fmt(r["throughput"], ".1f"), fmt(r["p50_s"], ".3f"), fmt(r["p99_s"], ".3f"),
            fmt(r["high_p99_s"], ".3f"), fmt(r.get("high_p99_over_unloaded"), ".2f"),
            fmt(100 * it["step_share"] if it.get("step_share") is not None else None, ".1f"),
            fmt(it.get("mean_batch"), ".1f"), fmt(r.get("gpu_utilization"), ".0f")))
    for h in result.get("high_only", []):
        lines.append(row_format.format(
            "high-priority only", fmt(h["rate"], "g"), "-", "-", "-", fmt(h["high_p99_s"], ".3f"),
            fmt(h["high_p99_over_unloaded"], ".2f"), "-", fmt((h["iterations"] or {}).get("mean_batch"), ".1f"), "-"))
    return "\n".join(lines)


def plot(result: dict, out_dir: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    for mode, color in zip(modes, plt.cm.tab10.colors):
        rows = sorted((r for r in result["rows"] if r["mode"] == mode and r["throughput"]), key=lambda r: r["rate"])
        for key, style in (("p50_s", "o-"), ("p99_s", "s--")):
            ax.plot([r["throughput"] for r in rows], [r[key] for r in rows], style, color=color,
                    label=f"{mode} {key[:3]}")
    ax.set_xlabel("throughput (images/s)")
    ax.set_ylabel("latency (s)")
    ax.set_yscale("log")
    ax.set_title(f"{result['environment'].get('device')}: latency vs throughput ({result['model']['name']} UNet)")
    ax.legend(fontsize=7, ncol=2)
    path = os.path.join(out_dir, "serving_latency_throughput.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
