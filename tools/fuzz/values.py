"""Feed values for the fuzzer: value regimes per dtype, and the one-ulp jitter of the oracle.

A case draws one regime for its float inputs:
  - "normal":  standard normal values (every element finite, no ties);
  - "wide":    half normal, half sign * 10**u with u spread from the smallest denormal to
               1e20 (float32) or 65504 (float16): denormals, tiny and huge magnitudes;
  - "special": "wide" plus about 5% of elements set to +inf, -inf or NaN.
`near_integers` gives the values that stress float16 rounding (k + a few ulps: after one
float16 operation they round onto or off an integer), `integers` the int operands.
`jitter` moves every finite nonzero float by one ulp up or down: the oracle runs
onnxruntime on jittered feeds to measure how sensitive each output element is to
rounding (tools/fuzz/check.py).
"""

from __future__ import annotations

import numpy as np

F16 = np.dtype("float16")
REGIMES = ("normal", "wide", "special")
# log10 of the smallest denormal and of the largest magnitude drawn, per float dtype.
_DECADES = {F16: (-7.7, 4.8), np.dtype("float32"): (-44.8, 20.0),
            np.dtype("float64"): (-300.0, 20.0)}


def floats(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
           regime: str = "normal") -> np.ndarray:
    """Random floats of `dtype` in `regime` (see the module docstring)."""
    dtype = np.dtype(dtype)
    x = np.asarray(rng.standard_normal(shape))
    if regime != "normal" and x.size:
        lo, hi = _DECADES[dtype]
        wide = rng.random(shape) < 0.5
        mag = np.asarray(10.0 ** rng.uniform(lo, hi, size=shape))
        mag[rng.random(shape) < 0.1] = 10.0 ** hi  # the extreme itself (1e20)
        x = np.where(wide, np.where(rng.random(shape) < 0.5, -mag, mag), x)
    if regime == "special" and x.size:
        pick = rng.random(shape)
        x = np.where(pick < 0.02, np.inf, x)
        x = np.where((pick >= 0.02) & (pick < 0.035), -np.inf, x)
        x = np.where((pick >= 0.035) & (pick < 0.05), np.nan, x)
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(dtype)


def near_integers(rng: np.random.Generator, shape: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray:
    """Integers up to 300, small offsets (0.00234), or both: one float16 op on these
    (0.00234 - 100 = -99.99766) rounds onto or off an integer."""
    k = rng.integers(-300, 301, size=shape) * (rng.random(shape) < 0.5)
    off = rng.choice([0.0, 1e-3, -1e-3, 2.34e-3, 0.3, -0.5, 0.5, 0.7], size=shape)
    return (k + off).astype(dtype)


def integers(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
             lo: int = -9, hi: int = 10, zero_free: bool = False) -> np.ndarray:
    """Random ints in [lo, hi); zero_free replaces zeros (divisors that must not raise)."""
    x = rng.integers(lo, hi, size=shape)
    if zero_free:
        x = np.where(x == 0, hi - 1 if hi - 1 != 0 else 1, x)
    return x.astype(dtype)


_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_CHUNK = 1 << 18  # elements per step: the temporaries stay in cache, not in fresh pages


def jitter(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """`x` with every finite nonzero float moved one ulp up or down (never onto 0).

    Bit arithmetic in cache-sized chunks: BERT-base's 110M weights jitter in about 0.3 s
    (np.where and nextafter took 12 s, four times per check). 0, the smallest denormal, inf
    and NaN stay; the largest finite value moves toward 0 or stays, at random (above it is
    inf). Always kept, it gave [FLT_MAX, 0.28, -FLT_MAX, -1.27] summed no spread, though
    each order of the additions loses another small term to FLT_MAX (fuzz 80/597)."""
    if x.dtype.kind != "f" or not x.size:
        return x
    ut = _UINT[x.dtype.itemsize]
    bits = np.ascontiguousarray(x).reshape(-1).view(ut)
    out = np.empty_like(bits)
    up = np.unpackbits(np.frombuffer(rng.bytes((bits.size + 7) // 8), np.uint8),
                       count=bits.size)
    inf = int(np.array(np.inf, x.dtype).view(ut))
    sign_off = ut((1 << (8 * x.dtype.itemsize - 1)) - 1)
    for lo in range(0, bits.size, _CHUNK):
        part, step = bits[lo:lo + _CHUNK], out[lo:lo + _CHUNK]
        np.left_shift(up[lo:lo + _CHUNK], 1, out=step, dtype=ut, casting="unsafe")
        step -= ut(1)  # +1 or -1 (wrapping): one ulp away from 0 or toward it
        magnitude = part & sign_off
        magnitude -= ut(2)  # wraps for 0 and the smallest denormal: all four kept below
        np.putmask(step, magnitude > ut(inf - 3), ut(0))
        np.putmask(step, (magnitude == ut(inf - 3)) & (step == ut(1)), ut(0))  # not onto inf
        step += part
    return out.view(x.dtype).reshape(x.shape)


def ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of each element's own dtype at |x| (float64; 0 for non-floats)."""
    if x.dtype.kind != "f":
        return np.zeros(x.shape)
    with np.errstate(invalid="ignore"):  # inf and NaN have no spacing: NaN
        return np.spacing(np.abs(x)).astype(np.float64)
