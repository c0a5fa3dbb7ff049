"""Activation-aware INT4 scales (AWQ's search, Lin et al. 2023), chosen per unit where they lower the error.

The rows of a weight that meet loud input channels matter most to the output. Scaling row k of W by s_k and the
input channel by 1 / s_k leaves the product as it was, while 4-bit rounding (one scale per block of a column)
then treats the loud rows more finely. With s = p^(α/2), p each channel's mean square on the calibration data,
α is chosen among ALPHAS by the output error that p weighs, Σ_k p_k Σ_n (W - Ŵ)²_kn, with Ŵ rounded by the
quantizer the engine's weights come from; α = 0 is round to nearest as it is. So a unit is scaled only where
that error is lower on its own inputs (by MARGIN at least): measured, not assumed.
"""

from __future__ import annotations

import numpy as np

ALPHAS = (0.0, 0.25, 0.5, 0.75)
MARGIN = 0.05  # a scaling ships where it cuts the weighted error by this share at least (else a Mul for noise)


def chosen_scales(weight: np.ndarray, power: np.ndarray | None, block: int) -> np.ndarray | None:
    """The per-row scales of a [K, N] weight that give the least weighted error, or None where round to nearest
    does best (or calibration measured no channel power: the unit's input was not seen)."""
    if power is None or len(power) != weight.shape[0] or not np.isfinite(power).all() or not power.any():
        return None
    weight = np.asarray(weight, np.float32)
    power = np.maximum(power.astype(np.float64), power[power > 0].min())
    errors = {alpha: _error(weight, _scales(power, alpha), power, block) for alpha in ALPHAS}
    best = min(errors, key=errors.get)
    return None if errors[best] > (1 - MARGIN) * errors[0.0] else _scales(power, best)


def _scales(power: np.ndarray, alpha: float) -> np.ndarray:
    scales = power ** (alpha / 2)
    return (scales / np.sqrt(scales.max() * scales.min())).astype(np.float32)  # centred: the weights' range kept


def _error(weight: np.ndarray, scales: np.ndarray, power: np.ndarray, block: int) -> float:
    rounded = rounded_blocks(weight * scales[:, None], block) / scales[:, None]
    return float((power[:, None] * np.square(weight - rounded)).sum())


def rounded_blocks(weight: np.ndarray, block: int) -> np.ndarray:
    """``weight`` [K, N] as the engines read it back from ONNX Runtime's symmetric 4-bit blocks."""
    from onnxruntime.capi._pybind_state import quantize_qdq_matmul_4bits

    k, n = weight.shape
    packed, scales = np.zeros(k * n // 2, np.uint8), np.zeros((k // block, n), np.float32)
    quantize_qdq_matmul_4bits(packed, np.ascontiguousarray(weight, np.float32), scales,
                              np.zeros(n * (k // block), np.uint8), block, n, k, True)
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=1).reshape(-1).astype(np.int8)
    values = np.where(nibbles > 7, nibbles - 16, nibbles).reshape(k, n).astype(np.float32)
    return values * np.repeat(scales, block, axis=0)
