"""Numbers written the way a reader reads them, never in scientific notation:
107.7k tok/s, 31.6 ms, 8.56 s, 7.5 GiB, 1.085×, 43.5%, and a mean with its spread written to the
same decimal place: "261.5 ± 3.1", "74.648k ± 0.076k", or "336.6 (n=1)" for one sample. The tables
(analysis/matrix_table.py, the summarize and hw5 commands) and the plots' labels and ticks
(analysis/plots.py) use these. A missing or non-finite value is "-"."""

from __future__ import annotations

import math
from typing import Optional

MISSING = "-"
_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def sig(x: float, digits: int = 3) -> str:
    """Fixed point with `digits` significant digits: 8.56, 0.00123, 137 (never 1.37e+02)."""
    if not finite(x):
        return MISSING
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def count(x: float, digits: int = 1, trim: bool = False) -> str:
    """107667 -> "107.7k", 1234567 -> "1.2M", 950 -> "950", 999960 -> "1.0M". trim drops a
    trailing ".0" (axis ticks: "100k")."""
    if not finite(x):
        return MISSING
    for div, suffix in _SUFFIXES:
        if round(abs(x) / div, digits) >= 1:
            text = f"{x / div:.{digits}f}"
            if trim and "." in text:
                text = text.rstrip("0").rstrip(".")
            return text + suffix
    return f"{x:.0f}" if abs(x) >= 10 or float(x).is_integer() else sig(x)


def _decimals(x: float, digits: int) -> int:
    """Decimal places that show `digits` significant digits of x (x != 0), at least 0."""
    return max(0, digits - 1 - math.floor(math.log10(abs(x))))


def pm_parts(mean: float, spread: Optional[float], n: Optional[int] = None, suffix: bool = True,
             value_digits: int = 4, spread_digits: int = 2, max_digits: int = 6):
    """A mean and its spread (a standard deviation) as two strings written to the same decimal
    place, which the spread's `spread_digits` significant digits decide (the mean shows at most
    `max_digits`): (261.53, 3.14) -> ("261.5", "3.1"), (1500, 300) -> ("1.50k", "0.30k"),
    (74648.3, 75.8) -> ("74.648k", "0.076k"). With `suffix`, a mean of 1000 or more is written in
    k, M, G or T, and its spread in the same unit. A spread of 0 over several samples is written
    at the mean's `value_digits` significant digits ("336.6", "0.0"). The spread is None when
    there is none to show: one sample (n <= 1) or a missing spread; the mean then has
    `value_digits` significant digits. A missing mean is ("-", None)."""
    if not finite(mean):
        return MISSING, None
    div, unit = 1.0, ""
    if suffix:
        for d, u in _SUFFIXES:
            if abs(mean) >= d:
                div, unit = d, u
                break
    m = mean / div
    if (n is not None and n <= 1) or not finite(spread):
        return (f"{m:.{_decimals(m, value_digits)}f}" if m else "0") + unit, None
    s = abs(spread) / div
    if s == 0:
        decimals = _decimals(m, value_digits) if m else 0
    else:
        decimals = _decimals(s, spread_digits)
        if m:
            decimals = min(decimals, _decimals(m, max_digits))
    return f"{m:.{decimals}f}{unit}", f"{s:.{decimals}f}{unit}"


def mean_pm(mean: float, spread: Optional[float], n: Optional[int] = None,
            suffix: bool = True) -> str:
    """"261.5 ± 3.1", "1.50k ± 0.30k", "8.5598 ± 0.0087" (pm_parts decides the digits); one
    sample: "336.6 (n=1)"; no spread: the mean alone; no mean: "-"."""
    value, spread_text = pm_parts(mean, spread, n, suffix)
    if spread_text is not None:
        return f"{value} ± {spread_text}"
    return f"{value} (n=1)" if n == 1 and value != MISSING else value


def tok_s(x: float) -> str:
    """Tokens per second: "535.0k tok/s"."""
    return MISSING if not finite(x) else count(x) + " tok/s"


def ms(seconds: float) -> str:
    """A duration given in seconds, written in milliseconds: "31.6 ms", "0.35 ms"; below 0.1 ms in
    microseconds: "4 µs"."""
    if not finite(seconds):
        return MISSING
    v = seconds * 1e3
    if abs(v) >= 1:
        return f"{v:.1f} ms"
    if abs(v) >= 0.1:
        return f"{v:.2f} ms"
    return f"{v * 1e3:.0f} µs"


def seconds(x: float) -> str:
    """A duration in seconds with 3 significant digits: "8.56 s", "137 s", "0.0412 s"."""
    return MISSING if not finite(x) else sig(x) + " s"


def gib(nbytes: float) -> str:
    """Bytes as "7.5 GiB"; below 0.1 GiB as "35 MiB"; 0 or missing as "-"."""
    if not finite(nbytes) or nbytes <= 0:
        return MISSING
    if nbytes >= 0.1 * 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / 2**20:.0f} MiB"


def ratio(x: Optional[float], digits: int = 3) -> str:
    """A ratio or speed-up: "1.085×"."""
    return MISSING if not finite(x) else f"{x:.{digits}f}×"


def percent(fraction: Optional[float], digits: int = 1) -> str:
    """A fraction as a percentage: 0.435 -> "43.5%"."""
    return MISSING if not finite(fraction) else f"{100 * fraction:.{digits}f}%"
