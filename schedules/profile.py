"""The calibration profile: measured compute and communication times that the simulator
uses instead of a roofline. `kernels.calibrate` writes it, `sim.profile_cost` reads it.
Standard library only.

Units: seconds and bytes (alpha in s, beta in s/byte).

JSON format (all keys required unless marked optional):

    {
      "format": "clustersim-profile/1",
      "device": "cpu" | "cuda:NVIDIA H100 80GB HBM3",
      "source": "kernels.calibrate (...)",   # what produced it, how P2P was timed
      "versions": {"torch": "2.13.0", "python": "3.11.9", ...},
      "date": "2025-01-01 12:00 UTC",
      "threads": 1,                          # torch intra-op threads per rank process
      "model": {"hidden_size": 256, ...},    # the ModelSpec fields it was measured at
      "tp": 1,                               # optional; TP degree of the measured shard
      "compute": {                           # median seconds, one micro-batch
        "layer":     {"F": .., "B": .., "I": .., "W": ..},   # ONE transformer layer
        "embedding": {"F": .., "B": .., "I": .., "W": ..},   # first-stage extra
        "head":      {"F": .., "B": .., "I": .., "W": ..}    # last-stage extra: final
      },                                                     # norm, output layer, loss
      "p2p": {"alpha": s, "beta": s/byte, "points": [[bytes, s], ...]},
      "collectives": {                       # per op, per group size (a string key)
        "all_reduce": {"2": {"alpha": s, "beta": s/byte, "points": [[bytes, s], ...]}}
      },
      "notes": ["gloo reduce-scatter is an all-reduce underneath", ...],  # optional
      "optimizer_seconds_per_param": s,      # optional; fp32 Adam step, s per parameter
      "gemm": {                              # optional; measured GEMM times
        "dtype": "bf16",                     # the dtype they ran in (a ModelSpec dtype)
        "points": [[M, N, K, s], ...]        # (M x K) @ (K x N), median seconds of one
      },
      "attention": {                         # optional; scaled_dot_product_attention
        "dtype": "bf16", "causal": true,
        "points": [[batch, heads, kv_heads, seq, head_dim, forward s, backward s], ...]
      },
      "serving": {                           # optional; inference steps of ONE layer
        "dtype": "bf16",                     # (kernels.serving_steps), median seconds
        "prefill": [[tokens, s], ...],       # one prompt of `tokens`, empty cache
        "decode": [[batch, context, s], ...],  # `batch` sequences, one new token each
        "head": [[rows, s], ...]             # final norm, output layer, argmax of rows
      }
    }

Compute times of a pipeline stage of L layers are L * layer[kind], plus embedding[kind]
on the first stage and head[kind] on the last (sim.profile_cost). P2P and collective
times are alpha + beta * bytes, fitted by least squares to the measured points
(`fit_alpha_beta`); for collectives `bytes` is the per-rank buffer (nccl-tests' size).
`optimizer_seconds_per_param` (> 0) is the Adam step per parameter that kernels.calibrate
measured: sim.optimizer_cost prices an on-GPU OPT_STEP as its parameters times it; without it
(older profiles) OPT_STEP is priced from the topology's HBM bandwidth.
`gemm` (optional; `GemmTimes`) holds the median seconds of single GEMMs at the model's
GEMM shapes (schedules.layer_kernels) and a grid around them (kernels.microbench.
gemm_shapes); sim.gemm_table interpolates it for the roofline's GEMM kernels. `attention`
(optional; `AttentionTimes`) holds torch's scaled_dot_product_attention forward and
backward at the model's attention shapes (q: batch x heads x seq x head_dim; k, v with
kv_heads). `serving` (optional; `ServingTimes`) holds one layer's real prefill and decode
steps with a KV cache and the output layer's sampling step (sim.serving.calibration fits
the serving roofline's rates to them). Profiles without them stay valid. Their
dimensions are integers 1 to `schedules.limits.MAX_DIMENSION` (1e9), kv_heads divides heads, every time is finite,
> 0 and <= MAX_OP_SECONDS, no shape appears twice, and each has at least one point.

Limits on reading (`Profile.load`): a UTF-8 JSON file of at most MAX_PROFILE_BYTES
(16 MiB; calibrate writes tens of KiB) nested at most 64 deep (`clustersim.user_files`);
every time, alpha and beta finite, >= 0 and at most `schedules.limits.MAX_OP_SECONDS`
(1e6 s, 11.6 days: no single op or transfer takes longer, and larger values overflow the
totals to inf/NaN);
point sizes at most MAX_BYTES (1e15 bytes); collective group sizes ASCII digits, 1 to
MAX_GROUP_SIZE (1,048,576 ranks).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clustersim.user_files import is_finite_number, parse_json, read_text, short_repr

from .errors import ConfigError, require_positive_int
from .limits import MAX_DIMENSION, MAX_OP_SECONDS
from .model import DTYPE_BYTES
from .output_files import write_text_atomic

FORMAT = "clustersim-profile/1"
COMPUTE_PARTS = ("layer", "embedding", "head")
PROFILED_KINDS = ("F", "B", "I", "W")  # the keys of each compute part: OpKind values
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                  "all_to_all")
# ModelSpec fields a per-layer time depends on (num_layers does not: times are per layer).
SHAPE_FIELDS = ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "seq_length", "micro_batch_size", "dtype", "vocab_size", "swiglu",
                "add_bias_linear", "normalization", "use_flash_attn", "num_experts",
                "moe_router_topk")
MAX_PROFILE_BYTES = 16 * 1024 * 1024  # bytes read at most (module docstring)
MAX_BYTES = 1e15  # largest measured size (bytes) of a point
MAX_GROUP_SIZE = 1 << 20  # largest collective group size (ranks)


def fit_alpha_beta(points: Iterable[Sequence[float]], relative: bool = True
                   ) -> tuple[float, float]:
    """Least-squares line seconds = alpha + beta * bytes through (bytes, seconds) points.

    `relative` (default) minimises the squared *relative* error (weights 1/seconds^2), so
    a sweep from kilobytes to gigabytes fits its small sizes (alpha) as well as its large
    ones (beta); otherwise plain least squares. One distinct size gives alpha = 0 and
    beta = mean(seconds) / bytes (alpha = mean seconds at 0 bytes). Negative fits are
    clamped, so a time is never negative: beta < 0 gives beta = 0 and alpha = the
    (weighted) mean; alpha < 0 gives alpha = 0 and beta refitted through the origin.
    """
    pts = [(float(b), float(t)) for b, t in points]
    if not pts:
        raise ConfigError("fit_alpha_beta needs at least one (bytes, seconds) point")
    weighted = relative and all(t > 0 for _, t in pts)
    w = [1.0 / (t * t) if weighted else 1.0 for _, t in pts]
    sw = sum(w)
    sx = sum(wi * b for wi, (b, _) in zip(w, pts))
    st = sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx = sum(wi * b * b for wi, (b, _) in zip(w, pts))
    sxt = sum(wi * b * t for wi, (b, t) in zip(w, pts))
    det = sw * sxx - sx * sx
    if det <= 1e-12 * sw * sxx:  # one distinct size
        mean_b, mean_t = sx / sw, st / sw
        return (mean_t, 0.0) if mean_b == 0 else (0.0, mean_t / mean_b)
    beta = (sw * sxt - sx * st) / det
    alpha = (st - beta * sx) / sw
    if beta < 0:
        return max(st / sw, 0.0), 0.0
    if alpha < 0:
        return 0.0, max(sxt / sxx, 0.0)
    return alpha, beta


def _seconds(where: str, value: Any, positive: bool = False, unit: str = "seconds",
             limit: float = MAX_OP_SECONDS) -> float:
    """`value` as a float: a finite number >= 0 (> 0 if `positive`) and <= `limit`."""
    if not is_finite_number(value) or value < 0 or (positive and value == 0) \
            or value > limit:
        raise ConfigError(f"profile field {where} must be a finite number of {unit} "
                          f"{'> 0' if positive else '>= 0'} and <= {limit:g}, got "
                          f"{short_repr(value)}")
    return float(value)


def _group_size(where: str, key: Any) -> int:
    """A collective's group size key: ASCII digits, 1..MAX_GROUP_SIZE."""
    text = str(key)
    digits = len(str(MAX_GROUP_SIZE))
    if not (text.isascii() and text.isdigit()) or len(text) > digits \
            or not 1 <= int(text) <= MAX_GROUP_SIZE:
        raise ConfigError(f"profile field {where}: group size {short_repr(key)} must be an "
                          f"integer 1..{MAX_GROUP_SIZE} in ASCII digits")
    return int(text)


def _mapping(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"profile field {where} must be an object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class AlphaBeta:
    """time = alpha + beta * nbytes, with the (bytes, seconds) points it was fitted to."""

    alpha: float
    beta: float
    points: tuple[tuple[int, float], ...] = ()

    @staticmethod
    def fit(points: Iterable[Sequence[float]]) -> AlphaBeta:
        pts = tuple((int(b), float(t)) for b, t in points)
        return AlphaBeta(*fit_alpha_beta(pts), pts)

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "beta": self.beta, "points": [list(p) for p in self.points]}

    @staticmethod
    def from_dict(where: str, d: Any) -> AlphaBeta:
        d = _mapping(where, d)
        for key in ("alpha", "beta"):
            if key not in d:
                raise ConfigError(f"profile field {where}.{key} is missing")
        points = d.get("points", [])
        if not isinstance(points, list) or any(
                not isinstance(p, (list, tuple)) or len(p) != 2 for p in points):
            raise ConfigError(f"profile field {where}.points must be a list of "
                              "[bytes, seconds] pairs")
        pts = tuple((int(_seconds(f"{where}.points[{i}] bytes", b, unit="bytes",
                                  limit=MAX_BYTES)),
                     _seconds(f"{where}.points[{i}] seconds", t))
                    for i, (b, t) in enumerate(points))
        return AlphaBeta(_seconds(f"{where}.alpha", d["alpha"]),
                         _seconds(f"{where}.beta", d["beta"], unit="s/byte"), pts)


def _dim(where: str, value: Any) -> int:
    """A shape dimension: an int (not a bool) 1..MAX_DIMENSION."""
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 1 <= value <= MAX_DIMENSION:
        raise ConfigError(f"profile field {where} must be an integer 1..{MAX_DIMENSION}, "
                          f"got {short_repr(value)}")
    return value


def _dtype(where: str, value: Any) -> str:
    if value not in DTYPE_BYTES:
        raise ConfigError(f"profile field {where} must be one of "
                          f"{', '.join(DTYPE_BYTES)}, got {short_repr(value)}")
    return value


def _rows(where: str, rows: Any, names: Sequence[str], dims: int) -> tuple[tuple, ...]:
    """`rows`: a non-empty list of lists of len(names) values, the first `dims` of them
    dimensions (_dim), the rest seconds > 0; no two rows with the same dimensions."""
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ConfigError(f"profile field {where} must be a non-empty list of "
                          f"[{', '.join(names)}] rows")
    out, seen = [], {}
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != len(names):
            raise ConfigError(f"profile field {where}[{i}] must be a list "
                              f"[{', '.join(names)}], got {short_repr(row)}")
        shape = tuple(_dim(f"{where}[{i}] {n}", v) for n, v in zip(names[:dims], row))
        times = tuple(_seconds(f"{where}[{i}] {n}", v, positive=True)
                      for n, v in zip(names[dims:], row[dims:]))
        if shape in seen:
            raise ConfigError(f"profile field {where}[{i}]: shape {list(shape)} appears "
                              f"twice (also {where}[{seen[shape]}]); give each shape once")
        seen[shape] = i
        out.append(shape + times)
    return tuple(out)


GEMM_COLUMNS = ("M", "N", "K", "seconds")
SERVING_COLUMNS = {"prefill": ("tokens", "seconds"),
                   "decode": ("batch", "context", "seconds"),
                   "head": ("rows", "seconds")}
ATTENTION_COLUMNS = ("batch", "heads", "kv_heads", "seq", "head_dim", "forward seconds",
                     "backward seconds")


@dataclass(frozen=True)
class GemmTimes:
    """Median seconds of one (M x K) @ (K x N) GEMM in `dtype`, per shape:
    `points` = ((M, N, K, seconds), ...). Validated on construction (module docstring)."""

    dtype: str
    points: tuple[tuple[int, int, int, float], ...]

    def __post_init__(self) -> None:
        _dtype("gemm.dtype", self.dtype)
        object.__setattr__(self, "points", _rows("gemm.points", self.points, GEMM_COLUMNS, 3))

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "points": [list(p) for p in self.points]}

    @staticmethod
    def from_dict(d: Any) -> GemmTimes:
        d = _mapping("gemm", d)
        for key in ("dtype", "points"):
            if key not in d:
                raise ConfigError(f"profile field gemm.{key} is missing")
        return GemmTimes(d["dtype"], d["points"])


@dataclass(frozen=True)
class AttentionTimes:
    """Median seconds of torch's scaled_dot_product_attention (causal if `causal`) in
    `dtype`, forward and backward, per shape: `points` = ((batch, heads, kv_heads, seq,
    head_dim, forward, backward), ...); q is batch x heads x seq x head_dim, k and v have
    kv_heads (grouped-query attention when fewer)."""

    dtype: str
    causal: bool
    points: tuple[tuple[int, int, int, int, int, float, float], ...]

    def __post_init__(self) -> None:
        _dtype("attention.dtype", self.dtype)
        if not isinstance(self.causal, bool):
            raise ConfigError(f"profile field attention.causal must be true or false, got "
                              f"{short_repr(self.causal)}")
        rows = _rows("attention.points", self.points, ATTENTION_COLUMNS, 5)
        for i, row in enumerate(rows):
            if row[1] % row[2]:
                raise ConfigError(f"profile field attention.points[{i}]: kv_heads={row[2]} "
                                  f"must divide heads={row[1]}")
        object.__setattr__(self, "points", rows)

    def seconds(self, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int
                ) -> tuple[float, float] | None:
        """(forward, backward) seconds measured at exactly this shape, or None."""
        for row in self.points:
            if row[:5] == (batch, heads, kv_heads, seq, head_dim):
                return row[5], row[6]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "causal": self.causal,
                "points": [list(p) for p in self.points]}

    @staticmethod
    def from_dict(d: Any) -> AttentionTimes:
        d = _mapping("attention", d)
        for key in ("dtype", "causal", "points"):
            if key not in d:
                raise ConfigError(f"profile field attention.{key} is missing")
        return AttentionTimes(d["dtype"], d["causal"], d["points"])


@dataclass(frozen=True)
class ServingTimes:
    """Median seconds of one layer's inference steps in `dtype` (kernels.serving_steps):
    `prefill` ((tokens, s), ...) of one prompt; `decode` ((batch, context, s), ...) of
    `batch` sequences making one token each after `context` cached; `head` ((rows, s), ...)
    of the output layer sampling `rows` tokens."""

    dtype: str
    prefill: tuple[tuple[int, float], ...]
    decode: tuple[tuple[int, int, float], ...]
    head: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        _dtype("serving.dtype", self.dtype)
        for name, columns in SERVING_COLUMNS.items():
            object.__setattr__(self, name, _rows(f"serving.{name}", getattr(self, name),
                                                 columns, len(columns) - 1))

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype,
                **{name: [list(p) for p in getattr(self, name)] for name in SERVING_COLUMNS}}

    @staticmethod
    def from_dict(d: Any) -> ServingTimes:
        d = _mapping("serving", d)
        for key in ("dtype", *SERVING_COLUMNS):
            if key not in d:
                raise ConfigError(f"profile field serving.{key} is missing")
        return ServingTimes(d["dtype"], d["prefill"], d["decode"], d["head"])


@dataclass(frozen=True)
class Profile:
    """A calibration profile (see the module docstring for the JSON it reads and writes)."""

    device: str
    compute: Mapping[str, Mapping[str, float]]
    p2p: AlphaBeta
    collectives: Mapping[str, Mapping[int, AlphaBeta]] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    date: str = ""
    threads: int = 1
    tp: int = 1
    notes: tuple[str, ...] = ()
    optimizer_seconds_per_param: float | None = None  # s per parameter; None: not measured
    gemm: GemmTimes | None = None  # measured GEMM times; None: not measured
    attention: AttentionTimes | None = None  # measured attention times; None: not measured
    serving: ServingTimes | None = None  # measured inference steps; None: not measured

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise ConfigError(f"profile field device must be a non-empty string, "
                              f"got {self.device!r}")
        for part in COMPUTE_PARTS:
            if part not in self.compute:
                raise ConfigError(f"profile field compute.{part} is missing")
            table = _mapping(f"compute.{part}", self.compute[part])
            for kind in PROFILED_KINDS:
                if kind not in table:
                    raise ConfigError(f"profile field compute.{part}.{kind} is missing")
                _seconds(f"compute.{part}.{kind}", table[kind])
        for op, sizes in self.collectives.items():
            if op not in COLLECTIVE_OPS:
                raise ConfigError(f"profile field collectives.{op}: unknown collective; "
                                  f"use {', '.join(COLLECTIVE_OPS)}")
        for name in ("threads", "tp"):
            require_positive_int(f"profile field {name}", getattr(self, name))
        if self.optimizer_seconds_per_param is not None:
            _seconds("optimizer_seconds_per_param", self.optimizer_seconds_per_param, True)
        for name, kind in (("gemm", GemmTimes), ("attention", AttentionTimes),
                           ("serving", ServingTimes)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"profile field {name} must be a {kind.__name__}, got "
                                  f"{type(value).__name__}")

    def compute_time(self, part: str, kind: str) -> float:
        return float(self.compute[part][kind])

    def collective(self, op: str, group_size: int) -> AlphaBeta:
        """The fit for `op` ('all_reduce', ...) over `group_size` ranks."""
        if op not in self.collectives:
            raise ConfigError(f"the profile has no {op} measurements (it has "
                              f"{', '.join(self.collectives) or 'no collectives'}); "
                              "recalibrate with that collective")
        sizes = self.collectives[op]
        if group_size not in sizes:
            raise ConfigError(f"the profile has {op} for group sizes "
                              f"{', '.join(map(str, sorted(sizes)))}, not {group_size}; "
                              "recalibrate with that many ranks")
        return sizes[group_size]

    # --- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "device": self.device, "source": self.source,
            "versions": dict(self.versions), "date": self.date, "threads": self.threads,
            "model": dict(self.model), "tp": self.tp,
            "compute": {p: {k: float(self.compute[p][k]) for k in PROFILED_KINDS}
                        for p in COMPUTE_PARTS},
            "p2p": self.p2p.to_dict(),
            "collectives": {op: {str(n): ab.to_dict() for n, ab in sorted(sizes.items())}
                            for op, sizes in self.collectives.items()},
            "notes": list(self.notes),
            **({} if self.optimizer_seconds_per_param is None else
               {"optimizer_seconds_per_param": float(self.optimizer_seconds_per_param)}),
            **({} if self.gemm is None else {"gemm": self.gemm.to_dict()}),
            **({} if self.attention is None else {"attention": self.attention.to_dict()}),
            **({} if self.serving is None else {"serving": self.serving.to_dict()}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @staticmethod
    def from_dict(d: Any) -> Profile:
        d = _mapping("(top level)", d)
        fmt = d.get("format", FORMAT)
        if fmt != FORMAT:
            raise ConfigError(f"profile field format is {fmt!r}; this clustersim reads {FORMAT!r}")
        for key in ("device", "compute", "p2p"):
            if key not in d:
                raise ConfigError(f"profile field {key} is missing")
        compute = _mapping("compute", d["compute"])
        collectives: dict[str, dict[int, AlphaBeta]] = {}
        for op, sizes in _mapping("collectives", d.get("collectives", {})).items():
            collectives[op] = {}
            for n, fit in _mapping(f"collectives.{op}", sizes).items():
                size = _group_size(f"collectives.{op}", n)
                collectives[op][size] = AlphaBeta.from_dict(f"collectives.{op}.{n}", fit)
        notes = d.get("notes", [])
        if not isinstance(notes, list):
            raise ConfigError("profile field notes must be a list of strings")
        return Profile(
            device=d["device"], source=str(d.get("source", "")),
            versions=dict(_mapping("versions", d.get("versions", {}))),
            date=str(d.get("date", "")), threads=d.get("threads", 1),
            model=dict(_mapping("model", d.get("model", {}))), tp=d.get("tp", 1),
            compute={p: dict(_mapping(f"compute.{p}", v)) for p, v in compute.items()},
            p2p=AlphaBeta.from_dict("p2p", d["p2p"]), collectives=collectives,
            notes=tuple(str(n) for n in notes),
            optimizer_seconds_per_param=d.get("optimizer_seconds_per_param"),
            gemm=None if d.get("gemm") is None else GemmTimes.from_dict(d["gemm"]),
            attention=(None if d.get("attention") is None
                       else AttentionTimes.from_dict(d["attention"])),
            serving=(None if d.get("serving") is None
                     else ServingTimes.from_dict(d["serving"])))

    @staticmethod
    def from_json(text: str, source: str = "profile") -> Profile:
        """The profile of JSON `text`; errors are one ConfigError line naming `source`."""
        return Profile.from_dict(parse_json(text, source, ConfigError))

    @staticmethod
    def load(path: str | Path) -> Profile:
        """The profile in file `path` (limits: module docstring); every error is one
        ConfigError line naming the file, the field and the rule."""
        source = f"profile {path}"
        data = parse_json(read_text(path, source, ConfigError, MAX_PROFILE_BYTES), source,
                          ConfigError)
        try:
            return Profile.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    def save(self, path: str | Path) -> None:
        """Write the JSON file atomically (schedules.output_files)."""
        write_text_atomic(path, self.to_json() + "\n")


def model_shape(model: Any) -> dict[str, Any]:
    """The ModelSpec fields a profile records (all of them, for the record)."""
    return asdict(model)


def shape_mismatch(profile: Profile, model: Any) -> str | None:
    """The first SHAPE_FIELDS field where `model` differs from the profile's, described,
    or None when the profile applies to `model`. A field the profile does not record (a
    hand-written profile) is not checked."""
    measured = profile.model
    for name in SHAPE_FIELDS:
        if name not in measured:
            continue  # an older/hand-written profile without it: trust the user
        if measured[name] != getattr(model, name):
            return (f"{name}: the profile was measured at {measured[name]!r}, the model has "
                    f"{getattr(model, name)!r}")
    return None
