"""Human-readable seconds and bytes for hover text and terminal output."""


def format_seconds(t: float) -> str:
    a = abs(t)
    if a >= 1 or a == 0:
        return f"{t:.4g} s"
    if a >= 1e-3:
        return f"{t * 1e3:.4g} ms"
    if a >= 1e-6:
        return f"{t * 1e6:.4g} µs"
    return f"{t * 1e9:.4g} ns"


def format_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
