"""Activation-aware INT4 scales (AWQ's search, Lin et al. 2023), chosen per unit where they lower
the error.

The rows of a weight that meet loud input channels matter most to the output. Scaling row k of W by
s_k and the input channel by 1 / s_k leaves the product as it was, while 4-bit rounding (one scale
per block of a column) then treats the loud rows more finely. With s = p^(α/2), p each channel's
mean square on the calibration data, α is chosen among ALPHAS by the output error that p weighs, Σ_k
p_k Σ_n (W - Ŵ)²_kn, with Ŵ rounded by the quantizer the engine's weights come from; α = 0 is round
to nearest as it is. The same error chooses between the roundings an engine offers (symmetric, or
with a zero point per block). So a unit is scaled, or rounded otherwise than symmetric round to
nearest, only where that error is lower on its own inputs (by a margin at least): measured, not
assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

# a [K, N] weight as the engine reads it back from its 4-bit blocks
Rounding = Callable[[np.ndarray], np.ndarray]

ALPHAS = (0.0, 0.25, 0.5, 0.75)
# a scaling, or a rounding other than the plain one, ships where it cuts the weighted error by this
# share at least (else a Mul for noise); a rounding that costs time asks more (see autoprec.lower.int4)
MARGIN = 0.05


@dataclass(frozen=True)
class Rounded:
    """One rounding of a weight: its activation-aware exponent α and the weighted error it leaves."""

    alpha: float
    error: float


def rounding_errors(weight: np.ndarray, power: np.ndarray | None,
                    roundings: Mapping[str, Rounding]) -> dict[str, Rounded]:
    """Each rounding's (a key of ``roundings``) least weighted error on a [K, N] weight and the α
    that gives it; α 0 only where calibration measured no channel power (the unit's input was not
    seen: the roundings are compared unweighted)."""
    weight = np.asarray(weight, np.float32)
    weighed = _weighed(power, weight.shape[0])
    alphas = ALPHAS if weighed is not None else (0.0,)
    weighed = weighed if weighed is not None else np.ones(weight.shape[0])
    return {name: _least(weight, weighed, rounded, alphas) for name, rounded in roundings.items()}


def chosen_rounding(errors: Mapping[str, Rounded], margins: Mapping[str, float]) -> str:
    """The rounding of least error among the first (the plain one) and those that cut its error by
    their margin (``margins``, MARGIN where none is given)."""
    first = next(iter(errors))
    plain = errors[first].error
    cutting = {name: rounded.error for name, rounded in errors.items()
               if name == first or rounded.error <= (1 - margins.get(name, MARGIN)) * plain}
    return min(cutting, key=cutting.get)


def activation_scales(power: np.ndarray | None, rows: int, alpha: float) -> np.ndarray | None:
    """The per-row scales of exponent ``alpha``; None at 0 (round to nearest as it is)."""
    weighed = _weighed(power, rows)
    return _scales(weighed, alpha) if alpha and weighed is not None else None


def _weighed(power: np.ndarray | None, rows: int) -> np.ndarray | None:
    """The channel power the error weighs (a silent channel as the quietest heard), None where
    calibration measured none for these rows."""
    seen = power is not None and len(power) == rows and np.isfinite(power).all() and power.any()
    return np.maximum(power.astype(np.float64), power[power > 0].min()) if seen else None


def _least(weight: np.ndarray, power: np.ndarray, rounded: Rounding,
           alphas: tuple[float, ...]) -> Rounded:
    """The α of one rounding with the least error, and that error (an α past 0 only where it cuts
    the error by MARGIN)."""
    errors = {alpha: _error(weight, _scales(power, alpha), power, rounded) for alpha in alphas}
    alpha = min(errors, key=errors.get)
    return Rounded(alpha, errors[alpha]) if errors[alpha] <= (1 - MARGIN) * errors[0.0] else Rounded(0.0, errors[0.0])


def _scales(power: np.ndarray, alpha: float) -> np.ndarray:
    scales = power ** (alpha / 2)
    # centred: the weights' range kept
    return (scales / np.sqrt(scales.max() * scales.min())).astype(np.float32)


def _error(weight: np.ndarray, scales: np.ndarray, power: np.ndarray, rounded: Rounding) -> float:
    diff = weight - rounded(weight * scales[:, None]) / scales[:, None]
    # each row's squares summed in float32, then weighed: no float64 copy of the weight (a head's is 0.5 GB)
    return float(power @ np.einsum("kn,kn->k", diff, diff).astype(np.float64))
