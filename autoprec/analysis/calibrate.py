"""Activation ranges and FP32 reference outputs: computed once per model and data, cached on
disk."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Sequence

import numpy as np
import onnx

from autoprec.analysis import subgraphs
from autoprec.analysis.data import Batch
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.preparation import cpu_session
from autoprec.analysis.subgraphs import with_outputs
from autoprec.core import atomic, untrusted
from autoprec.core.errors import DataError, first_line
from autoprec.core.plan import Precision
from autoprec.core.search_space import NEUTRAL_OPS

log = logging.getLogger("autoprec")

CALIBRATION_METHODS = ("minmax", "percentile-99.9", "percentile-99.99", "entropy", "mse")
HISTOGRAM_BINS = 2048
CACHE_VERSION = "2"
FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 2.0**-24  # smaller non-zero magnitudes flush to zero in FP16
FP16_MIN_NORMAL = 2.0**-14  # below this FP16 keeps fewer significant bits
# A neutral op whose output reaches this on the data is kept out of FP16 regions by default: a
# quarter of FP16's largest value, so that data a little wider than the calibration's does not
# overflow.
FP16_SAFE_MAX = FP16_MAX / 4
# Magnitudes from here on are a float32 lowest or highest standing for an infinity (an attention
# mask's ``finfo(float32).min``): FP16 holds them as its own extreme (constants are clamped:
# autoprec.lower.cast), a softmax or max reads them alike, so they make no tensor out of FP16's
# range.
SENTINEL = 1e30
# a tensor of this many values or more is histogrammed in a thread of its own
THREADED_VALUES = 1 << 16
# ONNX Runtime's collector keeps its first batch's bin width as the range grows: a batch 1e4 times wider (a padded
# attention mask, an outlier) asked for millions of bins, 1e7 times for petabytes. Past this many, the bins so far
# are coarsened onto the wider range (HISTOGRAM_BINS of them) before the batch is added.
MAX_BINS = 4 * HISTOGRAM_BINS


@dataclass(frozen=True)
class TensorRange:
    """What calibration saw of one activation tensor: its value histogram and FP16-relevant counts.

    ``counts`` = (values, non-zero values below FP16's smallest subnormal, values in FP16's
    subnormal range, values beyond FP16's largest finite value).
    """

    min: float
    max: float
    hist: np.ndarray
    edges: np.ndarray
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)
    # The mean square of each channel (the last axis) where an INT4 unit reads the tensor: how much
    # each row of its weight matters to the output (autoprec.lower.int4's activation-aware scales).
    channel_power: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "_memo", {})  # entropy/MSE thresholds are costly: once per method

    def amax(self, method: str) -> float:
        """The symmetric clipping threshold for ``method`` (see CALIBRATION_METHODS)."""
        if method not in self._memo:
            self._memo[method] = self._amax(method)
        return self._memo[method]

    def _amax(self, method: str) -> float:
        absmax = max(abs(self.min), abs(self.max))
        if method == "minmax":
            return absmax
        if method.startswith("percentile-") and method in CALIBRATION_METHODS:
            return min(absmax,
                       _abs_percentile(self.hist, self.edges, float(method.split("-", 1)[1])))
        if method == "entropy":
            return min(absmax, _entropy_amax(self.hist, self.edges, self.min, self.max))
        if method == "mse":
            return min(absmax, _mse_amax(self.hist, self.edges))
        raise ValueError(f"unknown calibration method {method!r}; choose from "
                         f"{', '.join(CALIBRATION_METHODS)}")

    def clipped_share(self, method: str) -> float:
        """Share of the calibration values beyond ``method``'s threshold (clipped in INT8)."""
        amax = self.amax(method)
        # a bin is clipped if wholly beyond
        nearest = np.minimum(np.abs(self.edges[:-1]), np.abs(self.edges[1:]))
        total = self.hist.sum()
        return float(self.hist[nearest >= amax].sum() / total) if total else 0.0

    def bounds(self, method: str) -> tuple[float, float]:
        """Asymmetric [lo, hi] (always containing 0), clipped like ``amax``."""
        amax = self.amax(method)
        return max(min(self.min, 0.0), -amax), min(max(self.max, 0.0), amax)


def _abs_percentile(hist: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """Percentile of |x| from a value histogram: bins ordered by their largest |edge|."""
    reach = np.maximum(np.abs(edges[:-1]), np.abs(edges[1:]))
    order = np.argsort(reach, kind="stable")
    cdf = np.cumsum(hist[order]) / max(hist.sum(), 1)
    idx = min(int(np.searchsorted(cdf, percentile / 100.0)), len(order) - 1)
    return float(reach[order][idx])


def _entropy_amax(hist: np.ndarray, edges: np.ndarray, lo: float, hi: float) -> float:
    """TensorRT's KL-divergence threshold, computed by ONNX Runtime's own HistogramCollector.

    Slow (a Python loop over ~1000 candidate thresholds of the 2048-bin histogram, ~0.7 s per
    tensor): computed only when asked for, once per tensor.
    """
    from onnxruntime.quantization.calibrate import HistogramCollector

    collector = HistogramCollector("entropy", True, len(hist), 128, 99.99, "same")
    threshold = float(max(abs(edges[0]), abs(edges[-1])))
    with contextlib.redirect_stdout(io.StringIO()):
        # it wants NumPy scalars
        histogram = (hist, edges, np.float32(lo), np.float32(hi), np.float32(threshold))
        low, high = collector.get_entropy_threshold(histogram, 128)
    return float(max(abs(low), abs(high)))


def _mse_amax(hist: np.ndarray, edges: np.ndarray, candidates: int = 200) -> float:
    """The threshold minimising expected INT8 error: clipping error beyond it plus rounding error
    within."""
    centres = np.abs((edges[:-1] + edges[1:]) / 2)
    absmax = float(centres.max()) if len(centres) else 0.0
    if absmax == 0 or hist.sum() == 0:
        return absmax
    thresholds = np.linspace(absmax / candidates, absmax, candidates)[:, None]
    clip = np.where(centres[None, :] > thresholds, (centres[None, :] - thresholds) ** 2, 0.0)
    rounding = np.where(centres[None, :] <= thresholds, (thresholds / 127.0) ** 2 / 12.0, 0.0)
    errors = ((clip + rounding) * hist[None, :]).sum(axis=1)
    return float(thresholds[int(np.argmin(errors)), 0])


@dataclass(frozen=True)
class ActivationRanges:
    tensors: dict[str, TensorRange]

    def __getitem__(self, name: str) -> TensorRange:
        return self.tensors[name]

    def with_thresholds(self, method: str) -> ActivationRanges:
        """These ranges with every tensor's ``method`` threshold computed now, once: each worker
        process that gets a copy reads it instead of computing its own."""
        for tensor in self.tensors.values():
            tensor.amax(method)
        return self

    def save(self, path: Path) -> None:
        names = sorted(self.tensors)
        arrays = {"names": np.array(names)}
        for i, name in enumerate(names):
            r = self.tensors[name]
            arrays[f"minmax_{i}"] = np.array([r.min, r.max], dtype=np.float64)
            arrays[f"hist_{i}"], arrays[f"edges_{i}"] = r.hist, r.edges
            arrays[f"counts_{i}"] = np.array(r.counts, dtype=np.int64)
            if r.channel_power is not None:
                arrays[f"power_{i}"] = r.channel_power
        # not compressed: compressing took 0.4 s of a yolov8n search's set-up to keep 2 MB instead of 9
        atomic.write_with(path, lambda f: np.savez(f, **arrays))

    @classmethod
    def load(cls, path: Path) -> ActivationRanges:
        """The ranges :meth:`save` kept at ``path``; a ValueError for any a calibration cannot have
        measured (not finite, out of order, negative counts), naming the tensor."""
        with np.load(path, allow_pickle=False) as npz:
            tensors = {}
            for i, name in enumerate(npz["names"].tolist()):
                lo, hi = npz[f"minmax_{i}"].tolist()
                counts = tuple(int(c) for c in npz[f"counts_{i}"])
                power = npz[f"power_{i}"] if f"power_{i}" in npz.files else None
                hist, edges = npz[f"hist_{i}"], npz[f"edges_{i}"]
                measurable = (math.isfinite(lo) and math.isfinite(hi) and lo <= hi and np.isfinite(hist).all()
                              and (hist >= 0).all() and np.isfinite(edges).all() and (np.diff(edges) >= 0).all()
                              and min(counts, default=0) >= 0 and (power is None or np.isfinite(power).all()))
                if not measurable:
                    raise ValueError(f"tensor {name}'s range {lo!r}..{hi!r} or histogram is not "
                                     "one a calibration measures (not finite, out of order or "
                                     "negative)")
                tensors[name] = TensorRange(lo, hi, hist, edges, counts, power)
        return cls(tensors)


def collected_tensors(info: ModelInfo) -> list[str]:
    """Every tensor a lowering may quantize or ``autoprec ranges`` shows: each unit's inputs and
    output (a residual Add's skip input TensorRT's form quantizes is one of those), and where its
    output Q/DQ goes in ONNX Runtime's form (:meth:`Unit.quantized_output`). Not every node output
    inside a unit (only TensorRT 10's calibration cache wants those: :func:`every_node_tensors`):
    their histograms were most of a calibration (ppocr-rec's 328 tensors, of which the lowerings
    read 103)."""
    names = {t for u in info.units for t in (*u.activations, u.output)}
    for scope, graph in subgraphs.graphs(info.model.graph):
        nodes = {node.name: node for node in graph.node}
        names |= {u.quantized_output(nodes.__getitem__) for u in info.units if u.scope == scope}
    return sorted(names)


def every_node_tensors(info: ModelInfo) -> list[str]:
    """Each unit's inputs and the output of every node in it: what TensorRT 10's implicit INT8 wants
    a scale for, every node of an INT8 unit held to INT8 (``export --format trt10``)."""
    names = {t for u in info.units for t in u.activations}
    for scope, graph in subgraphs.graphs(info.model.graph):
        in_units = {n for u in info.units if u.scope == scope for n in u.nodes}
        names |= {t for node in graph.node if node.name in in_units for t in node.output if t}
    return sorted(names)


def int4_inputs(info: ModelInfo) -> list[str]:
    """The activations INT4 units read: calibration measures each channel's power there."""
    return sorted({u.activations[0] for u in info.units if Precision.INT4 in u.allowed and u.activations})


def content_key(info: ModelInfo, fingerprint: str, extra: str) -> str:
    """A cache file's name part: the model's and the data's content, and what was computed from
    them."""
    return hashlib.sha256(f"{info.sha256}|{fingerprint}|{extra}".encode()).hexdigest()[:16]


def calibration_cache(info: ModelInfo, fingerprint: str, cache_dir: Path,
                      tensors: Sequence[str] | None = None, shared: Collection[str] = ()) -> Path:
    """Where :func:`calibrate` keeps its ranges of ``tensors`` for this model and data (the name
    carries the content hash). By default, of :func:`collected_tensors`; or of every node's output
    where such a file is there or a study shares one (``shared``: its file names): autoprec
    calibrated those until 2026-12, and a study it began resumes with its own file."""
    if tensors is None:
        wider = calibration_cache(info, fingerprint, cache_dir, every_node_tensors(info))
        if wider.exists() or wider.name in shared:
            return wider
    powered = ",".join(int4_inputs(info))
    powered = f"|power:{powered}" if powered else ""
    names = ",".join(tensors if tensors is not None else collected_tensors(info))
    return cache_dir / f"calibration-{content_key(info, fingerprint, CACHE_VERSION + names + powered)}.npz"


def calibrate(
    info: ModelInfo, batches: Sequence[Batch], fingerprint: str, cache_dir: Path | None = None,
    tensors: Sequence[str] | None = None,
) -> ActivationRanges:
    """Run the FP32 model once over the calibration batches, histogramming ``tensors`` (default: the
    quantizable ones, :func:`collected_tensors`).

    Uses ONNX Runtime's own HistogramCollector (value histograms, rebinned as ranges grow), so
    percentile and entropy thresholds come from the same collected data.
    """
    from onnxruntime.quantization.calibrate import HistogramCollector

    names = sorted(tensors) if tensors is not None else collected_tensors(info)
    cache = calibration_cache(info, fingerprint, cache_dir, None if tensors is None else names) if cache_dir else None
    if cache is not None and cache.exists():
        try:
            return ActivationRanges.load(untrusted.npz_checked(cache, f"the cache {cache.parent}"))
        except (*untrusted.NUMPY_UNREADABLE, KeyError, DataError) as exc:
            log.warning(f"{cache}: not a calibration autoprec kept ({first_line(exc)}); calibrated "
                        "again")
    exposed, read_as = with_outputs(info.model, names)
    session = cpu_session(info.stored.with_proto(exposed))
    collector = HistogramCollector("entropy", True, HISTOGRAM_BINS, 128, 99.99, "same")
    counts = {n: np.zeros(4, np.int64) for n in names}
    # per batch: each channel's sum of squares, and the values' count
    power = {n: [] for n in int4_inputs(info)}

    def collected(name: str, value: np.ndarray) -> None:
        binnable = _histogrammable(value)
        _room_for(collector.histogram_dict, name, binnable)
        collector.collect({name: binnable})
        counts[name] += _fp16_counts(value)
        if name in power:
            rows = np.asarray(value, np.float64).reshape(-1, value.shape[-1])
            power[name].append((np.square(rows).sum(axis=0), len(rows)))

    # A large tensor's histogram and counts in a thread of its own: numpy leaves the GIL there, so
    # the threads use every core (on small ones they would only take turns at it).
    with contextlib.redirect_stdout(io.StringIO()), ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for batch in batches:  # (the collector prints progress chatter)
            # A tensor in an If branch the run did not take reads as empty: it has no values to
            # range.
            values = {n: v for n, v in zip(names, session.run(read_as, batch)) if v.size}
            large = [n for n, v in values.items() if v.size >= THREADED_VALUES]
            done = pool.map(collected, large, [values[n] for n in large])
            for name in values.keys() - set(large):  # (each tensor's figures its own: any order)
                collected(name, values[name])
            list(done)
    tensors = {}
    for name, (hist, edges, lo, hi, _threshold) in collector.get_histogram_dict().items():
        tensors[name] = TensorRange(
            float(lo),
            float(hi),
            np.asarray(hist),
            np.asarray(edges, dtype=np.float64),
            tuple(int(c) for c in counts[name]),
            _mean_power(power.get(name)),
        )
    ranges = ActivationRanges(tensors)
    if cache is not None:
        ranges.save(cache)
    return ranges


def _mean_power(sums: list | None) -> np.ndarray | None:
    if not sums:
        return None
    return (sum(s for s, _ in sums) / max(1, sum(n for _, n in sums))).astype(np.float32)


def _room_for(histograms: dict, name: str, value: np.ndarray) -> None:
    """``name``'s histogram so far coarsened onto ``value``'s range (each bin's count moved to the
    wider bin holding its centre) where ONNX Runtime would grow it past MAX_BINS at its old width."""
    if name not in histograms:
        return
    hist, edges, lo, hi, threshold = histograms[name]
    # as the collector computes it: the merge then finds the range wide enough
    reach = np.array(max(abs(value.min()), abs(value.max())), dtype=value.dtype)
    if not threshold or reach <= threshold or len(hist) * (reach / threshold) <= MAX_BINS:
        return
    coarse, wide = np.histogram((edges[:-1] + edges[1:]) / 2, HISTOGRAM_BINS, range=(-reach, reach), weights=hist)
    histograms[name] = (np.rint(coarse).astype(hist.dtype), wide.astype(edges.dtype), lo, hi, reach)


def _histogrammable(value: np.ndarray) -> np.ndarray:
    """The values a histogram can bin: infinities and NaNs left out (an attention mask's -inf has no
    INT8 range) and magnitudes bounded to SENTINEL (a mask of float32's lowest would make every bin
    infinitely wide). An INT8 plan for such a tensor is still measured: the search sees what its
    clipping costs."""
    value = np.asarray(value, np.float32).ravel()
    if -SENTINEL <= value.min() and value.max() <= SENTINEL:  # (not for a NaN): binnable as it is
        return value
    finite = value[np.isfinite(value)]
    return np.clip(finite, -SENTINEL, SENTINEL) if finite.size else np.zeros(1, np.float32)


def _fp16_counts(value: np.ndarray) -> tuple[int, int, int, int]:
    """One batch's ``value`` counted as TensorRange.counts counts."""
    magnitude = np.abs(value).ravel()
    small = magnitude[magnitude < FP16_MIN_NORMAL]
    wide = 0 if magnitude.max() <= FP16_MAX else np.count_nonzero(magnitude > FP16_MAX)
    return (magnitude.size, np.count_nonzero((small > 0) & (small < FP16_MIN_SUBNORMAL)),
            np.count_nonzero(small >= FP16_MIN_SUBNORMAL), wide)


def out_of_range_nodes(info: ModelInfo, batches: Sequence[Batch], fingerprint: str = "",
                       cache_dir: Path | None = None) -> list[str]:
    """Precision-neutral nodes of the top graph, in no unit, that read or make a float tensor
    reaching ``FP16_SAFE_MAX`` on ``batches``: in FP16 they (or the Cast before them) would overflow
    (a GELU's cube, a sum of squares' square). Each tensor's largest magnitude is reduced inside the
    run, so no activation is copied out. With ``cache_dir``, kept there under the model's and data's
    (``fingerprint``) content, as calibration is: a resumed search and every worker read it, not one
    more pass over the calibration batches."""
    graph = info.model.graph
    in_units = {n for u in info.units for n in u.nodes}
    constants = {i.name for i in graph.initializer}
    float32 = {v.name for v in (*graph.value_info, *graph.input, *graph.output)
               if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT} - constants
    watched = [n for n in graph.node if n.op_type in NEUTRAL_OPS and n.name not in in_units and n.output[0] in float32]
    tensors = sorted({t for n in watched for t in (*n.input, *n.output) if t in float32})
    if not tensors:
        return []
    key = content_key(info, fingerprint, f"{FP16_SAFE_MAX:g},{SENTINEL:g}," + ",".join(tensors))
    cache = cache_dir / f"out-of-range-{key}.json" if cache_dir else None
    kept = (atomic.read_keyed(cache, key) or {}).get("names") if cache is not None else None
    if isinstance(kept, list) and all(isinstance(n, str) for n in kept) and set(kept) <= {n.name for n in watched}:
        return kept
    # none kept, or damaged: measured (again)
    found = _out_of_range(info, batches, watched, tensors)
    if cache is not None:
        atomic.write_keyed(cache, key, {"names": found})
    return found


def _out_of_range(info: ModelInfo, batches: Sequence[Batch], watched: list, tensors: list[str]) -> list[str]:
    probed = onnx.ModelProto()
    probed.CopyFrom(info.model)
    del probed.graph.output[:]
    probed.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(SENTINEL, np.float32), "autoprec_sentinel"),
                                     onnx.numpy_helper.from_array(np.array(0, np.float32), "autoprec_zero")])
    for i, name in enumerate(tensors):
        magnitude, sentinel, kept, peak = (f"autoprec_{part}/{i}" for part in ("abs", "sentinel", "kept", "peak"))
        probed.graph.node.extend([onnx.helper.make_node("Abs", [name], [magnitude]),
                                  onnx.helper.make_node("Greater", [magnitude, "autoprec_sentinel"],
                                                        [sentinel]),
                                  onnx.helper.make_node("Where",
                                                        [sentinel, "autoprec_zero", magnitude],
                                                        [kept]),
                                  onnx.helper.make_node("ReduceMax", [kept], [peak], keepdims=0)])
        probed.graph.output.append(onnx.helper.make_tensor_value_info(peak, onnx.TensorProto.FLOAT, []))
    session = cpu_session(info.stored.with_proto(probed))
    peaks = np.zeros(len(tensors))
    for batch in batches:
        peaks = np.maximum(peaks, [float(v) for v in session.run(None, batch)])
    # NaN counts too
    wide = {name for name, peak in zip(tensors, peaks) if not peak < FP16_SAFE_MAX}
    return [n.name for n in watched if wide & {*n.input, *n.output}]
