"""Serving (issue 21, first part) against closed forms typed here: KV bytes per token
(2 x layers x kv_heads x head_dim x bytes; the vLLM paper's ~800 KB per token of a 13B
model), a memory-bound decode step ((weights/TP + KV bytes) / (HBM x fraction)), a
compute-bound prefill (its FLOPs / (peak x fraction)), the TP all-reduces, Little's law on
the simulated queue, and the batching policies' schedules."""
import json
import math
import subprocess
import sys

import pytest

from browser import dump_dom

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.sim.collectives import simulate_collective
from clustersim.sim.cost import ATTAINMENT
from clustersim.sim.serving import Limits, load_trace, simulate_serving, synthetic
from clustersim.sim.serving.kv_cache import kv_bytes_per_token
from clustersim.sim.serving.metrics import time_average_in_system
from clustersim.topologies import get_device

H100 = get_device("h100-sxm")
L7 = get_model("llama2-7b")


def hbm(device=H100):
    return device.hbm_bandwidth * device.hbm_ceiling * ATTAINMENT


def flops(device=H100, dtype="bf16"):
    return device.peak(dtype) * device.matmul_ceiling_of(dtype) * ATTAINMENT


def test_llama2_presets_match_the_published_parameter_counts():
    """Llama 2 paper / Hugging Face: 6.74B, 13.0B, 69.0B parameters."""
    for name, billions in (("llama2-7b", 6.74), ("llama2-13b", 13.02), ("llama2-70b", 68.98)):
        assert get_model(name).param_count() / 1e9 == pytest.approx(billions, abs=0.01)


def test_kv_bytes_per_token():
    """2 x layers x kv_heads x head_dim x bytes: Llama 2 7B fp16 512 KiB; 13B 800 KB (the
    vLLM paper, Kwon et al. 2023, section 2.3: '800 KB' per token of a 13B model); GQA 70B
    2 x 80 x 8 x 128 x 2; one KV head per GPU from tp 8 on (replicated beyond)."""
    assert kv_bytes_per_token(L7, 2) == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert kv_bytes_per_token(get_model("llama2-13b"), 2) == 2 * 40 * 40 * 128 * 2 == 819200
    l70 = get_model("llama2-70b")
    assert kv_bytes_per_token(l70, 2) == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token(l70, 1, tp=8) == 2 * 80 * 1 * 128 * 1
    assert kv_bytes_per_token(l70, 2, tp=16) == kv_bytes_per_token(l70, 2, tp=8)


def one_request_run(input_len, output_len, topology="dgx-h100", tp=1, **kw):
    return simulate_serving(get_model(kw.pop("model", "llama2-7b")), topology,
                            synthetic(1, input_len, output_len), tp=tp, **kw)


def test_decode_step_is_weights_plus_kv_over_hbm():
    """One sequence decoding with c tokens cached: every kernel is memory-bound, so the
    step reads the weights (layers, output layer) and the K and V of c + 1 tokens at the
    achievable HBM bandwidth."""
    r = one_request_run(1000, 2)
    layers = L7.num_layers * L7.layer_param_count() * 2
    output = L7.vocab_size * L7.hidden_size * 2
    kv = (1000 + 1) * kv_bytes_per_token(L7, 2)
    decode = r.run.served[0].token_times[1] - r.run.served[0].token_times[0]
    assert decode == pytest.approx((layers + output + kv) / hbm(), rel=1e-9)


def test_prefill_is_its_flops_over_the_peak():
    """A 4095-token prompt (with its one output token, Llama 2's whole 4096-token
    context): GEMMs 2 x tokens x layer parameters and causal attention
    4 x d x heads x q(q+1)/2 per layer run at the achievable matmul FLOP/s; the output layer
    (one sampled token) reads its weights. TTFT of a request arriving at 0 = that."""
    q = 4095
    r = one_request_run(q, 1)
    d, heads = L7.hidden_size // L7.num_attention_heads, L7.num_attention_heads
    per_layer = 2 * q * L7.layer_param_count() + 4 * d * heads * q * (q + 1) / 2
    head = L7.vocab_size * L7.hidden_size * 2 / hbm()
    assert r.metrics["mean_ttft_ms"] / 1e3 == pytest.approx(
        L7.num_layers * per_layer / flops() + head, rel=1e-9)
    # Megatron's 2 x parameters x tokens dominates
    gemms = 2 * q * L7.num_layers * L7.layer_param_count() / flops()
    assert gemms < r.metrics["mean_ttft_ms"] / 1e3


def test_tensor_parallel_step_adds_two_all_reduces_per_layer():
    """tp 2: each GPU reads its half of the sharded weights (norms replicated) and of the KV
    heads, all memory-bound for one sequence, and each layer pays two all-reduces of the
    step's activations (tokens x h x 2 bytes) as NCCL runs them on the node, the output
    layer an all-gather of the logits."""
    c = 1000
    r = one_request_run(c, 2, tp=2)
    step = r.run.served[0].token_times[1] - r.run.served[0].token_times[0]
    weights = (L7.num_layers * L7.layer_param_count(2) + L7.vocab_size * L7.hidden_size / 2) * 2
    kv = (c + 1) * kv_bytes_per_token(L7, 2, tp=2)
    ar = simulate_collective("all-reduce", L7.hidden_size * 2, 2, "dgx-h100").time_s
    gather = simulate_collective("all-gather", L7.vocab_size * 2, 2, "dgx-h100").time_s
    assert step == pytest.approx((weights + kv) / hbm() + 2 * L7.num_layers * ar + gather,
                                 rel=1e-9)


def test_littles_law_on_the_simulated_queue():
    """Time-averaged requests in the system (integrated from the arrival and completion
    events) = arrival throughput x mean end-to-end latency."""
    r = simulate_serving(L7, "dgx-h100", synthetic(300, 600, 100, 20.0, seed=3))
    m = r.metrics
    assert time_average_in_system(r.run) == pytest.approx(
        m["request_throughput"] * m["mean_e2el_ms"] / 1e3, rel=1e-9)
    assert all(len(s.token_times) == s.request.output_tokens for s in r.run.served)
    assert all(s.token_times[0] > s.request.arrival for s in r.run.served)


def test_continuous_batching_of_one_sequence_serves_requests_in_turn():
    """max_num_seqs 1: each request prefills then decodes alone, so the run lasts N times
    one request's time and request i waits for the i before it."""
    alone = one_request_run(500, 50).metrics["mean_e2el_ms"]
    r = simulate_serving(L7, "dgx-h100", synthetic(4, 500, 50), limits=Limits(max_num_seqs=1))
    assert r.metrics["duration"] * 1e3 == pytest.approx(4 * alone, rel=1e-9)
    assert r.metrics["mean_e2el_ms"] == pytest.approx(alone * (1 + 2 + 3 + 4) / 4, rel=1e-9)


def test_static_batch_decodes_until_its_longest_output():
    """Static batching: the batch prefills together and runs output_len - 1 decode steps;
    the next batch starts after it (two batches take twice one)."""
    one = simulate_serving(L7, "dgx-h100", synthetic(8, 256, 32), batching="static",
                           limits=Limits(batch_size=8))
    two = simulate_serving(L7, "dgx-h100", synthetic(16, 256, 32), batching="static",
                           limits=Limits(batch_size=8))
    assert two.metrics["duration"] == pytest.approx(2 * one.metrics["duration"], rel=1e-9)
    assert sum(two.run.steps) == 2 * 32


def test_static_batching_reserves_a_whole_batch_prefill_and_takes_no_step_limits():
    """A static step prefills batch_size prompts at once, so the activation reserve is
    sized for batch_size x the longest prompt and batch_size sampled sequences
    (kv_cache.activation_reserve), not vLLM's step limits, which static batching does
    not use: they are refused (API and CLI), as changing nothing."""
    r = simulate_serving(L7, "dgx-h100", synthetic(8, 300, 4), batching="static",
                         limits=Limits(batch_size=4))
    h, f, v = L7.hidden_size, L7.ffn_hidden_size, L7.vocab_size
    per_token = (2 * h + (h + 2 * L7.kv_hidden_size) + 2 * f) * 2  # tp 1, 2-byte activations
    assert r.capacity.activations == pytest.approx(4 * 300 * per_token + 4 * v * 4, rel=1e-12)
    assert "one forward of 1200 tokens" in r.notes[0]
    for limits in (Limits(max_num_seqs=4, batch_size=4),
                   Limits(max_num_batched_tokens=512, batch_size=4)):
        with pytest.raises(ConfigError, match="static batching runs batch_size sequences"):
            simulate_serving(L7, "dgx-h100", synthetic(8, 300, 4), batching="static",
                             limits=limits)
    cli = subprocess.run([sys.executable, "-m", "clustersim", "serve", "--num-prompts", "8",
                          "--batching", "static", "--batch-size", "4", "--max-num-seqs", "4"],
                         capture_output=True, text=True)
    assert cli.returncode != 0 and "--max-num-seqs: static batching runs --batch-size" in \
        cli.stderr and "Traceback" not in cli.stderr


def test_chunked_prefill_feeds_a_long_prompt_over_several_steps():
    """A 3072-token prompt under a 1024-token budget: three chunks (the prompt's cached
    tokens growing 0, 1024, 2048), the first token after the third; a prompt that fits
    runs as one prefill, as under continuous batching."""
    r = simulate_serving(L7, "dgx-h100", synthetic(1, 3072, 3), batching="chunked-prefill",
                         limits=Limits(max_num_batched_tokens=1024))
    cost = r.cost
    chunks = sum(cost.time([(1024, c)]) for c in (0, 1024, 2048))
    assert r.metrics["mean_ttft_ms"] / 1e3 == pytest.approx(chunks, rel=1e-12)
    assert sum(r.run.steps) == 3 + 2
    same = [simulate_serving(L7, "dgx-h100", synthetic(1, 500, 20), batching=b)
            .metrics["mean_e2el_ms"] for b in ("continuous", "chunked-prefill")]
    assert same[0] == pytest.approx(same[1], rel=1e-12)


def test_chunked_prefill_mixes_decodes_with_prompts():
    """Under load, chunked prefill puts decodes and prompt chunks in one step: its steps
    never exceed the token budget, every request completes, and the inter-token latency's
    tail (a decode waiting behind a whole prefill step) is shorter than continuous
    batching's, at the cost of TTFT."""
    reqs = synthetic(200, 2000, 100, 8.0, seed=5)
    cont = simulate_serving(L7, "dgx-h100", reqs)
    chunk = simulate_serving(L7, "dgx-h100", reqs, batching="chunked-prefill",
                             limits=Limits(max_num_batched_tokens=512))
    assert all(len(s.token_times) == 100 for s in chunk.run.served)
    assert chunk.metrics["p99_itl_ms"] < cont.metrics["p99_itl_ms"]


def test_preemption_recomputes_and_every_request_completes():
    """A KV cache too small for every running sequence: the newest are preempted and
    recomputed; every request still gets all its tokens."""
    for batching in ("continuous", "chunked-prefill"):
        r = simulate_serving(L7, "dgx-h100", synthetic(64, 1000, 400),
                             gpu_memory_utilization=0.25, batching=batching)
        assert r.metrics["preemptions"] > 0
        assert all(len(s.token_times) == 400 for s in r.run.served)
        assert r.metrics["kv_cache_usage_max"] <= 1.0


def test_swap_preemption_moves_blocks_over_pcie_and_recomputes_nothing():
    """The same squeeze with swap preemption: every prompt is prefilled exactly once (no
    recompute), each swapped block goes out and comes back (an even count), and the
    copies' time is blocks x a block's bytes / (PCIe Gen5 x16, 64 GB/s x NCCL's 0.75) -
    at tp 1 the steps' only communication."""
    reqs = synthetic(64, 1000, 400)
    swap = simulate_serving(L7, "dgx-h100", reqs, gpu_memory_utilization=0.25,
                            preemption_mode="swap")
    recompute = simulate_serving(L7, "dgx-h100", reqs, gpu_memory_utilization=0.25)
    prefilled = [sum(x.prompt_tokens for x in r.run.step_log[0]) for r in (swap, recompute)]
    assert prefilled[0] == 64 * 1000 < prefilled[1]
    assert swap.metrics["preemptions"] > 0 and swap.run.swapped_blocks % 2 == 0
    block = 16 * kv_bytes_per_token(L7, 2)
    copies = sum(x.communication for x in swap.run.step_log[0])
    assert copies == pytest.approx(swap.run.swapped_blocks * block / (64e9 * 0.75),
                                   rel=1e-9)
    assert all(len(s.token_times) == 400 for s in swap.run.served)


@pytest.mark.parametrize("kwargs, words", [
    (dict(preemption_mode="swap", batching="chunked-prefill"), "continuous scheduler"),
    (dict(preemption_mode="evict"), "recompute or swap"),
    (dict(preemption_mode="swap", swap_space_gib=0), "swap_space"),
])
def test_swap_refusals(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        simulate_serving(L7, "dgx-h100", synthetic(2, 64, 2), **kwargs)


def test_data_parallel_replicas_scale_throughput_not_latency():
    """Two replicas each serve half the requests (in turn), in the time one replica serves
    that half: throughput about doubles; one request's latency alone does not change (the
    seeds' claim)."""
    reqs = synthetic(64, 512, 64)
    one = simulate_serving(L7, "dgx-h100", reqs, dp=1, limits=Limits(max_num_seqs=32))
    two = simulate_serving(L7, "dgx-h100", reqs, dp=2, limits=Limits(max_num_seqs=32))
    half = simulate_serving(L7, "dgx-h100", synthetic(32, 512, 64),
                            limits=Limits(max_num_seqs=32))
    assert two.metrics["duration"] == pytest.approx(half.metrics["duration"], rel=1e-12)
    assert 1.9 < two.metrics["output_throughput"] / one.metrics["output_throughput"] <= 2.01
    single = [simulate_serving(L7, "dgx-h100", synthetic(1, 512, 64), dp=d)
              .metrics["mean_e2el_ms"] for d in (1, 2)]
    assert single[0] == pytest.approx(single[1], rel=1e-12)


@pytest.mark.parametrize("kwargs, words", [
    (dict(tp=3), "must divide"),
    (dict(tp=8, dp=2), "16 GPUs, but the topology has 8"),
    (dict(pp=40), "exceeds the model's 32 layers"),
    (dict(batching="static"), "needs batch_size"),
    (dict(limits=Limits(batch_size=4)), "sets static batches"),
    (dict(quantization="int4"), "quantization must be"),
    (dict(kv_cache_dtype="int8"), "kv_cache_dtype must be"),
    (dict(limits=Limits(max_num_batched_tokens=512)), "or use chunked-prefill batching"),
    (dict(batching="chunked-prefill", limits=Limits(max_num_batched_tokens=100)),
     "max_num_batched_tokens 100 must be at least max_num_seqs 256"),
])
def test_refusals_name_the_setting(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        simulate_serving(L7, "dgx-h100", synthetic(2, 1024, 8), **kwargs)


@pytest.mark.parametrize("tp, kv_heads_per_gpu", [(4, 3), (12, 1), (8, None)])
def test_tp_divides_the_kv_heads_or_is_a_multiple_of_them(tp, kv_heads_per_gpu):
    """A model of 24 heads in 12 KV groups: tp 4 holds 3 KV heads per GPU, tp 12 one each;
    tp 8 would need 1.5, which vLLM refuses (neither split evenly nor replicated), so it
    is refused, not floored to 1 (a KV cache half the size it is). KV bytes per token per
    GPU: 2 x layers x KV heads per GPU x head dim x bytes."""
    model = get_model("llama3-8b", hidden_size=3072, num_attention_heads=24,
                      num_query_groups=12, num_layers=4)
    reqs = synthetic(2, 64, 4)
    if kv_heads_per_gpu is None:
        with pytest.raises(ConfigError, match="must divide the model's 12 KV heads or be a "
                                              "multiple of them"):
            simulate_serving(model, "dgx-h100-x16-ndr", reqs, tp=tp)
        return
    result = simulate_serving(model, "dgx-h100-x16-ndr", reqs, tp=tp)
    assert result.capacity.block_bytes == 16 * 2 * 4 * kv_heads_per_gpu * 128 * 2


def test_requests_arriving_together_prefill_together():
    """Eight 1,024-token prompts at one instant fit one continuous step of 8,192 tokens:
    every request gets its first token from that step, as a static batch of 8 does (the
    first step once took request 0 alone, before the others were queued)."""
    burst = simulate_serving(L7, "dgx-h100", synthetic(8, 1024, 16),
                             limits=Limits(max_num_batched_tokens=8192))
    static = simulate_serving(L7, "dgx-h100", synthetic(8, 1024, 16), batching="static",
                              limits=Limits(batch_size=8))
    assert burst.metrics["p99_ttft_ms"] == pytest.approx(burst.metrics["mean_ttft_ms"],
                                                         rel=1e-12)
    assert burst.metrics["mean_ttft_ms"] == pytest.approx(static.metrics["mean_ttft_ms"],
                                                          rel=1e-12)


def test_the_header_names_overridden_dimensions_precision_and_the_split():
    out = subprocess.run([sys.executable, "-m", "clustersim", "serve", "--model", "llama3-8b",
                          "--num-prompts", "4", "--num-layers", "2", "--quantization", "fp8",
                          "--kv-cache-dtype", "fp8", "--dp", "2", "--batching",
                          "disaggregated", "--num-prefill-replicas", "1"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert "llama3-8b with num-layers 2 on dgx-h100" in out[1]
    assert out[1].endswith("disaggregated batching (1 prefill / 1 decode replicas)")
    assert out[2].split(":", 1)[1].strip() == "weights fp8, activations bf16, KV cache fp8"


def test_the_kv_line_says_whose_blocks_and_each_gpus_bytes():
    """With sp 2 a block's 16 tokens spread over the two GPUs: the count is the group's,
    the bytes each GPU's, blocks x 16 x (2 x 32 layers x 8 KV heads x 128 x 2 B) / 2."""
    import re
    out = subprocess.run([sys.executable, "-m", "clustersim", "serve", "--model", "llama3-8b",
                          "--num-prompts", "4", "--input-len", "1", "--output-len", "4",
                          "--sp", "2"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"Blocks of 16 tokens \(sp group's\): +([\d,]+) \(([\d.]+) GB on each "
                      r"GPU", out)
    blocks, gb = int(found[1].replace(",", "")), float(found[2])
    assert gb == pytest.approx(blocks * 16 * 2 * 32 * 8 * 128 * 2 / 2 / 1e9, abs=0.05)


def test_a_request_must_fit_the_model_context():
    """vLLM's max_model_len (Llama 2's 4096-token context): a prompt and output that fill
    the context are served, one token more is refused, as vLLM's server refuses it."""
    context = L7.seq_length
    assert context == 4096
    served = simulate_serving(L7, "dgx-h100", synthetic(1, context - 16, 16))
    assert served.metrics["completed"] == 1
    with pytest.raises(ConfigError, match=f"request 0: {context - 16} prompt \\+ 17 output "
                                          f"tokens exceed the model's context of {context}"):
        simulate_serving(L7, "dgx-h100", synthetic(1, context - 16, 17))


def test_moe_decode_reads_the_experts_its_tokens_reach():
    """Mixtral 8x7B, tp 2: a decode step of one sequence reads every layer's attention and
    router weights and k = 2 of its 8 experts (1 - (1 - 2/8)^1 = 1/4 of them), memory-bound;
    a 4096-token prefill reaches all 8 and runs 2 x tokens x (attention + 2 experts)."""
    mix = get_model("mixtral-8x7b")
    r = simulate_serving(mix, "dgx-h100", synthetic(1, 100, 2), tp=2)
    c = r.cost
    assert c.moe_layers == 32 and c.experts_touched(1) == pytest.approx(2)
    assert c.experts_touched(4096) == pytest.approx(8)
    expert = mix.layer_expert_param_count(2) / 8
    other = mix.layer_param_count(2) - 8 * expert
    attention_kv = 101 * kv_bytes_per_token(mix, 2, tp=2)
    weights = (32 * (other + 2 * expert) + mix.vocab_size * mix.hidden_size / 2) * 2
    compute = r.run.served[0].token_times[1] - r.run.served[0].token_times[0]
    _, communication = c.parts([(1, 101)])
    assert compute - communication == pytest.approx((weights + attention_kv) / hbm(),
                                                    rel=1e-9)
    assert c.weight_bytes_per_gpu() == pytest.approx(
        (32 * mix.layer_param_count(2) + mix.vocab_size * mix.hidden_size
         + mix.hidden_size) * 2)


def test_too_large_models_are_refused():
    with pytest.raises(ConfigError, match="no memory left for the KV cache"):
        simulate_serving(get_model("llama2-70b"), "dgx-h100", synthetic(1, 8, 8))


def test_trace_files(tmp_path):
    csv_file = tmp_path / "t.csv"
    csv_file.write_text("arrival_time,input_tokens,output_tokens\n0,10,3\n0.5,20,4\n")
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"arrival_time": 0, "input_tokens": 10, "output_tokens": 3}\n'
                     '{"arrival_time": 0.5, "input_tokens": 20, "output_tokens": 4}\n')
    assert load_trace(csv_file) == load_trace(jsonl)
    assert [(r.arrival, r.input_tokens, r.output_tokens) for r in load_trace(csv_file)] == [
        (0.0, 10, 3), (0.5, 20, 4)]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time,input_tokens,output_tokens\n1,10,3\n0.5,x,4\n")
    with pytest.raises(ConfigError, match="row 3: arrival_time must be"):
        load_trace(bad)
    bad.write_text("arrival_time,input_tokens\n1,10\n")
    with pytest.raises(ConfigError, match="missing output_tokens"):
        load_trace(bad)


def test_poisson_arrivals_have_the_rate():
    reqs = synthetic(20000, 8, 8, request_rate=50.0, seed=1)
    assert (len(reqs) - 1) / reqs[-1].arrival == pytest.approx(50.0, rel=0.03)
    assert all(r.arrival == 0 for r in synthetic(5, 8, 8))


def clustersim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_cli_prints_the_summary_and_writes_vllms_keys(tmp_path):
    out = clustersim("serve", "--model", "llama2-7b", "--topology", "dgx-h100",
                     "--input-len", "256", "--output-len", "16", "--num-prompts", "20",
                     "--request-rate", "5", "--json", str(tmp_path / "m.json"))
    assert out.returncode == 0, out.stderr
    assert "Serving Benchmark Result (simulated)" in out.stdout and "Mean TTFT (ms)" in out.stdout
    data = json.loads((tmp_path / "m.json").read_text())
    for key in ("request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
                "mean_e2el_ms", "completed"):
        assert key in data
    assert data["completed"] == 20 and data["total_output_tokens"] == 20 * 16
    assert math.isclose(data["output_throughput"], 320 / data["duration"])


@pytest.mark.parametrize("args, words", [
    (["--num-prompts", "2", "-tp", "8", "-pp", "2"], "16 GPUs, but the topology has 8"),
    (["--request-rate", "0"], "--request-rate"),
    (["--num-prompts", "2", "--model", "mixtral-8x7b", "--ep", "3", "--dp", "3"],
     "divide the model's 8"),
    (["--num-prompts", "2", "--ep", "2"], "the model has no experts"),
    (["--trace", "missing.csv"], "no such file"),
    (["--trace", "missing.csv", "--num-prompts", "2"], "--num-prompts would change nothing"),
    (["--trace", "missing.csv", "--input-len", "1024"], "--input-len would change nothing"),
    (["--seed", "3", "--num-prompts", "2"], "--seed draws the Poisson arrivals"),
    (["--swap-space", "8", "--num-prompts", "2"], "--swap-space sizes swap preemption"),
    (["--model", "llama2-7b", "--seq-length", "1024", "--num-prompts", "2"],
     "request 0: 1024 prompt + 128 output tokens exceed the model's context of 1024"),
    (["--model", "llama2-7b", "--seq-length", "1024", "--num-prompts", "2", "--compare",
      "tp=1", "tp=2"], "request 0: 1024 prompt + 128 output tokens exceed"),
    (["--micro-batch-size", "2"], "unrecognized arguments"),
])
def test_cli_errors_are_one_line(args, words, tmp_path):
    out = clustersim("serve", *args, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim") and words in lines[0]


def test_cli_json_never_overwrites_the_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,input_tokens,output_tokens\n0,10,3\n")
    out = clustersim("serve", "--trace", str(trace), "--json", str(trace))
    assert out.returncode == 2 and "--json" in out.stderr
    assert trace.read_text().startswith("arrival_time")


def test_gantt_rows_are_every_gpu_and_bars_every_steps_parts():
    """A bar per step and GPU (compute) and one more where the step communicates (tp > 1),
    on tp x dp rows; one row per replica when that would exceed MAX_BARS."""
    from clustersim.sim.serving import gantt
    r = simulate_serving(L7, "dgx-h100", synthetic(6, 300, 5), tp=2, dp=2)
    fig = gantt.serving_figure(r, "t")
    steps = sum(r.run.steps)
    bars = sum(len(t.x) for t in fig.data if t.type == "bar")
    assert bars == steps * 2 * 2  # 2 GPUs per replica, compute + communication
    assert {t.name for t in fig.data if t.type == "bar"} == {"prefill", "decode",
                                                            "communication"}
    assert [label for label, _, _ in gantt.rows(r.run, 2)] == [
        "replica 0 GPU 0", "replica 0 GPU 1", "replica 1 GPU 0", "replica 1 GPU 1"]
    assert len(gantt.rows(r.run, 10**5)) == 2


@pytest.mark.browser
def test_chromium_draws_the_serving_page(tmp_path):
    """The CLI's --html page in a real browser: every bar and one KV line per replica."""
    from test_gantt import PlotDom
    page = tmp_path / "serve.html"
    out = clustersim("serve", "--model", "llama2-7b", "--topology", "dgx-h100", "--dp", "2",
                     "--input-len", "128", "--output-len", "4", "--num-prompts", "4",
                     "--html", str(page), "--json", str(tmp_path / "m.json"))
    assert out.returncode == 0, out.stderr
    drawn = PlotDom()
    drawn.feed(dump_dom(page, tmp_path))
    r = simulate_serving(L7, "dgx-h100", synthetic(4, 128, 4), dp=2)
    assert drawn.bars == sum(r.run.steps)  # tp 1: compute bars only
    assert drawn.lines == 2


def test_goodput_counts_the_requests_within_every_slo():
    """request_goodput = requests meeting all the SLOs / duration: with limits every
    request meets it is the request throughput; with a TTFT limit between the fastest and
    slowest TTFT it counts exactly those below."""
    r = simulate_serving(L7, "dgx-h100", synthetic(40, 800, 40, 30.0, seed=2),
                         slo={"ttft": 1e9, "tpot": 1e9})
    assert r.metrics["request_goodput"] == r.metrics["request_throughput"]
    ttfts = sorted((s.token_times[0] - s.request.arrival) * 1e3 for s in r.run.served)
    limit = ttfts[len(ttfts) // 2]
    r2 = simulate_serving(L7, "dgx-h100", synthetic(40, 800, 40, 30.0, seed=2),
                          slo={"ttft": limit})
    below = sum(t <= limit for t in ttfts)
    assert r2.metrics["request_goodput"] == pytest.approx(below / r2.metrics["duration"])
    with pytest.raises(ConfigError, match="goodput"):
        simulate_serving(L7, "dgx-h100", synthetic(1, 8, 8), slo={"itl": 5})


def test_llama31_names_are_llama3s_shapes():
    assert get_model("Llama3.1-70B") == get_model("llama3-70b")


def test_pipeline_parallel_latency_is_the_stages_plus_sends():
    """One request on pp 2: each step runs stage 0 (half the layers, the embedding) then
    stage 1 (the other half and the output layer), with the activations sent between them;
    the single request's latency is pp 1's plus the sends (no faster)."""
    from clustersim.sim.serving import stage_layers
    assert stage_layers(L7, 3) == [11, 11, 10]
    one = simulate_serving(L7, "dgx-h100", synthetic(1, 700, 3))
    two = simulate_serving(L7, "dgx-h100", synthetic(1, 700, 3), pp=2)
    s0, s1 = two.stage_costs
    assert (s0.layers, s0.first, s0.last, s1.layers, s1.first, s1.last) == (
        16, True, False, 16, False, True)
    prefill = one.cost.time([(700, 0)])
    assert s0.time([(700, 0)]) + s1.time([(700, 0)]) == pytest.approx(prefill, rel=1e-12)
    send = simulate_collective("p2p", 700 * L7.hidden_size * 2, 2, "dgx-h100").time_s
    assert two.metrics["mean_ttft_ms"] / 1e3 == pytest.approx(prefill + send, rel=1e-9)
    assert two.metrics["mean_e2el_ms"] > one.metrics["mean_e2el_ms"]


def test_pipeline_parallel_raises_throughput_with_batches_in_flight():
    """Under load pp 2 keeps two batches in flight, one per stage: output throughput
    near twice pp 1's on half the GPUs each, while a lone request is not faster."""
    reqs = synthetic(256, 256, 64)
    one = simulate_serving(L7, "dgx-h100", reqs, limits=Limits(max_num_seqs=64))
    two = simulate_serving(L7, "dgx-h100", reqs, pp=2, limits=Limits(max_num_seqs=64))
    assert two.metrics["output_throughput"] > 1.5 * one.metrics["output_throughput"]
    steps = two.run.step_log[0]
    for stage in (0, 1):  # a stage runs one step at a time
        spans = sorted((s.start, s.end) for s in steps if s.stage == stage)
        assert all(a[1] <= b[0] + 1e-15 for a, b in zip(spans, spans[1:]))


def test_disaggregated_prefill_then_kv_transfer_then_decode():
    """One request, prefill replica 0 (GPU 0) and decode replica 1 (GPU 1): its first token
    at the prefill's end, as under continuous batching; its second a KV transfer (the
    prompt's 2 x layers x kv heads x head dim x 2 bytes per token, GPU 0 to GPU 1 over
    NVLink) plus a decode step later."""
    alone = simulate_serving(L7, "dgx-h100", synthetic(1, 1000, 3))
    r = simulate_serving(L7, "dgx-h100", synthetic(1, 1000, 3), dp=2,
                         batching="disaggregated", prefill_replicas=1)
    t, t_alone = r.run.served[0].token_times, alone.run.served[0].token_times
    assert t[0] == pytest.approx(t_alone[0], rel=1e-12)
    transfer = simulate_collective("p2p", 1000 * kv_bytes_per_token(L7, 2), 2,
                                   "dgx-h100").time_s
    assert t[1] - t[0] == pytest.approx(transfer + (t_alone[1] - t_alone[0]), rel=1e-9)
    assert r.run.steps == [1, 2]  # replica 0 prefilled, replica 1 decoded twice
    # with 2 sequence shards per replica each GPU holds and moves half the positions' KV
    sp = simulate_serving(L7, "dgx-h100", synthetic(1, 1000, 3), dp=2, sp=2,
                          batching="disaggregated", prefill_replicas=1)
    half = simulate_collective("p2p", 1000 * kv_bytes_per_token(L7, 2) / 2, 2,
                               "dgx-h100").time_s
    t = sp.run.served[0].token_times
    assert t[1] - t[0] == pytest.approx(half + sp.cost.time([(1, 1000)]), rel=1e-9)


def test_disaggregation_removes_prefill_interference():
    """Under load, on the same two GPUs: decode steps no longer wait behind prefills, so
    the inter-token latency's tail is shorter than two continuous replicas' (Little's law
    still holds on the two-stage system)."""
    reqs = synthetic(150, 1500, 100, 6.0, seed=7)
    cont = simulate_serving(L7, "dgx-h100", reqs, dp=2)
    dis = simulate_serving(L7, "dgx-h100", reqs, dp=2, batching="disaggregated",
                           prefill_replicas=1)
    assert all(len(s.token_times) == 100 for s in dis.run.served)
    assert dis.metrics["p99_itl_ms"] < cont.metrics["p99_itl_ms"]
    assert time_average_in_system(dis.run) == pytest.approx(
        dis.metrics["request_throughput"] * dis.metrics["mean_e2el_ms"] / 1e3, rel=1e-9)


@pytest.mark.parametrize("kwargs, words", [
    (dict(batching="disaggregated", dp=2), "go together"),
    (dict(prefill_replicas=1, dp=2), "go together"),
    (dict(batching="disaggregated", prefill_replicas=2, dp=2), "from 1 to dp - 1"),
])
def test_disaggregated_refusals(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        simulate_serving(L7, "dgx-h100", synthetic(2, 64, 8), **kwargs)


def test_sequence_parallel_prefill_splits_its_prompt_not_decodes_weights():
    """sp 2 (two shards, each with all the weights): a compute-bound 4000-token prefill
    runs half its GEMM and attention FLOPs per GPU plus a per-layer all-gather of the
    prompt's K and V; a decode step still reads all the weights (its token is not split),
    half the KV cache, plus a per-layer all-reduce of its attention output. So prefill
    speeds up about 2x, decode hardly."""
    q = 4000
    one = simulate_serving(L7, "dgx-h100", synthetic(1, q, 2))
    two = simulate_serving(L7, "dgx-h100", synthetic(1, q, 2), sp=2)
    d, heads = L7.hidden_size // L7.num_attention_heads, L7.num_attention_heads
    per_layer = (2 * (q / 2) * L7.layer_param_count()
                 + 4 * d * heads * q * (q + 1) / 2 / 2) / flops()
    gather = simulate_collective("all-gather", q * kv_bytes_per_token(L7, 2) / 32, 2,
                                 "dgx-h100").time_s
    head = L7.vocab_size * L7.hidden_size * 2 / hbm()
    assert two.metrics["mean_ttft_ms"] / 1e3 == pytest.approx(
        L7.num_layers * (per_layer + gather) + head, rel=1e-9)
    assert one.metrics["mean_ttft_ms"] / two.metrics["mean_ttft_ms"] > 1.8
    decode = lambda r: r.run.served[0].token_times[1] - r.run.served[0].token_times[0]
    weights = (L7.num_layers * L7.layer_param_count() + L7.vocab_size * L7.hidden_size) * 2
    kv = (q + 1) * kv_bytes_per_token(L7, 2) / 2
    reduce = simulate_collective("all-reduce", L7.hidden_size * 2, 2, "dgx-h100").time_s
    assert decode(two) == pytest.approx((weights + kv) / hbm() + L7.num_layers * reduce,
                                        rel=1e-9)
    assert decode(one) / decode(two) < 1.5
    assert two.capacity.blocks > 1.9 * one.capacity.blocks  # half the KV per GPU


def test_layout_search_ranks_every_split_of_the_gpus():
    """Every tp x pp x sp x dp split of 8 GPUs (tp dividing the heads) is simulated once;
    the ranking is by goodput under the SLO, refusals (here: not fitting) last with their
    reason, and the winner's metrics are a plain simulate_serving of its layout."""
    from clustersim.sim.serving.search import layouts, search
    l70 = get_model("llama3-70b")
    found = layouts(l70, 8, 8)
    assert len(set(found)) == len(found)
    assert all(x.tp * x.pp * x.sp * x.dp == 8 and 64 % x.tp == 0 for x in found)
    assert {(x.tp, x.pp, x.sp, x.dp) for x in found} >= {(8, 1, 1, 1), (1, 1, 1, 8),
                                                         (2, 2, 2, 1), (1, 8, 1, 1)}
    reqs = synthetic(30, 512, 32, 4.0, seed=4)
    ranked = search(l70, "dgx-h100", reqs, 8, slo={"tpot": 40})
    assert len(ranked) == len(found)
    runs = [c for c in ranked if c.result is not None]
    goodputs = [c.result.metrics["request_goodput"] for c in runs]
    assert goodputs == sorted(goodputs, reverse=True)
    assert ranked[len(runs):] and all("KV cache" in c.refused for c in ranked[len(runs):])
    best = runs[0].layout
    again = simulate_serving(l70, "dgx-h100", reqs, tp=best.tp, pp=best.pp, sp=best.sp,
                             dp=best.dp, slo={"tpot": 40})
    assert again.metrics == runs[0].result.metrics


def test_cli_layout_search(tmp_path):
    out = clustersim("serve", "--model", "llama2-7b", "--search-layouts", "2",
                     "--num-prompts", "8", "--input-len", "64", "--output-len", "4",
                     "--json", str(tmp_path / "s.json"))
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "s.json").read_text())["candidates"]
    assert {(r["tp"], r["pp"], r["sp"], r["dp"]) for r in rows} >= {(2, 1, 1, 1),
                                                                   (1, 1, 1, 2)}
    assert "simulate the best: clustersim serve ... -tp" in out.stdout
    bad = clustersim("serve", "--search-layouts", "2", "-tp", "2", "--num-prompts", "2")
    assert bad.returncode == 2 and "--tensor-parallel-size would change nothing" in bad.stderr


def test_parse_layout_rules():
    from clustersim.sim.serving.search import Layout, parse_layout
    assert parse_layout("tp=4,pp=2") == Layout(tp=4, pp=2, sp=1, dp=1, prefill=0)
    assert parse_layout("dp=4, prefill=1").gpus == 4
    for bad, says in (("tp=0", "tp must be an integer >= 1"), ("cp=2", "KEY one of"),
                      ("tp=2,tp=4", "gives tp twice"), ("tp", "KEY=N"),
                      ("prefill=-1", "prefill must be an integer >= 0")):
        with pytest.raises(ConfigError, match=says):
            parse_layout(bad)


def test_compare_runs_the_given_layouts_in_order():
    """--compare: each layout is a plain simulate_serving of it, in the order given, a
    refusal kept with its reason; DP of 2 replicas on a rate-limited workload halves each
    replica's load, so its output throughput equals the single replica's (every request
    served) and its mean latency is no higher."""
    from clustersim.sim.serving.search import Layout, compare
    reqs = synthetic(40, 256, 16, 8.0, seed=1)
    given = [Layout(tp=2), Layout(dp=2), Layout(tp=3)]
    out = compare(L7, "dgx-h100", reqs, given)
    assert [c.layout for c in out] == given
    for c in out[:2]:
        alone = simulate_serving(L7, "dgx-h100", reqs, tp=c.layout.tp, dp=c.layout.dp)
        assert c.result.metrics == alone.metrics
    assert out[2].result is None and "must divide" in out[2].refused
    one = simulate_serving(L7, "dgx-h100", reqs)
    assert out[1].result.metrics["completed"] == one.metrics["completed"] == 40
    assert out[1].result.metrics["mean_e2el_ms"] <= one.metrics["mean_e2el_ms"]


def test_cli_compare(tmp_path):
    out = clustersim("serve", "--model", "llama2-7b", "--compare", "tp=1", "tp=2",
                     "tp=1,dp=2,prefill=1", "--batching", "disaggregated", "--num-prompts",
                     "8", "--input-len", "64", "--output-len", "4",
                     "--json", str(tmp_path / "c.json"))
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["candidates"]
    assert [(r["tp"], r["dp"], r["prefill"]) for r in rows] == [(1, 1, 0), (2, 1, 0),
                                                               (1, 2, 1)]
    assert "refused" in rows[0] and "metrics" in rows[2]
    assert "tp 1 pp 1 sp 1 dp 2 (1 prefill)" in out.stdout
    for args, says in ((["--compare", "tp=2", "--dp", "2"], "--dp would change nothing"),
                       (["--compare", "tp=2", "--search-layouts", "2"], "give one"),
                       (["--compare", "tq=2"], "KEY one of"),
                       (["--search-layouts", "1", "--batching", "disaggregated"],
                        "needs at least 2 replicas")):
        bad = clustersim("serve", "--num-prompts", "2", *args)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr



def test_layout_table_says_when_throughput_follows_the_arrivals():
    """With requests arriving over time, out tok/s of a layout that keeps up is the
    arrival rate's, not its capacity: the table says so, with the offered rate (output
    tokens over the arrivals' span); with every request at t = 0 it says nothing."""
    from clustersim.sim.cli.serve_command import offered_load_note
    spread = synthetic(40, 64, 8, 4.0, 0)
    span = spread[-1].arrival - spread[0].arrival
    note = offered_load_note(spread)[0]
    assert f"arrive over {span:.2f} s, {40 * 8 / span:,.0f} output tok/s offered" in note
    assert offered_load_note(synthetic(40, 64, 8)) == []
    out = clustersim("serve", "--model", "llama2-7b", "--compare", "tp=1", "tp=2",
                     "--num-prompts", "8", "--input-len", "64", "--output-len", "4",
                     "--request-rate", "4")
    assert out.returncode == 0 and "output tok/s offered" in out.stdout, out.stderr
    goodput = clustersim("serve", "--model", "llama2-7b", "--compare", "tp=1", "--num-prompts",
                         "8", "--input-len", "64", "--output-len", "4", "--request-rate", "4",
                         "--goodput", "ttft:100")
    assert goodput.returncode == 0 and "offered" not in goodput.stdout, goodput.stderr


MIX = get_model("mixtral-8x7b")


def test_expert_parallel_weights_are_whole_experts_over_ep():
    """ep 8, tp 1 on Mixtral 8x7B: a GPU holds everything but the routed experts, and one
    of each layer's 8 experts whole: the model's parameters less 7/8 of the experts."""
    r = simulate_serving(MIX, "dgx-h100", synthetic(1, 64, 2), dp=8, ep=8)
    experts = MIX.num_layers * MIX.layer_expert_param_count()
    assert experts == 32 * 8 * 3 * 4096 * 14336  # SwiGLU experts, no bias
    assert r.cost.weight_bytes_per_gpu() == pytest.approx(
        (MIX.param_count() - experts * 7 / 8) * 2, rel=1e-12)
    assert r.cost.expert_params == 3 * 4096 * 14336


def test_expert_parallel_step_closed_form():
    """One EP group's routed experts for N new tokens over ep GPUs: 2 N k / ep x expert
    FLOPs (uniform routing), reading the experts reached, E/ep (1 - (1 - k/E)^N); two
    all-to-alls per MoE layer of ceil(T/tp) k h x 2 bytes (T the largest replica's tokens),
    priced by the collective model on the group's GPUs."""
    r = simulate_serving(MIX, "dgx-h100", synthetic(1, 64, 2), tp=2, dp=4, ep=8)
    c, k, h = r.cost, 2, 4096
    expert = 3 * h * 14336
    for tokens in ([4096, 0, 0, 0], [1, 1, 1, 1], [300, 7, 0, 2]):
        n = sum(tokens)
        flops_time = 2 * n * k / 8 * expert / flops()
        bytes_time = 1 * (1 - (1 - k / 8) ** n) * expert * 2 / hbm()
        a2a = simulate_collective("all-to-all", math.ceil(max(tokens) / 2) * k * h * 2, 8,
                                  "dgx-h100").time_s
        compute, communication = c.expert_parallel_parts(tokens)
        assert compute == pytest.approx(32 * max(flops_time, bytes_time), rel=1e-9)
        assert communication == pytest.approx(32 * 2 * a2a, rel=1e-9)
    assert c.expert_parallel_parts([0, 0]) == (0.0, 0.0)


def test_expert_parallel_replicas_step_together():
    """dp 2, ep 2 (tp 1): two requests at once, one per replica, of different prompts:
    the replicas' prefill steps start and end together, taking the longer replica's own
    step plus the group's routed experts; one request alone still steps with the group
    (the idle replica runs a dummy batch) at its own step plus the experts of its tokens."""
    reqs = synthetic(2, 64, 2)
    reqs[1] = type(reqs[1])(1, 0.0, 1024, 2)
    r = simulate_serving(MIX, "dgx-h100", reqs, dp=2, ep=2)
    first = [log[0] for log in r.run.step_log]
    assert first[0].start == first[1].start == 0 and first[0].end == first[1].end
    c = r.cost
    own = max(sum(c.parts([(64, 0)])), sum(c.parts([(1024, 0)])))
    assert first[0].end == pytest.approx(own + sum(c.expert_parallel_parts([64, 1024])))
    alone = simulate_serving(MIX, "dgx-h100", reqs[:1], dp=2, ep=2)
    step = alone.run.step_log[0][0]
    assert step.end - step.start == pytest.approx(sum(c.parts([(64, 0)]))
                                                  + sum(c.expert_parallel_parts([64])))
    assert alone.run.step_log[1] == []


@pytest.mark.parametrize("kwargs, words", [
    (dict(model=L7, dp=2, ep=2), "the model has no experts"),
    (dict(tp=4, dp=2, ep=2), "ep must be tensor_parallel_size x a divisor of dp"),
    (dict(dp=3, ep=2), "ep must be tensor_parallel_size x a divisor of dp"),
    (dict(tp=2, pp=2, ep=2), "pipeline or sequence parallelism"),
    (dict(dp=2, ep=2, batching="disaggregated", prefill_replicas=1), "disaggregated"),
])
def test_expert_parallel_refusals(kwargs, words):
    model = kwargs.pop("model", MIX)
    with pytest.raises(ConfigError, match=words):
        simulate_serving(model, "dgx-h100", synthetic(2, 64, 2), **kwargs)


def test_expert_parallel_fits_what_dp_alone_cannot():
    """Mixtral 8x7B's 93 GB of bf16 weights do not fit one 80 GB H100 (dp 8 refused); with
    ep 8 each GPU holds one expert of each layer and the 8 replicas serve."""
    reqs = synthetic(64, 256, 16)
    with pytest.raises(ConfigError, match="no memory left"):
        simulate_serving(MIX, "dgx-h100", reqs, dp=8)
    r = simulate_serving(MIX, "dgx-h100", reqs, dp=8, ep=8)
    assert r.metrics["completed"] == 64 and all(r.run.steps)


def test_cli_expert_parallel(tmp_path):
    out = clustersim("serve", "--model", "mixtral-8x7b", "--dp", "8", "--ep", "8",
                     "--num-prompts", "16", "--input-len", "128", "--output-len", "4")
    assert out.returncode == 0, out.stderr
    assert "tp 1 x pp 1 x sp 1 x dp 8 x ep 8" in out.stdout
    assert "routed uniformly over the 8 experts" in out.stdout


def test_disaggregated_search_tries_every_prefill_split():
    """4 GPUs, disaggregated: every layout of dp >= 2 replicas once per prefill count 1 to
    dp - 1 (dp 4: 3 splits, dp 2: 1), each a plain simulate_serving of it."""
    from clustersim.sim.serving.search import layouts, search
    found = layouts(L7, 4, 8, disaggregated=True)
    assert all(1 <= x.prefill < x.dp for x in found)
    assert [x.prefill for x in found if (x.tp, x.pp, x.sp) == (1, 1, 1)] == [1, 2, 3]
    assert [x.prefill for x in found if (x.tp, x.pp, x.sp) == (2, 1, 1)] == [1]
    reqs = synthetic(20, 256, 8, 4.0, seed=2)
    ranked = search(L7, "dgx-h100", reqs, 4, batching="disaggregated")
    assert len(ranked) == len(found)
    best = next(c for c in ranked if c.result is not None)
    again = simulate_serving(L7, "dgx-h100", reqs, tp=best.layout.tp, pp=best.layout.pp,
                             sp=best.layout.sp, dp=best.layout.dp,
                             prefill_replicas=best.layout.prefill, batching="disaggregated")
    assert again.metrics == best.result.metrics
