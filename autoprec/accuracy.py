"""Accuracy against the FP32 model's own outputs: no labels needed.

Every output gets cosine similarity, relative L2 error, max abs error, SNR (dB), and top-1
agreement when it looks like class scores. One scalar ``accuracy_loss`` is chosen by ``--metric``.
A candidate whose outputs hold NaN or Inf has infinite loss: overflow is never averaged away.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from autoprec.errors import AutoprecError

Outputs = Sequence[Mapping[str, np.ndarray]]
LossFunction = Callable[[Outputs, Outputs], float]

BUILTIN_METRICS = ("cosine", "rel_l2", "max_abs", "top1")


def _looks_like_scores(arr: np.ndarray) -> bool:
    """(N, C) or (N, T, C) float scores with a few classes or more."""
    return arr.dtype.kind == "f" and arr.ndim in (2, 3) and arr.shape[-1] >= 2


def output_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Metrics for one output over all batches (arrays stacked along the batch axis)."""
    ref = reference.astype(np.float64).reshape(len(reference), -1)
    cand = candidate.astype(np.float64).reshape(len(candidate), -1)
    metrics: dict[str, float] = {}
    if not np.isfinite(cand).all():
        metrics.update(cosine=-math.inf, rel_l2=math.inf, max_abs=math.inf, snr_db=-math.inf, nonfinite=1.0)
        if _looks_like_scores(reference):
            metrics["top1"] = 0.0
        return metrics
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    dots = (ref * cand).sum(axis=1)
    # Two all-zero items agree perfectly; one zero and one not do not.
    same = np.all(ref == cand, axis=1)
    cosines = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(same, 1.0, 0.0))
    noise = float(((cand - ref) ** 2).sum())
    signal = float((ref**2).sum())
    metrics["cosine"] = float(cosines.mean())
    metrics["rel_l2"] = math.sqrt(noise / signal) if signal > 0 else (0.0 if noise == 0 else math.inf)
    metrics["max_abs"] = float(np.abs(cand - ref).max()) if ref.size else 0.0
    metrics["snr_db"] = 10 * math.log10(signal / noise) if noise > 0 and signal > 0 else (math.inf if noise == 0 else -math.inf)
    metrics["nonfinite"] = 0.0
    if _looks_like_scores(reference):
        metrics["top1"] = float((reference.argmax(-1) == candidate.argmax(-1)).mean())
    return metrics


def compare(reference: Outputs, candidate: Outputs) -> dict[str, dict[str, float]]:
    """Per output name, metrics over every evaluation batch."""
    names = list(reference[0])
    return {
        name: output_metrics(np.concatenate([r[name] for r in reference]), np.concatenate([c[name] for c in candidate]))
        for name in names
    }


def loss_from_metrics(metrics: Mapping[str, Mapping[str, float]], metric: str) -> float:
    """The built-in scalar losses (lower is better, 0 = identical to FP32), averaged over outputs."""
    per_output = list(metrics.values())
    if any(m.get("nonfinite") for m in per_output):
        return math.inf
    if metric == "cosine":
        return float(np.mean([1.0 - m["cosine"] for m in per_output]))
    if metric in ("rel_l2", "max_abs"):
        return float(np.mean([m[metric] for m in per_output]))
    if metric == "top1":
        scores = [m["top1"] for m in per_output if "top1" in m]
        if not scores:
            raise AutoprecError("--metric top1: no model output looks like class scores (N×C); choose cosine or rel_l2")
        return float(1.0 - np.mean(scores))
    raise AutoprecError(f"unknown --metric {metric!r}; use {', '.join(BUILTIN_METRICS)} or module:function")


def resolve_metric(spec: str) -> tuple[str, LossFunction | None]:
    """A built-in metric name, or ``module:function`` imported from the current directory or sys.path.

    The user function runs with full privileges: it is user code, exactly like a plugin.
    It receives (reference_outputs, candidate_outputs), each a list of {output name: array} per
    evaluation batch, and returns a float loss (lower is better).
    """
    if spec in BUILTIN_METRICS:
        return spec, None
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise AutoprecError(f"unknown --metric {spec!r}; use {', '.join(BUILTIN_METRICS)} or module:function")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise AutoprecError(f"--metric {spec}: cannot import it ({exc}); check the module is on the path") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it was imported (a syntax error, its own code)
        raise AutoprecError(f"--metric {spec}: importing {module_name} raised {type(exc).__name__}: {exc}; fix the module") from None
    if not callable(func):
        raise AutoprecError(f"--metric {spec}: {func_name} is not a function")
    return spec, func
