"""Activation-aware INT4 scales (AWQ's search, Lin et al. 2023), chosen per unit where they lower
the error.

The rows of a weight that meet loud input channels matter most to the output. Scaling row k of W by
s_k and the input channel by 1 / s_k leaves the product as it was, while 4-bit rounding (one scale
per block of a column) then treats the loud rows more finely. With s = p^(α/2), p each channel's
mean square on the calibration data, α is chosen among ALPHAS by the output error that p weighs, Σ_k
p_k Σ_n (W - Ŵ)²_kn, with Ŵ rounded by the quantizer the engine's weights come from; α = 0 is round
to nearest as it is. The same error chooses between the roundings an engine offers (symmetric, or
with a zero point per block). So a unit is scaled, or rounded otherwise than symmetric round to
nearest, only where that error is lower on its own inputs (by MARGIN at least): measured, not
assumed.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

# a [K, N] weight as the engine reads it back from its 4-bit blocks
Rounding = Callable[[np.ndarray], np.ndarray]

ALPHAS = (0.0, 0.25, 0.5, 0.75)
# a scaling ships where it cuts the weighted error by this share at least (else a Mul for noise)
MARGIN = 0.05


def chosen_rounding(weight: np.ndarray, power: np.ndarray | None,
                  roundings: Mapping[str, Rounding]) -> tuple[str, np.ndarray | None]:
    """The rounding (a key of ``roundings``: the first is the plain one) and per-row scales of a [K,
    N] weight that give the least weighted error; no scales where round to nearest does best (or
    calibration measured no channel power: the unit's input was not seen, and the roundings are
    compared unweighted)."""
    weight = np.asarray(weight, np.float32)
    seen = power is not None and len(power) == weight.shape[0] and np.isfinite(power).all() and power.any()
    power = np.maximum(power.astype(np.float64), power[power > 0].min()) if seen else np.ones(weight.shape[0])
    alphas = ALPHAS if seen else (0.0,)
    best = {name: _least(weight, power, rounded, alphas) for name, rounded in roundings.items()}
    plain = next(iter(best))
    name = min(best, key=lambda key: best[key][1])
    if best[name][1] > (1 - MARGIN) * best[plain][1]:
        name = plain
    alpha = best[name][0]
    return name, _scales(power, alpha) if alpha else None


def _least(weight: np.ndarray, power: np.ndarray, rounded: Rounding,
           alphas: tuple[float, ...]) -> tuple[float, float]:
    """The α of one rounding with the least error, and that error (an α past 0 only where it cuts
    the error by MARGIN)."""
    errors = {alpha: _error(weight, _scales(power, alpha), power, rounded) for alpha in alphas}
    alpha = min(errors, key=errors.get)
    return (alpha, errors[alpha]) if errors[alpha] <= (1 - MARGIN) * errors[0.0] else (0.0, errors[0.0])


def _scales(power: np.ndarray, alpha: float) -> np.ndarray:
    scales = power ** (alpha / 2)
    # centred: the weights' range kept
    return (scales / np.sqrt(scales.max() * scales.min())).astype(np.float32)


def _error(weight: np.ndarray, scales: np.ndarray, power: np.ndarray, rounded: Rounding) -> float:
    back = rounded(weight * scales[:, None]) / scales[:, None]
    return float((power[:, None] * np.square(weight - back)).sum())
