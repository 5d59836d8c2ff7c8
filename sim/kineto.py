"""A PyTorch profiler (Kineto) trace read as a measured Timeline, which `compare` holds
against a simulation. Units: Kineto's `ts` and `dur` are microseconds after
`baseTimeNanoseconds` (ns); spans are seconds from the first kept event of all files read;
bytes are a collective's element count times its dtype's size.

Fields read (pytorch/kineto libkineto/src/output_json.cpp and ActivityType.cpp, as
torch.profiler's export_chrome_trace writes them): top level `traceEvents`,
`baseTimeNanoseconds`, `distributedInfo.rank`; complete events (`ph: "X"`) with `cat`,
`name`, `pid`, `tid`, `ts`, `dur` and `args`: `External id` (links a GPU kernel to the
CPU op that launched it), `stream`, and on NCCL kernels the collective's record
(`Collective name`, `In msg nelems`, `Out msg nelems`, `dtype`).

Mapping (the counts of each rule and of what was dropped go to meta['kineto']):
- A trace with GPU activity (cat `kernel`, `gpu_memcpy`, `gpu_memset`) is read from its
  GPU events. NCCL kernels (`ncclDevKernel_<Coll>_...`, `ncclKernel_<Coll>_...`) are the
  collective <Coll> (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll) on
  lane `comm:<stream>`; SendRecv kernels are read by their `Collective name` (send ->
  SEND_F, recv -> RECV_F, all_to_all -> ALL_TO_ALL: a transfer's direction in the pipeline
  is unknown) and dropped without one. Other kernels are compute on lane `compute`: B when
  the CPU op that launched them runs inside an autograd `autograd::engine::evaluate_function`
  event of its thread, OPT_STEP inside `Optimizer.step`, F otherwise. Memcpy DtoH / HtoD
  are COPY_D2H / COPY_H2D on lane `pcie`; memsets, other copies and CPU events are dropped.
- A trace without GPU activity (torch on CPU) is read from its CPU events: the outermost
  `cpu_op` of each thread is compute (B, OPT_STEP and F as above), but `c10d::` ops, which
  only post a collective, are dropped; `gloo:<collective>` annotations are the collective
  on lane `comm:<tid>`.
One span per kernel or CPU op: compare's per-kind means are then per kernel, not per
pipeline op; iteration time, bubble and exposed communication compare as they are. A
span's stage is its file's rank (distributedInfo.rank, else its place in the list of
files); microbatches are unknown (None).
"""
from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.names import COMPUTE_LANE, PCIE_LANE, PP
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import Span, Timeline
from clustersim.user_files import is_finite_number, parse_json, read_text, short_repr

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8,
               "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1,
               "Float8_e5m2": 1, "ComplexFloat": 8}  # torch dtype names, bytes per element
# first match of a collective's name, lower case without underscores (longest words first)
_COLLECTIVE_WORDS = (("reducescatter", OpKind.REDUCE_SCATTER), ("allreduce", OpKind.ALL_REDUCE),
                     ("allgather", OpKind.ALL_GATHER), ("alltoall", OpKind.ALL_TO_ALL),
                     ("broadcast", OpKind.BROADCAST), ("reduce", OpKind.REDUCE),
                     ("send", OpKind.SEND_F), ("recv", OpKind.RECV_F))
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_NCCL_P2P = {"sendrecv", "send", "recv"}
_COPIES = {"DtoH": OpKind.COPY_D2H, "HtoD": OpKind.COPY_H2D}
_REGIONS = (("autograd::engine::evaluate_function", OpKind.B),
            ("Optimizer.step", OpKind.OPT_STEP))


def collective_kind(label: str) -> OpKind | None:
    """The op kind a collective's name says ('AllReduce', 'allreduce', '_allgather_base',
    'all_to_allv', 'send'), or None (a barrier, a batched send-and-receive)."""
    key = label.lower().replace("_", "")
    return next((kind for word, kind in _COLLECTIVE_WORDS if key.startswith(word)), None)


def is_kineto_trace(path: str | Path, sniff_bytes: int = 1 << 20) -> bool:
    """Whether file `path` looks like a Chrome/Kineto trace rather than a Timeline JSON: its
    first `sniff_bytes` hold a "traceEvents" key before any "spans" key (False when it
    cannot be read: the Timeline reader then names the problem)."""
    try:
        with open(path, "rb") as f:
            head = f.read(sniff_bytes).decode("utf-8", "ignore")
    except (OSError, ValueError):
        return False
    events, spans = (re.search(rf'"{key}"\s*:', head) for key in ("traceEvents", "spans"))
    return events is not None and (spans is None or events.start() < spans.start())


def read_kineto(paths: str | Path | Sequence[str | Path]) -> Timeline:
    """The measured Timeline of one Kineto trace file, or of one file per rank (module
    docstring); ConfigError naming the file, the field and the rule for bad input."""
    files = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not files:
        raise ConfigError("read_kineto: no files; rule: give one trace file per rank")
    traces = [_load(Path(p), i) for i, p in enumerate(files)]
    ranks = Counter(t["rank"] for t in traces)
    clash = [r for r, n in ranks.items() if n > 1]
    if clash:
        raise ConfigError(f"Kineto traces {', '.join(map(str, files))}: rank {clash[0]} "
                          "appears twice; rule: one trace file per rank")
    base = min(t["base_ns"] for t in traces)
    events, mapped, dropped = [], Counter(), Counter()
    for trace in traces:
        shift_us = (trace["base_ns"] - base) / 1000
        for event, kind, lane, nbytes, rule in _classify(trace, dropped):
            events.append((trace["rank"], shift_us + event["ts"], event["dur"], kind, lane,
                           nbytes))
            mapped[rule] += 1
    origin = min(e[1] for e in events)
    spans = [Span(rank, lane, Op(kind, rank, None, PP if kind.is_p2p else None, nbytes),
                  (start - origin) / 1e6, (start - origin + dur) / 1e6)
             for rank, start, dur, kind, lane, nbytes in sorted(events, key=lambda e: e[1])]
    gpu = any(t["gpu"] for t in traces)
    meta = {"kineto": {"files": [str(p) for p in files],
                       "ranks": {str(p): t["rank"] for p, t in zip(files, traces)},
                       "read_from": "GPU kernels" if gpu else "CPU ops",
                       "mapped": dict(mapped), "dropped": dict(dropped),
                       "granularity": "one span per kernel or outermost CPU op; stage = rank"}}
    return Timeline(spans, source=f"kineto:{'cuda' if gpu else 'cpu'}", meta=meta)


def _load(path: Path, index: int) -> dict[str, Any]:
    """The checked events of one file, its rank, clock base (ns) and whether it has GPU
    activity; ConfigError naming the file and the rule otherwise."""
    source = f"Kineto trace {path}"
    data = parse_json(read_text(path, source, ConfigError), source, ConfigError)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"{source}: traceEvents: missing; rule: a PyTorch profiler trace "
                          "(torch.profiler export_chrome_trace) holds a traceEvents list")
    complete = [_checked(source, i, e) for i, e in enumerate(events)
                if isinstance(e, dict) and e.get("ph") == "X"]
    meta = data if isinstance(data, dict) else {}
    info = meta.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    rank = int(rank) if isinstance(rank, (int, str)) and str(rank).isdigit() else index
    base = meta.get("baseTimeNanoseconds", 0)
    return {"source": source, "events": complete, "rank": rank,
            "base_ns": int(base) if is_finite_number(base) else 0,
            "gpu": any(e["cat"] in GPU_CATEGORIES for e in complete)}


def _checked(source: str, index: int, event: dict[str, Any]) -> dict[str, Any]:
    where = f"{source}: traceEvents[{index}]"
    for key, rule in (("ts", "a finite number of microseconds"),
                      ("dur", "a finite number of microseconds >= 0")):
        value = event.get(key)
        if not is_finite_number(value) or (key == "dur" and value < 0):
            raise ConfigError(f"{where}.{key}: must be {rule}, got {short_repr(value)}; "
                              "rule: a complete event ('ph': 'X') has ts and dur")
    for key in ("name", "cat"):
        if not isinstance(event.get(key, ""), str):
            raise ConfigError(f"{where}.{key}: must be a string, got "
                              f"{short_repr(event[key])}")
    args = event.get("args", {})
    if not isinstance(args, dict):
        raise ConfigError(f"{where}.args: must be an object, got {short_repr(args)}")
    return {**event, "name": event.get("name", ""), "cat": event.get("cat", ""),
            "args": args, "thread": (str(event.get("pid")), str(event.get("tid")))}


def _classify(trace: dict[str, Any], dropped: Counter) -> list[tuple]:
    """(event, kind, lane, bytes, rule) of every event the trace's spans come from."""
    events = trace["events"]
    regions = _Regions(events)
    out = []
    if trace["gpu"]:
        launched = {e["args"].get("External id"): regions.kind(e) for e in events
                    if e["cat"] == "cpu_op" and "External id" in e["args"]}
        for e in events:
            mapped = _gpu_event(e, launched)
            if mapped is None:
                dropped[_drop_reason(e)] += 1
            else:
                out.append((e, *mapped))
    else:
        cpu_ops = [e for e in events if e["cat"] == "cpu_op"]
        outermost = _outermost(cpu_ops)
        dropped["cpu_op inside another cpu_op (its time counted there)"] += \
            len(cpu_ops) - len(outermost)
        for e in outermost:
            if e["name"].startswith("c10d::"):
                dropped["cpu_op c10d:: (posts a collective)"] += 1
            else:
                kind = regions.kind(e)
                out.append((e, kind, COMPUTE_LANE, 0, f"cpu_op -> {kind.value}"))
        for e in events:
            kind = collective_kind(e["name"][5:]) if e["name"].startswith("gloo:") else None
            if e["cat"] == "user_annotation" and kind is not None:
                out.append((e, kind, f"comm:{e['thread'][1]}", 0,
                            f"{e['name']} -> {kind.value}"))
            elif e["cat"] != "cpu_op":
                dropped[f"{e['cat'] or 'no category'} (not a collective)"] += 1
    if not out:
        raise ConfigError(f"{trace['source']}: no GPU kernels and no CPU ops; rule: a "
                          "torch.profiler trace of a training step")
    return out


def _gpu_event(e: dict[str, Any], launched: dict) -> tuple | None:
    """(kind, lane, bytes, rule) of a GPU event, or None when it is dropped."""
    name, args = e["name"], e["args"]
    if e["cat"] == "gpu_memcpy":
        word = next((word for word in _COPIES if word in name), None)
        if word is None:
            return None
        return _COPIES[word], PCIE_LANE, 0, f"gpu_memcpy {word} -> {_COPIES[word].value}"
    if e["cat"] != "kernel":
        return None
    nccl = _NCCL_KERNEL.match(name)
    if nccl is None:
        kind = launched.get(args.get("External id"), OpKind.F)
        return kind, COMPUTE_LANE, 0, f"kernel -> {kind.value}"
    word = nccl.group(1)
    label = args.get("Collective name", "") if word.lower() in _NCCL_P2P else word
    kind = collective_kind(str(label))
    if kind is None:
        return None
    return (kind, f"comm:{args.get('stream', '?')}", _message_bytes(args),
            f"nccl {word} -> {kind.value}")


def _message_bytes(args: dict[str, Any]) -> int:
    """Bytes of a collective's larger buffer (its input for a reduce-scatter, its output
    for an all-gather: nccl-tests' size), 0 when Kineto did not record them."""
    sizes = [args.get("In msg nelems"), args.get("Out msg nelems")]
    counts = [int(n) for n in sizes if is_finite_number(n) and n >= 0]
    return max(counts, default=0) * DTYPE_BYTES.get(str(args.get("dtype")).strip('"'), 0)


def _drop_reason(e: dict[str, Any]) -> str:
    if e["cat"] == "kernel":  # an NCCL kernel whose collective is not named or known
        return f"kernel {e['name'].split('(')[0]} (collective not named)"
    return e["cat"] or "no category"


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of each thread that no other event of that thread holds."""
    out, ends = [], {}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= ends.get(e["thread"], float("-inf")):
            out.append(e)
            ends[e["thread"]] = e["ts"] + e["dur"]
    return out


class _Regions:
    """Per thread, the time ranges of autograd's backward functions and of optimizer
    steps (_REGIONS), merged; `kind` of a CPU event is that of the range holding it."""

    def __init__(self, events: list[dict[str, Any]]):
        spans: dict[tuple, list] = defaultdict(list)
        for e in events:
            for prefix, kind in _REGIONS:
                if e["name"].startswith(prefix):
                    spans[(e["thread"], kind)].append((e["ts"], e["ts"] + e["dur"]))
        self.merged: dict[tuple, tuple[list, list]] = {}
        for key, ranges in spans.items():
            starts, ends = [], []
            for start, end in sorted(ranges):
                if ends and start <= ends[-1]:
                    ends[-1] = max(ends[-1], end)
                else:
                    starts.append(start)
                    ends.append(end)
            self.merged[key] = (starts, ends)

    def kind(self, e: dict[str, Any]) -> OpKind:
        for _, kind in _REGIONS:
            starts, ends = self.merged.get((e["thread"], kind), ([], []))
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i >= 0 and e["ts"] + e["dur"] <= ends[i]:
                return kind
        return OpKind.F
