"""The fidelity benchmark's results page (markdown) from its JSON, and the simulator's
version stamp. Units as in benchmarks/fidelity.py: seconds, TFLOP/s per GPU, GB = 1e9 B."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import clustersim

SOURCE_DIRS = ("sim", "schedules", "topologies")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def simulator_version() -> dict:
    """Commit, uncommitted changes and a digest of the simulator's source (sim, schedules,
    topologies) as imported, so a page says exactly which code produced it."""
    root = Path(clustersim.__file__).resolve().parent
    digest = hashlib.sha256()
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".json"):
                digest.update(path.relative_to(root).as_posix().encode())
                digest.update(path.read_bytes())
    status = _git(root, "status", "--porcelain", "--", *SOURCE_DIRS)
    return {"root": str(root), "commit": _git(root, "rev-parse", "--short", "HEAD"),
            "changed_files": status.splitlines() if status else [],
            "source_sha256": digest.hexdigest()[:16],
            "note": os.environ.get("FIDELITY_SOURCE_NOTE", "")}


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "–"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "–" if x is None else format(x, fmt)


def _layout(r: dict) -> str:
    extra = f", V={r['vpp']}" if r["vpp"] > 1 else ""
    return f"{r['tp']}/{r['pp']}/{r['dp']}{extra}"


def _recompute(r: dict) -> str:
    return r["recompute"] + (" + SP" if r["sequence_parallel"] else "")


def row_table(rows: list[dict]) -> list[str]:
    lines = ["| source | model | GPUs | t/p/d | M x b | recompute | DDP | formula | "
             "published TFLOP/s | predicted TFLOP/s | error | published s | predicted s | "
             "time error | compute idle | peak mem GB | sim wall s |",
             "|---|---|---:|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ok = r["status"] == "ok"
        head = (f"| {r['source']} | {r['label']} | {r['gpus']} | {_layout(r)} | "
                f"{r['microbatches']} x {r['micro_batch_size']} | {_recompute(r)} | {r['ddp']} | ")
        if not ok:
            lines.append(head + f"{r['status'].upper()}: {r.get('reason', '')} | "
                         f"{_num(r['published_tflops'])} | – | – | "
                         f"{_num(r['published_iteration_s'], '.2f')} | – | – | – | – | "
                         f"{r['wall_s']:.1f} |")
            continue
        oom = " (OOM)" if r["oom_ranks"] else ""
        lines.append(head + f"{r['formula']} | {_num(r['published_tflops'])} | "
                     f"{r['tflops_per_gpu']:.1f} | **{_pct(r['error'])}** | "
                     f"{_num(r['published_iteration_s'], '.2f')} | {r['iteration_time_s']:.2f} | "
                     f"{_pct(r.get('time_error'))} | {_pct(r['compute_idle_fraction'], False)} | "
                     f"{r['peak_memory_gb']:.1f}{oom} | {r['wall_s']:.1f} |")
    return lines


def breakdown_table(rows: list[dict]) -> list[str]:
    """Where the simulated time goes, per row (mean share over pipeline ranks)."""
    done = [r for r in rows if r["status"] == "ok" and r.get("breakdown")]
    if not done:
        return []
    cats = [c for c in ("compute", "tp", "cp", "ep", "pp", "dp", "other", "bubble")
            if any(r["breakdown"].get(c, 0) > 0 for r in done)]
    lines = ["## Where the simulated time goes", "",
             "Share of the iteration per category, mean over the pipeline ranks "
             "(`Timeline.time_breakdown`: communication counts only where compute is idle).",
             "", "| source | model | recompute | " + " | ".join(cats) + " |",
             "|---|---|---|" + "---:|" * len(cats)]
    for r in done:
        lines.append(f"| {r['source']} | {r['label']} | {_recompute(r)} | "
                     + " | ".join(_pct(r["breakdown"].get(c, 0.0), False) for c in cats) + " |")
    return lines + [""]


def _summary_line(s: dict) -> str:
    if not s["simulated"]:
        return "no row was simulated"
    return (f"{s['simulated']} of {s['rows']} rows simulated; mean absolute throughput error "
            f"**{_pct(s['mae'], False)}**, largest **{_pct(s['max_abs_error'], False)}**, "
            f"{s['within_15']} of {s['simulated']} within 15%")


def _by_source(rows: list[dict]) -> list[str]:
    out = []
    for source in dict.fromkeys(r["source"] for r in rows):
        errs = [r["error"] for r in rows if r["source"] == source and r["status"] == "ok"]
        if errs:
            out.append(f"- {source}: {len(errs)} row{'s' if len(errs) > 1 else ''}, "
                       f"mean signed error "
                       f"{_pct(sum(errs) / len(errs))}, MAE "
                       f"{_pct(sum(map(abs, errs)) / len(errs), False)}")
    return out


def earlier_section(data: dict) -> list[str]:
    """The same rows by an earlier simulator version (e.g. before TP communication)."""
    old = data.get("earlier")
    if not old:
        return []
    v = old["simulator"]
    tp = any(g.endswith(":tp") for r in old["rows"].values() for g in r["comm"])
    lines = ["## The same rows with an earlier simulator version", "",
             f"`{old['file']}` ({old['environment_date']}): commit `{v['commit'] or 'n/a'}`, "
             f"source "
             f"digest `{v['source_sha256']}`{', ' + v['note'] if v['note'] else ''}; TP "
             f"communication charged: {'yes' if tp else 'no'}; compute efficiency "
             f"{old['compute_efficiency']:.4f}, memory efficiency "
             f"{old.get('memory_efficiency', '?')}. "
             + _summary_line(old["summary"]) + ".", "",
             "| source | model | recompute | error then | error now |", "|---|---|---|---:|---:|"]
    for r in data["rows"]:
        then = old["rows"].get(f"{r['source']}|{r['label']}|{r['recompute']}", {})
        lines.append(f"| {r['source']} | {r['label']} | {_recompute(r)} | "
                     f"{_pct(then.get('error'))} | {_pct(r.get('error'))} |")
    return lines + [""]


def _trend(rows: list[dict]) -> str:
    """Signed error against model width, SC21 rows (the weak-scaling sweep)."""
    sc21 = [r for r in rows if r["source"].startswith("SC21") and r["status"] == "ok"]
    return ", ".join(f"{r['label']} {_pct(r['error'])}" for r in sc21)


def table_4_section(data: dict) -> list[str]:
    """K22 Table 4 (one 22B layer) as simulated: the check of the per-kernel cost model."""
    rows = data.get("k22_table_4")
    if not rows:
        return []
    lines = ["## Check: K22 Table 4, one 22B layer, forward and backward apart", "",
             "One layer of the 22B model (t 8, micro-batch 4, s 2048) simulated as K22 "
             "measured it on Selene (2 layers minus 1 layer; forward = until the first "
             "backward op, TP collectives included). Only the baseline's forward + backward "
             "sum chose the attainment factor; the nine other numbers are predictions.", "",
             "| experiment | F published ms | F predicted ms | F error | B published ms | "
             "B predicted ms | B error | F+B published | F+B predicted | F+B error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pub, pred = r["published_ms"], r["predicted_ms"]
        cells = " | ".join(f"{p:.1f} | {q:.2f} | {_pct(q / p - 1)}" for p, q in zip(pub, pred))
        lines.append(f"| {r['experiment']} | {cells} |")
    return lines + [""]


def _same_runs(rows: list[dict]) -> str:
    """SC21 vs K22 (full recompute) on the same model and layout: implied iteration times."""
    pairs = (("1T", "1T"), ("529.6B", "530B"))
    out = []
    for sc21, k22 in pairs:
        a = next((r for r in rows if r["source"] == "SC21 Table 1" and r["label"] == sc21), None)
        b = next((r for r in rows if r["source"] == "K22 Table 5" and r["label"] == k22
                  and r["recompute"] == "full"), None)
        if a and b:
            out.append(f"{sc21} took {a['implied_iteration_s']:.1f} s in SC21 (d {a['dp']}) "
                       f"and {b['implied_iteration_s']:.1f} s in K22 (d {b['dp']}), "
                       f"{_pct(a['implied_iteration_s'] / b['implied_iteration_s'] - 1)}")
    return "; ".join(out) or "no pair in this run"


def analysis_section(rows: list[dict], layer: dict) -> list[str]:
    """What the errors that remain come from, as far as this benchmark can tell."""
    return [
        "## Where the remaining error comes from (analysis)", "",
        f"- SC21 Table 1, signed error from 1.7B to 1T: {_trend(rows)}. The trend with "
        "model width that a single whole-layer efficiency produced (1.7B +23.7% down to "
        "1T -15.3%, in the earlier version below) is gone: the per-kernel model charges "
        "the memory-bound attention softmax/dropout (a*s^2 per layer) and the "
        "norm/GeLU/residual kernels at HBM bandwidth, whose share of a layer falls from "
        "~43% of the time at h 2304 to ~7% at h 25600.",
        "- What is left on SC21 is mostly a level, and the two papers disagree on it by "
        "about as much. SC21 and K22 ran two models with the same layout, micro-batches "
        "and full recompute, K22 with one data-parallel replica and a year newer "
        f"Megatron: {_same_runs(rows)}. Per GPU the work is the same (SC21 adds a "
        "data-parallel gradient all-reduce, 0.3-0.5% of the iteration as simulated), so "
        "SC21's software was ~8-10% slower than K22's on the same per-GPU work. Our efficiencies come from K22's layer, so "
        "SC21 rows come out high by about that much; no one constant can fit both papers "
        "closer than about half that gap.",
        "- Not modelled (each small; together a few percent): kernel launch gaps between "
        "the many small kernels, gradient-norm clipping and loss scaling in Megatron's "
        "optimizer (the step is charged as Adam's 28 B/param only), the embedding-gradient "
        "all-reduce of tied embeddings between the first and last stage, NCCL's SM use "
        "slowing concurrent compute. Megatron can overlap the backward TP all-reduce with "
        "the weight-gradient GEMM (`--async-tensor-model-parallel-allreduce`); the papers "
        "do not say whether their runs did, so it is charged as blocking, like the "
        "forward's, and the Table 4 split of forward and backward above agrees with that "
        "within 7%.",
        "- The K22 22B rows are 48 of the calibration layer plus embedding, logits and "
        "the optimizer step: they are not independent evidence of the level.",
        "",
    ]


def render(data: dict) -> str:
    rows, s, c, v = data["rows"], data["summary"], data["constants"], data["simulator"]
    charged = sorted({g for r in rows if r["status"] == "ok" for g in r["comm"]})
    tp_charged = any(g.endswith(":tp") for g in charged)
    layer = c["k22_layer"]
    attainment = c.get("attainment_constant", layer["attainment"])  # the one the runs used
    walls = [r["wall_s"] for r in rows]
    verdict = "MET" if s["targets_met"] else "NOT MET"
    changed = (f"{len(v['changed_files'])} uncommitted change(s) in sim/schedules/topologies"
               if v["changed_files"] else "no uncommitted changes")
    lines = [
        "# Fidelity: clustersim against published Megatron-LM training runs on Selene",
        "",
        "Every published run of `benchmarks/fidelity_data.py` (SC21 Table 1; K22 Table 5 "
        "with full recompute and with sequence parallelism + selective recompute; K22's "
        "530B at 8-way data parallelism) simulated on the `selene-a100` preset with the "
        "row's layout, batch, interleaving and recompute. Throughput is TFLOP/s per GPU by "
        "the paper's own FLOP formula (SC21 eq. 3 for Table 1, K22 eq. 7 for K22, whose "
        "Table 5 prints times only) applied to the simulated iteration time; error = "
        "predicted / published - 1 (for K22 rows the same as published time / predicted "
        "time - 1).",
        "",
        f"**Targets (issue 6): every row within 15% and MAE < 8%: {verdict}.** "
        + _summary_line(s) + ".",
        "",
        *_by_source(rows),
        "",
        f"Simulator: commit `{v['commit']}` with {changed} (source digest "
        f"`{v['source_sha256']}`){'; ' + v['note'] if v['note'] else ''}. "
        f"TP communication charged by this version: **{'yes' if tp_charged else 'no'}** "
        f"(communication ops seen on rank 0: {', '.join(charged) or 'none'}).",
        "",
        *row_table(rows),
        "",
        "t/p/d = tensor/pipeline/data parallel, V = virtual stages (interleaved 1F1B); "
        "M x b = micro-batches per pipeline x micro-batch size. SC21 prints no times: "
        "its published column is empty and `implied_iteration_s` in the JSON derives one. "
        "Compute idle = the simulated fraction of the iteration a pipeline rank's compute "
        "stream waits (pipeline bubble plus exposed communication), averaged over ranks.",
        "",
        "## Cost-model constants and where they come from",
        "",
        f"- Peak {c['peak_tflops']:.0f} TFLOP/s (dense bf16/fp16) and HBM "
        f"{c['hbm_tb_s']} TB/s: NVIDIA A100 80GB SXM datasheet (topologies' device "
        "registry, `a100-80gb-sxm`). The network (NVLink/NVSwitch in a DGX A100, 8 HDR "
        "200 Gb/s HCAs per node, fat tree) is the `selene-a100` preset, unchanged.",
        "- **Per-kernel roofline** (`schedules/layer_kernels.py`, `sim/cost.py`): every "
        "compute op is the kernel sequence Megatron-LM runs for its layers (QKV, "
        "projection and MLP GEMMs; the core attention as two batched GEMMs with fused "
        "scale-mask-softmax and dropout between them; LayerNorm, fused bias-GeLU and "
        "bias-dropout-add; embedding; logits GEMM and fp32 cross-entropy), each with its "
        "FLOPs and the bytes of the tensors it reads and writes; a kernel takes "
        "max(FLOPs / (peak x compute efficiency), bytes / (HBM x memory efficiency)), and "
        "an op the sum over its kernels. Backward runs each GEMM twice and the elementwise "
        "backward kernels; recompute adds the forward's kernels (full) or the attention "
        "core's (selective).",
        f"- The two efficiencies are measured A100 ceilings times one attainment factor: "
        f"compute **{c['compute_efficiency']:.4f}** = {100 * c['mamf_efficiency']:.1f}% x "
        f"{attainment:.4f} and memory **{c['memory_efficiency']:.4f}** = "
        f"{100 * c['memory_ceiling']:.0f}% x {attainment:.4f} "
        f"({c['efficiency_source']}).",
        f"  - Matmul ceiling {100 * c['mamf_efficiency']:.1f}%: the A100 SXM's maximum "
        f"achievable bf16 matmul, {c['peak_tflops'] * c['mamf_efficiency']:.1f} TFLOP/s "
        f"({c['mamf_source']}: S. Bekman, ml-engineering, 'Maximum Achievable Matmul FLOPS "
        "comparison table'; topologies.devices).",
        f"  - HBM ceiling {100 * c['memory_ceiling']:.0f}%: 1.80 of 2.04 TB/s read bandwidth "
        "measured on an A100 80GB SXM (NVIDIA developer forum, 'Trouble to reach peak "
        "bandwidth of A100', which also cites ~90% as the best any kernel reached in a "
        "GTC talk).",
        f"  - Attainment {layer['attainment']:.4f}: kernels inside a training layer run "
        "below their best-case ceilings (launch gaps, wave tails, dropout's random "
        "numbers). One factor for both keeps the measured ratio of the ceilings; it is "
        "the one at which the simulated 22B layer of K22 Table 4 (Megatron on Selene: "
        "h 6144, t 8, micro-batch 4, s 2048, no recompute; 19.6 ms forward + backward) "
        "takes the measured time: 2 layers minus 1 layer, so embedding, logits and "
        f"optimizer cancel; bisection gives {layer['layer_ms']:.2f} ms "
        f"({layer['layer_ms_at_ceilings']:.2f} ms at the ceilings themselves). One "
        "published micro-measurement, never a row of the table; the other Table 4 "
        "experiments check it below.",
        "",
        "## Modelling choices per row",
        "",
        "- Layout, global batch, micro-batch, virtual stages and recompute as "
        "`fidelity_data.py` gives them (SC21: `run_table_1.sh`; K22: Tables 3/5, section 6). "
        "Megatron rank order tp-cp-ep-dp-pp: TP inside a DGX node, pipeline stages farthest "
        "apart. One pipeline replica (its TP rank 0) is simulated; each stage's DP "
        "collectives run over that stage's real DP group on the fat tree (the other TP "
        "ranks' DP groups run with them wherever they share a link; on Selene, one HCA per "
        "GPU, they share none, so they are not simulated).",
        "- DDP: `run_table_1.sh` sets DDP=torch for 1.7B-18.4B (PyTorch DDP: 25 MiB buckets "
        "reduced during the backward) and DDP=local for 39.1B-1T (Megatron's contiguous "
        "buffer: one all-reduce per model chunk after the backward). K22 (section 6.3) does "
        "not overlap the gradient all-reduce: local DDP. Gradients are reduced in 16 bit.",
        "- TP communication (where the simulator models it): Megatron of 2021/22, so TP "
        "collectives run between the GEMMs (no --tp-comm-overlap), and pipeline transfers "
        "use SC21's scatter/gather (section 4.1, Megatron's default when tp > 1 without "
        "SP: each TP rank sends 1/t of the activation over its own HCA, then an NVLink "
        f"all-gather). Options passed: `{data.get('intra_layer_options', 'none')}`.",
        "- Full recompute adds one forward per layer to the backward; selective recompute "
        "adds the core attention (4bs^2h) per layer; sequence parallelism changes "
        "activation memory and, where the simulator models it, TP collectives.",
        "",
        *table_4_section(data),
        *analysis_section(rows, c["k22_layer"]),
        *breakdown_table(rows),
        *earlier_section(data),
        "## Sensitivity to the efficiencies (not the result)",
        "",
        "| attainment | compute efficiency | memory efficiency | rows simulated | MAE | "
        "largest error | within 15% |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {layer['attainment']:.4f} (used) | {c['compute_efficiency']:.4f} | "
        f"{c['memory_efficiency']:.4f} | {s['simulated']} | {_pct(s['mae'], False)} | "
        f"{_pct(s['max_abs_error'], False)} | {s['within_15']} |",
        *(f"| {alt['attainment']:.4f} | {alt['compute_efficiency']:.4f} | "
          f"{alt['memory_efficiency']:.4f} | {alt['summary']['simulated']} | "
          f"{_pct(alt['summary']['mae'], False)} | {_pct(alt['summary']['max_abs_error'], False)}"
          f" | {alt['summary']['within_15']} |" for alt in data["sensitivity"]),
        "",
        "## Time taken",
        "",
        f"Simulation wall time per row {min(walls):.1f}-{max(walls):.1f} s, "
        f"{sum(walls):.0f} s for the main rows; the whole benchmark "
        f"{data['total_wall_s']:.0f} s including the attainment bisection, Table 4 and the "
        "sensitivity runs. Each row runs in a child process with a time limit; a row "
        "over it (or past the total budget) is listed as SKIPPED with the time it had "
        "run. The machine is a shared 2-core box on which other engineers' jobs ran "
        "meanwhile: wall times are noisy (the simulated numbers are not).",
        "",
        "## Environment",
        "",
        *(f"- {k}: {val}" for k, val in data["environment"].items()),
        "",
        "## Commands",
        "",
        "```bash",
        data["command"],
        "# one row with the CLI (the same simulation; add -o/--metrics-json as wanted):",
        next((r["command"] for r in rows if r["label"] == "145.6B"), rows[0]["command"]),
        "```",
        "",
        "Every row's `clustersim simulate` command is in `fidelity.json` (`rows[].command`).",
        "",
    ]
    return "\n".join(lines)
