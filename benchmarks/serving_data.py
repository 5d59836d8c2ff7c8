"""Published LLM serving measurements to check `clustersim serve` against (issue 21):
data with its sources, no simulation (benchmarks/serving.py simulates them).

A number here is the source's, verbatim (`quote`: the table row it comes from). `metric`:
`output_throughput_per_gpu` (output tokens/s per GPU of a static batch, TensorRT-LLM's
gptSessionBenchmark: batch x output_len / the batch's latency / GPUs),
`first_token_latency_ms` (batch 1, one output token: the prefill), `e2e_latency_ms` (vLLM
benchmark_latency: one batch of `batch_size` prompts, mean over iterations). `precision`:
fp8 = FP8 weights, GEMMs and KV cache (TensorRT-LLM's FP8 tables), fp16/bf16 = both.
`topology`: the preset the run is simulated on (the sources' A100s are not said to be
SXM4-80GB; simulated as DGX A100's). `excluded`: why a source's rows are not simulated
(decided from the source alone, before simulating). The Mixtral rows were first left out
because MoE serving was not modelled; they are simulated since it is (experts sharded over
the TP group).

Collected 2026-11-28 from TensorRT-LLM's performance pages (0.9.0 via a fork pinned by
commit, 0.6.1 upstream) and vLLM's CI benchmark page (research notes in the closing note
of that stop).
"""
from __future__ import annotations

POINTS: list[dict] = [
    dict(
        id='trt090-h100-7b-128-128',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=896,
        input_len=128,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=19854,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 896 | 1 | 128 | 128 | 19,854 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-7b-128-2048',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=120,
        input_len=128,
        output_len=2048,
        metric='output_throughput_per_gpu',
        value=6944,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 120 | 1 | 128 | 2048 | 6,944 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-7b-2048-128',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=84,
        input_len=2048,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=2163,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 84 | 1 | 2048 | 128 | 2,163 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-7b-2048-2048',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=56,
        input_len=2048,
        output_len=2048,
        metric='output_throughput_per_gpu',
        value=2826,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 56 | 1 | 2048 | 2048 | 2,826 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-70b-128-128',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-h100',
        tp=2,
        precision='fp8',
        batch_size=1024,
        input_len=128,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=3214,
        unit='out tok/s/GPU',
        quote='| LLaMA 70B | 1024 | 2 | 128 | 128 | 3,214 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-70b-2048-128',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-h100',
        tp=2,
        precision='fp8',
        batch_size=96,
        input_len=2048,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=346,
        unit='out tok/s/GPU',
        quote='| LLaMA 70B | 96 | 2 | 2048 | 128 | 346 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-70b-2048-2048',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-h100',
        tp=2,
        precision='fp8',
        batch_size=64,
        input_len=2048,
        output_len=2048,
        metric='output_throughput_per_gpu',
        value=1011,
        unit='out tok/s/GPU',
        quote='| LLaMA 70B | 64 | 2 | 2048 | 2048 | 1,011 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-7b-128-128',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-a100',
        tp=1,
        precision='fp16',
        batch_size=256,
        input_len=128,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=5390,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 256 | 1 | 128 | 128 | 5,390 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-7b-2048-2048',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-a100',
        tp=1,
        precision='fp16',
        batch_size=16,
        input_len=2048,
        output_len=2048,
        metric='output_throughput_per_gpu',
        value=603,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 16 | 1 | 2048 | 2048 | 603 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-70b-128-128',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-a100',
        tp=4,
        precision='fp16',
        batch_size=1024,
        input_len=128,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=686,
        unit='out tok/s/GPU',
        quote='| LLaMA 70B | 1024 | 4 | 128 | 128 | 686 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-70b-2048-2048',
        source='TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching)',
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-a100',
        tp=4,
        precision='fp16',
        batch_size=64,
        input_len=2048,
        output_len=2048,
        metric='output_throughput_per_gpu',
        value=289,
        unit='out tok/s/GPU',
        quote='| LLaMA 70B | 64 | 4 | 2048 | 2048 | 289 |',
        excluded=None,
    ),
    dict(
        id='trt061-h100-7b-128-128',
        source='TensorRT-LLM 0.6.1, gptSessionBenchmark (static batching), --fp8_kv_cache',
        url=(
            'https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c472'
            '97d8c06bafac73/docs/source/performance.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=768,
        input_len=128,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=19694,
        unit='out tok/s/GPU',
        quote='| LLaMA 7B | 768 | 1 | 128 | 128 | 19,694 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-7b-ftl-128',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=1,
        input_len=128,
        output_len=1,
        metric='first_token_latency_ms',
        value=6.3,
        unit='ms',
        quote='| LLaMA 7B | 1 | 1 | 128 | 6.3 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-7b-ftl-2048',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-h100',
        tp=1,
        precision='fp8',
        batch_size=1,
        input_len=2048,
        output_len=1,
        metric='first_token_latency_ms',
        value=30.8,
        unit='ms',
        quote='| LLaMA 7B | 1 | 1 | 2048 | 30.8 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-70b-ftl-128',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-h100',
        tp=4,
        precision='fp8',
        batch_size=1,
        input_len=128,
        output_len=1,
        metric='first_token_latency_ms',
        value=19.6,
        unit='ms',
        quote='| LLaMA 70B | 1 | 4 | 128 | 19.6 |',
        excluded=None,
    ),
    dict(
        id='trt090-h100-70b-ftl-2048',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-h100',
        tp=8,
        precision='fp8',
        batch_size=1,
        input_len=2048,
        output_len=1,
        metric='first_token_latency_ms',
        value=85.1,
        unit='ms',
        quote='| LLaMA 70B | 1 | 8 | 2048 | 85.1 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-7b-ftl-128',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-a100',
        tp=1,
        precision='fp16',
        batch_size=1,
        input_len=128,
        output_len=1,
        metric='first_token_latency_ms',
        value=16.2,
        unit='ms',
        quote='| LLaMA 7B | 1 | 1 | 128 | 16.2 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-7b-ftl-2048',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-7b',
        topology='dgx-a100',
        tp=1,
        precision='fp16',
        batch_size=1,
        input_len=2048,
        output_len=1,
        metric='first_token_latency_ms',
        value=132.4,
        unit='ms',
        quote='| LLaMA 7B | 1 | 1 | 2048 | 132.4 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-70b-ftl-128',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-a100',
        tp=4,
        precision='fp16',
        batch_size=1,
        input_len=128,
        output_len=1,
        metric='first_token_latency_ms',
        value=45.6,
        unit='ms',
        quote='| LLaMA 70B | 1 | 4 | 128 | 45.6 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-70b-ftl-2048',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='llama2-70b',
        topology='dgx-a100',
        tp=8,
        precision='fp16',
        batch_size=1,
        input_len=2048,
        output_len=1,
        metric='first_token_latency_ms',
        value=249.2,
        unit='ms',
        quote='| LLaMA 70B | 1 | 8 | 2048 | 249.2 |',
        excluded=None,
    ),
    dict(
        id='vllm-ci-h200-8b-tp1',
        source=(
            'vLLM CI performance benchmark build 9515 (benchmark_latency: 32 in, '
            '128 out, batch 8; version not shown)'),
        url='https://buildkite.com/vllm/performance-benchmark/builds/9515',
        model='llama3-8b',
        topology='dgx-h200',
        tp=1,
        precision='bf16',
        batch_size=8,
        input_len=32,
        output_len=128,
        metric='e2e_latency_ms',
        value=833.421,
        unit='ms',
        quote='latency_llama8B_tp1 | H200 | 833.421 | 833.53 |',
        excluded=None,
    ),
    dict(
        id='vllm-ci-h200-70b-tp4',
        source=(
            'vLLM CI performance benchmark build 9515 (benchmark_latency: 32 in, '
            '128 out, batch 8; version not shown)'),
        url='https://buildkite.com/vllm/performance-benchmark/builds/9515',
        model='llama3-70b',
        topology='dgx-h200',
        tp=4,
        precision='bf16',
        batch_size=8,
        input_len=32,
        output_len=128,
        metric='e2e_latency_ms',
        value=2077.53,
        unit='ms',
        quote='latency_llama70B_tp4 | H200 | 2077.53 | 2077.56 | 2079.95 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-mixtral-128-128',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching); experts '
            'sharded over TP (its default then; the page does not say)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='mixtral-8x7b',
        topology='dgx-a100',
        tp=2,
        precision='fp16',
        batch_size=512,
        input_len=128,
        output_len=128,
        metric='output_throughput_per_gpu',
        value=2842,
        unit='out tok/s/GPU',
        quote='| Mixtral 8x7B | 512 | 2 | 128 | 128 | 2,842 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-mixtral-2048-2048',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching); experts '
            'sharded over TP (its default then; the page does not say)'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='mixtral-8x7b',
        topology='dgx-a100',
        tp=2,
        precision='fp16',
        batch_size=32,
        input_len=2048,
        output_len=2048,
        metric='output_throughput_per_gpu',
        value=801,
        unit='out tok/s/GPU',
        quote='| Mixtral 8x7B | 32 | 2 | 2048 | 2048 | 801 |',
        excluded=None,
    ),
    dict(
        id='trt090-a100-mixtral-ftl-2048',
        source=(
            'TensorRT-LLM 0.9.0, gptSessionBenchmark (static batching), low-latency '
            'table (batch 1, first-token latency); experts sharded over TP'),
        url=(
            'https://github.com/WhiteD2125/TensorRT-LLM/blob/6ad7cf1bcc08e31990c62b'
            'a929a8e84f35667654/docs/source/performance/perf-overview.md'),
        model='mixtral-8x7b',
        topology='dgx-a100',
        tp=2,
        precision='fp16',
        batch_size=1,
        input_len=2048,
        output_len=1,
        metric='first_token_latency_ms',
        value=160.9,
        unit='ms',
        quote='| Mixtral 8x7B | 1 | 2 | 2048 | 160.9 |',
        excluded=None,
    ),
    dict(
        id='trt061-a100-70b-128-128',
        source='TensorRT-LLM 0.6.1 Llama 2 70B A100 TP4 670 out tok/s',
        url=(
            'https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c472'
            '97d8c06bafac73/docs/source/performance.md'),
        excluded='unit ambiguous: the A100 table says out tok/s, the H100 one out tok/s/GPU',
    ),
    dict(
        id='trt05-h200-blog',
        source='TensorRT-LLM 0.5 H200 launch blog rows',
        url=(
            'https://github.com/NVIDIA/TensorRT-LLM/blob/1555478c1b417a0b34de052098'
            '62ea5a2ab9add1/docs/source/blogs/H200launch.md'),
        excluded='"preliminary measured performance, subject to change", KV-cache dtype not stated',
    ),
    dict(
        id='nemo-llama2',
        source='NeMo Framework Llama 2 inference latencies',
        url='https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/llama.html',
        excluded='precision and software version not stated',
    ),
    dict(
        id='nim-llama33',
        source='NVIDIA NIM Llama 3.3 70B concurrency-1 rows',
        url='https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance.md',
        excluded='serving engine and KV-cache dtype not stated',
    ),
    dict(
        id='trt014-inflight',
        source='TensorRT-LLM 0.14.0 and 1.0 in-flight batching throughput tables',
        url=(
            'https://github.com/arthurrasmusson/TensorRT-LLM/blob/e00d4e6564921307d'
            'd264b61fe1d46f116095e0e/docs/source/performance/perf-overview.md'),
        excluded='trtllm-bench chooses the batch and token limits per run; they are not stated',
    ),
    dict(
        id='sglang-vllm-sharegpt',
        source='SGLang v0.3.0 / vLLM v0.6.0 ShareGPT runs',
        url=(
            'https://github.com/sgl-project/sglang/blob/120affb9613cc3f5bcd055ec09c'
            '7621d3ced0ebc/benchmark/benchmark_vllm_060/README.md'),
        excluded=(
            "ShareGPT requests: each request's lengths come from the dataset "
            'sample, not given'),
    ),
    dict(
        id='vllm-ci-h200-mixtral-tp2',
        source=(
            'vLLM CI performance benchmark build 9515 (benchmark_latency: 32 in, 128 '
            'out, batch 8; version not shown); experts sharded over TP (vLLM default)'),
        url=(
            'https://buildkite.com/vllm/performance-benchmark/builds/9515'),
        model='mixtral-8x7b',
        topology='dgx-h200',
        tp=2,
        precision='bf16',
        batch_size=8,
        input_len=32,
        output_len=128,
        metric='e2e_latency_ms',
        value=1917.44,
        unit='ms',
        quote='latency_mixtral8x7B_tp2 | H200 | 1917.44 | 1916.58 | 1929 |',
        excluded=None,
    ),
]
