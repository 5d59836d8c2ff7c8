"""Run flags from files (sim/cli/config_files.py and its translators): one run given by
flags, by YAML, by TOML, by a DeepSpeed JSON and by a torchtitan TOML resolves to the same
plan and iteration time; Megatron-LM's own GPT-3 175B example argument list simulates with
Megatron's defaults (fp32 unless --bf16/--fp16, gradients reduced after the backward, the
GPT-2 vocabulary padded to 128 tp); unknown keys and bad values are one error naming the
file and the key; the command line overrides a file."""
import json

import pytest

from clustersim.schedules.timeline import Timeline
from clustersim.sim.cli import main

FLAGS = ["--model", "llama3-8b", "--tp", "2", "--pp", "2", "--dp", "2",
         "--micro-batch-size", "1", "--global-batch-size", "16", "--zero", "1",
         "--sequence-parallel", "--recompute", "selective"]
YAML = """model: llama3-8b
tp: 2
pipeline-model-parallel-size: 2
dp: 2
micro_batch_size: 1
global-batch-size: 16
zero: 1
sequence_parallel: true
recompute: selective
"""
TOML = """model = "llama3-8b"
tensor_model_parallel_size = 2
pp = 2
dp = 2
micro-batch-size = 1
global_batch_size = 16
zero-stage = 1
sequence-parallel = true
recompute = "selective"
"""
DEEPSPEED = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1,
             "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
             "zero_optimization": {"stage": 1, "overlap_comm": True,
                                   "contiguous_gradients": True},
             "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
             "steps_per_print": 10, "gradient_clipping": 1.0}
DEEPSPEED_REST = ["--model", "llama3-8b", "--tp", "2", "--pp", "2", "--dp", "2",
                  "--sequence-parallel", "--recompute", "selective"]
TORCHTITAN = """[job]
dump_folder = "./outputs"
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 8
global_batch_size = 16
seq_len = 8192
mixed_precision_param = "bfloat16"
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 1
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_microbatch_size = 1
pipeline_parallel_schedule = "1F1B"
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[compile]
enable = true
"""
# Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh: its argument arrays as passed
MEGATRON_175B = """--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048
--max-position-embeddings 2048 --attention-backend auto
--micro-batch-size 1 --global-batch-size 1536 --rampup-batch-size 16 16 5859375
--train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
--init-method-std 0.006 --clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine
--min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000
--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
--data-path /data/gpt_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
--split 949,50,1 --log-interval 100 --save-interval 10000 --eval-interval 1000
--save /ckpt --load /ckpt --eval-iters 10 --tensorboard-dir /tb
"""


def run(tmp_path, argv, name="t"):
    """The Timeline of `clustersim simulate argv` (exit 0 asserted)."""
    out = tmp_path / f"{name}.json"
    assert main(["simulate", *argv, "--output", str(tmp_path / f"{name}.html"),
                 "--timeline-json", str(out)]) == 0
    return Timeline.load(out)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_flags_yaml_toml_deepspeed_and_torchtitan_give_one_run(tmp_path):
    runs = {
        "flags": FLAGS,
        "yaml": ["--config", write(tmp_path, "run.yaml", YAML)],
        "toml": ["--config", write(tmp_path, "run.toml", TOML)],
        "deepspeed": ["--deepspeed-config", write(tmp_path, "ds.json", json.dumps(DEEPSPEED)),
                      *DEEPSPEED_REST],
        "torchtitan": ["--torchtitan-config", write(tmp_path, "job.toml", TORCHTITAN),
                       "--zero", "1"],  # torchtitan's replicate-only dp is DDP: ZeRO-1 given
    }
    timelines = {name: run(tmp_path, argv, name) for name, argv in runs.items()}
    reference = timelines["flags"]
    assert reference.meta["plan"]["parallel"]["zero_stage"] == 1
    for name, timeline in timelines.items():
        assert timeline.meta["plan"] == reference.meta["plan"], name
        assert timeline.iteration_time == reference.iteration_time, name


def test_megatrons_gpt3_175b_example_arguments_simulate(tmp_path, capsys):
    args = write(tmp_path, "args.txt", MEGATRON_175B)
    timeline = run(tmp_path, ["--megatron-args", args, "--dp", "4", "--global-batch-size",
                              "64", "--topology", "dgx-superpod-h100-4su"])
    plan = timeline.meta["plan"]
    spec, parallel = plan["model_spec"], plan["parallel"]
    assert (plan["tp"], plan["pp"], plan["dp"]) == (8, 16, 4)
    assert spec["num_layers"] == 96 and spec["dtype"] == "fp16"
    assert spec["vocab_size"] == 51200  # 50,257 rounded up to a multiple of 128 * 8
    assert parallel["overlap_grad_reduce"] is False  # Megatron's default
    err = capsys.readouterr().err
    assert "ignored, no effect on a modelled time or byte" in err and "--lr," in err


def test_megatron_defaults_to_fp32_and_mha(tmp_path, capsys):
    args = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
            "--num-query-groups", "2", "--seq-length", "256", "--vocab-size", "1024"]
    timeline = run(tmp_path, ["--pp", "2", "--microbatches", "2", "--", *args])
    spec = timeline.meta["plan"]["model_spec"]
    assert spec["dtype"] == "fp32" and spec["num_query_groups"] == 8
    assert "--num-query-groups without --group-query-attention" in capsys.readouterr().err
    grouped = run(tmp_path, ["--pp", "2", "--microbatches", "2", "--", *args,
                             "--group-query-attention", "--bf16"], "g")
    assert grouped.meta["plan"]["model_spec"]["num_query_groups"] == 2
    assert grouped.meta["plan"]["model_spec"]["dtype"] == "bf16"


def test_the_command_line_overrides_a_file(tmp_path):
    timeline = run(tmp_path, ["--config", write(tmp_path, "run.yaml", YAML), "--pp", "1",
                              "--no-overlap-grad-reduce"])
    assert timeline.meta["plan"]["pp"] == 1 and timeline.meta["plan"]["tp"] == 2
    assert timeline.meta["plan"]["parallel"]["overlap_grad_reduce"] is False


@pytest.mark.parametrize("option, name, text, words", [
    ("--config", "run.yaml", "tensor_paralel: 2\n", ["run.yaml", "'tensor_paralel'"]),
    ("--config", "run.toml", 'tp = "two"\n', ["run.toml", "'tp'", "invalid int value"]),
    ("--config", "run.yaml", "sequence_parallel: 3\n", ["run.yaml", "true or false"]),
    ("--config", "run.ini", "tp=2\n", ["run.ini", ".yaml, .yml, .toml or .json"]),
    ("--config", "run.yaml", "tp: [\n", ["run.yaml", "not valid YAML"]),
    ("--deepspeed-config", "ds.json", '{"zero_optimization": {"stagee": 1}}',
     ["ds.json", "'zero_optimization.stagee'"]),
    ("--deepspeed-config", "ds.json", '{"zero_optimization": {"stage": 7}}',
     ["ds.json", "zero_optimization.stage", "invalid choice"]),
    ("--deepspeed-config", "ds.json", '{"optimizer": {"type": "Lamb"}}', ["ds.json", "Adam"]),
    ("--torchtitan-config", "job.toml", "[parallelism]\ntensor_paralel_degree = 2\n",
     ["job.toml", "'parallelism.tensor_paralel_degree'"]),
    ("--torchtitan-config", "job.toml",
     '[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "none"\n'
     '[parallelism]\ndata_parallel_shard_degree = -1\n', ["job.toml", "world size"]),
    ("--megatron-args", "args.txt", "--num-layers 4 --frobnicate 3\n",
     ["args.txt", "unrecognized arguments: --frobnicate"]),
    ("--megatron-args", "args.txt", "--num-layers 4 --seq-length 128 "
     "--max-position-embeddings 4096\n", ["args.txt", "--max-position-embeddings 4096"]),
])
def test_a_bad_file_is_one_error_naming_file_and_key(tmp_path, capsys, option, name, text,
                                                       words):
    path = write(tmp_path, name, text)
    assert main(["simulate", option, path, "--output", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert all(word in err for word in words), err


@pytest.mark.parametrize("flags, field, value", [
    (["--bf16"], "dtype", "bf16"), (["--fp16"], "dtype", "fp16"),
    (["--recompute-activations"], "recompute", "selective"),
    (["--optimizer-cpu-offload", "--zero", "1"], "offload", True),
    (["--ddp-bucket-size", "40000000", "--dp", "2"], "bucket_bytes", 80_000_000),
    (["--num-layers-per-virtual-pipeline-stage", "2", "--schedule", "interleaved-1f1b"],
     "vpp", 8)])
def test_megatron_spellings_on_the_command_line(tmp_path, flags, field, value):
    timeline = run(tmp_path, ["--model", "llama3-8b", "--pp", "2", "--microbatches", "4",
                              "--topology", "dgx-h100", *flags])
    plan = timeline.meta["plan"]
    found = plan["model_spec"].get(field, plan["parallel"].get(field))
    assert found == value
