"""FMA accuracy, exactly: fused (one rounding) vs unfused (two roundings) multiply-add,
and 16-bit dot products accumulated in 16 vs 32 bits, against exact rational results.

Every value is a `fractions.Fraction`, and every rounding is done here, by the IEEE
rule (round to nearest, ties to even, gradual underflow, overflow to infinity), for
the format's precision and exponent range. So the figures say what the arithmetic
*definitions* give, independent of which instructions this CPU or TensorFlow has:

  fused     round(a*b + c)              what an FMA instruction returns
  unfused   round(round(a*b) + c)       a multiply, then an add
  acc16     s = round16(s + round16(a_i*b_i))   16-bit accumulation
  acc32     s = round32(s + a_i*b_i), then round16(s)   Tensor Core style (16-bit
            products are exact in float32; the sum is kept in float32)
"""

from fractions import Fraction
import math

import numpy as np

# (precision in bits incl. the implicit one, minimum normal exponent, maximum exponent)
FORMATS = {"float32": (24, -126, 127), "float16": (11, -14, 15),
           "bfloat16": (8, -126, 127)}


def _exponent(q: Fraction) -> int:
  """floor(log2(|q|)) for q != 0, exactly."""
  q = abs(q)
  e = q.numerator.bit_length() - q.denominator.bit_length()
  return e if Fraction(2) ** e <= q else e - 1


def ulp(q: Fraction, fmt: str) -> Fraction:
  """The spacing of `fmt` values at |q| (subnormal spacing below the normal range)."""
  p, emin, _ = FORMATS[fmt]
  e = max(_exponent(q), emin) if q else emin
  return Fraction(2) ** (e - p + 1)


def round_to(q: Fraction, fmt: str) -> Fraction | float:
  """q rounded to the nearest `fmt` value, ties to even; +-inf on overflow."""
  if q == 0:
    return Fraction(0)
  p, _, emax = FORMATS[fmt]
  step = ulp(q, fmt)
  m = q / step
  n = math.floor(m)
  rest = m - n
  if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
    n += 1
  r = n * step
  largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
  if abs(r) > largest:
    return math.copysign(math.inf, q)
  return r


def ulps_off(result, exact: Fraction, fmt: str) -> float:
  if isinstance(result, float):  # overflowed
    return math.inf
  return float(abs(result - exact) / ulp(exact, fmt))


def fused(a, b, c, fmt):
  return round_to(a * b + c, fmt)


def unfused(a, b, c, fmt):
  product = round_to(a * b, fmt)
  return product if isinstance(product, float) else round_to(product + c, fmt)


def worked_example() -> dict:
  """a = 1 + 2^-23, b = 1 - 2^-23, c = -1 in float32: a*b = 1 - 2^-46 exactly."""
  a, b, c = 1 + Fraction(1, 2**23), 1 - Fraction(1, 2**23), Fraction(-1)
  return {"a": "1 + 2^-23", "b": "1 - 2^-23", "c": "-1", "exact": "-2^-46",
          "fused": float(fused(a, b, c, "float32")),
          "unfused": float(unfused(a, b, c, "float32")),
          "why": "round(a*b) = 1 loses the 2^-46, so the unfused sum is 0; the fused "
                 "result keeps it exactly"}


def _random_values(rng: np.random.Generator, n: int, fmt: str) -> list[Fraction]:
  """n random `fmt` values: random sign, log-uniform magnitude in [2^-8, 2^8]."""
  x = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-8, 8, n)
  dtype = {"float32": np.float32, "float16": np.float16}.get(fmt)
  if dtype is not None:
    return [Fraction(float(v)) for v in x.astype(dtype)]
  return [round_to(Fraction(float(v)), fmt) for v in x]


def fma_accuracy(fmt: str, n: int, seed: int = 0) -> dict:
  """Fused vs unfused over n random triples, each against the exact result."""
  rng = np.random.default_rng(seed)
  a, b, c = (_random_values(rng, n, fmt) for _ in range(3))
  # Half the triples get c close to -a*b: cancellation, where the two differ most.
  for i in range(0, n, 2):
    c[i] = round_to(-a[i] * b[i] * (1 + Fraction(int(rng.integers(-64, 64)), 2**20)),
                    fmt)
  differ, err_f, err_u = 0, [], []
  for x, y, z in zip(a, b, c):
    exact = x * y + z
    f, u = fused(x, y, z, fmt), unfused(x, y, z, fmt)
    differ += f != u
    err_f.append(ulps_off(f, exact, fmt))
    err_u.append(ulps_off(u, exact, fmt))
  return {"dtype": fmt, "triples": n, "differ_share": differ / n,
          "fused_max_ulps": max(err_f), "fused_mean_ulps": sum(err_f) / n,
          "unfused_max_ulps": max(err_u), "unfused_mean_ulps": sum(err_u) / n}


def dot(a: list[Fraction], b: list[Fraction], acc: str, out: str) -> Fraction:
  """Sequential dot product with products and sums rounded to `acc`, result to `out`."""
  s = Fraction(0)
  for x, y in zip(a, b):
    s = round_to(s + round_to(x * y, acc), acc)
    if isinstance(s, float):
      return s
  return round_to(s, out)


def dot_accuracy(fmt: str, length: int, n: int, seed: int = 0) -> dict:
  """n dot products of `length` random `fmt` inputs (length 4: a row of a 4x4 matrix
  product), accumulated in `fmt` vs in float32; errors in `fmt` ulps of the exact."""
  rng = np.random.default_rng(seed)
  # Magnitudes near 1, the range activations and weights live in.
  values = lambda: [round_to(Fraction(float(v)), fmt) for v in rng.uniform(-1, 1, length)]
  e16, e32 = [], []
  for _ in range(n):
    a, b = values(), values()
    exact = sum((x * y for x, y in zip(a, b)), Fraction(0))
    e16.append(ulps_off(dot(a, b, fmt, fmt), exact, fmt))
    e32.append(ulps_off(dot(a, b, "float32", fmt), exact, fmt))
  return {"dtype": fmt, "length": length, "dots": n,
          "acc16_mean_ulps": sum(e16) / n, "acc16_max_ulps": max(e16),
          "acc32_mean_ulps": sum(e32) / n, "acc32_max_ulps": max(e32)}
