"""Activation-aware INT4 scales (AWQ's search, Lin et al. 2023), chosen per unit where they lower
the error.

The rows of a weight that meet loud input channels matter most to the output. Scaling row k of W by
s_k and the input channel by 1 / s_k leaves the product as it was, while 4-bit rounding (one scale
per block of a column) then treats the loud rows more finely. With s = p^(α/2), p each channel's
mean square on the calibration data, α is chosen among ALPHAS by the output error that p weighs, Σ_k
p_k Σ_n (W - Ŵ)²_kn, with Ŵ rounded by the quantizer the engine's weights come from; α = 0 is round
to nearest as it is. So a unit is scaled only where that error is lower on its own inputs (by MARGIN
at least): measured, not assumed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

# a [K, N] weight as the engine reads it back from its 4-bit blocks
Rounding = Callable[[np.ndarray], np.ndarray]

ALPHAS = (0.0, 0.25, 0.5, 0.75)
# a scaling ships where it cuts the weighted error by this share at least (else a Mul for noise)
MARGIN = 0.05


def chosen_scales(weight: np.ndarray, power: np.ndarray | None, rounded: Rounding) -> np.ndarray | None:
    """The per-row scales of a [K, N] weight that give the least weighted error, or None where round
    to nearest does best (or calibration measured no channel power: the unit's input was not
    seen)."""
    if power is None or len(power) != weight.shape[0] or not np.isfinite(power).all() or not power.any():
        return None
    weight = np.asarray(weight, np.float32)
    power = np.maximum(power.astype(np.float64), power[power > 0].min())
    errors = {alpha: _error(weight, _scales(power, alpha), power, rounded) for alpha in ALPHAS}
    best = min(errors, key=errors.get)
    return None if errors[best] > (1 - MARGIN) * errors[0.0] else _scales(power, best)


def _scales(power: np.ndarray, alpha: float) -> np.ndarray:
    scales = power ** (alpha / 2)
    # centred: the weights' range kept
    return (scales / np.sqrt(scales.max() * scales.min())).astype(np.float32)


def _error(weight: np.ndarray, scales: np.ndarray, power: np.ndarray, rounded: Rounding) -> float:
    back = rounded(weight * scales[:, None]) / scales[:, None]
    return float((power[:, None] * np.square(weight - back)).sum())
