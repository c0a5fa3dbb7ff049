"""Figures from a result directory. Reads result files only; never writes results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoprec import atomic


def _point(trial: dict[str, Any]) -> tuple[float, float, float, float] | None:
    lat, loss = trial["latency_ms"], trial["accuracy_loss"]
    if loss is None:  # overflowed: unbounded loss, drawn nowhere
        return None
    return lat["median_ms"], loss, lat["median_ms"] - lat["p10_ms"], lat["p90_ms"] - lat["median_ms"]


def plot_pareto(pareto: dict[str, Any], trials: dict[str, Any], path: Path) -> Path:
    """Latency vs accuracy loss: every trial grey, the front joined, uniform plans and the chosen one labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    points = [p for t in trials["trials"] if (p := _point(t))]
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=14, color="0.75", label="trials", zorder=1)
    front = [(t, p) for t in pareto["front"] if (p := _point(t))]
    if front:
        xs, ys = [p[0] for _, p in front], [p[1] for _, p in front]
        ax.errorbar(
            xs, ys, xerr=[[p[2] for _, p in front], [p[3] for _, p in front]], fmt="o-", color="tab:blue",
            ms=5, lw=1.5, capsize=2, label="Pareto front (p10–p90 latency)", zorder=3,
        )
    by_number = {t["trial"]: t for t in trials["trials"]}
    for precision, number in pareto.get("uniform", {}).items():
        p = _point(by_number[number]) if number in by_number else None
        if p:
            ax.annotate(f"all {precision}", (p[0], p[1]), textcoords="offset points", xytext=(6, 6), fontsize=9, color="0.3")
            ax.scatter([p[0]], [p[1]], s=30, facecolors="none", edgecolors="0.3", zorder=4)
    chosen = by_number.get(pareto.get("chosen"))
    if chosen and (p := _point(chosen)):
        ax.scatter([p[0]], [p[1]], s=160, marker="*", color="tab:red", label=f"chosen (trial {chosen['trial']})", zorder=5)
    max_loss = pareto["search"].get("max_loss")
    if max_loss is not None:
        ax.axhline(max_loss, color="tab:red", ls="--", lw=1, label=f"--max-loss {max_loss:g}")
    losses = [p[1] for p in points] + ([max_loss] if max_loss is not None else [])
    if losses and min(losses) >= 0 and max(losses) > 0:
        # Loss spans decades and FP32 sits at exactly 0: linear near 0, logarithmic above.
        ax.set_yscale("symlog", linthresh=max(min(v for v in losses if v > 0), 1e-9))
        ax.set_ylim(0, max(losses) * 4)
    lats = [p[0] for p in points]
    if lats and max(lats) / max(min(lats), 1e-9) > 10:
        ax.set_xscale("log")
    ax.margins(x=0.1)
    engine = pareto["engine"]
    ax.set_xlabel(f"latency per batch, ms (median) — {engine['engine']} {engine['version']} {engine['provider']}")
    ax.set_ylabel(f"accuracy loss ({pareto['search']['metric']}) vs FP32")
    ax.set_title(f"{Path(pareto['model']['path']).name} on {engine['device']}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    fig.tight_layout()
    atomic.write_with(path, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return path
