"""A Megatron-LM argument list, pasted as its training script passes it
(`clustersim simulate -- $(cat args.txt)` or `--megatron-args FILE`), as this CLI's flags
(sim.cli.config_files).

Most of Megatron's model and parallel flags are this CLI's own spellings (sim.cli.flags)
and pass through. Where Megatron's defaults differ from this CLI's, the list gets
Megatron's: fp32 unless --bf16 or --fp16 (arguments.py: params_dtype), gradients reduced
after the backward unless --overlap-grad-reduce, MHA unless --group-query-attention (its
--num-query-groups is read only with that switch). Megatron takes its vocabulary from
the tokenizer: a GPT-2 BPE tokenizer (--merge-file, or --tokenizer-type
GPT2BPETokenizer) has 50,257 tokens, padded to a multiple of
--make-vocab-size-divisible-by (default 128) times tp (_vocab_size_with_padding). It takes
dp from the launch's world size, which the list does not hold: give --dp. Flags that
change no modelled time or byte (learning rate, data, logging, checkpoint paths, ...) are
accepted and listed in a note; any other flag is an error naming it.
"""
from __future__ import annotations

import shlex

from clustersim.schedules.errors import ConfigError
from clustersim.user_files import read_text

GPT2_VOCAB = 50257  # GPT-2's BPE vocabulary (Radford et al. 2019), Megatron's GPT2BPETokenizer
MAX_ARGS_BYTES = 1 << 20

IGNORED: dict[str, int] = {  # flag -> values it takes; none changes a modelled time or byte
    **dict.fromkeys((
        "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples",
        "--lr-warmup-fraction", "--lr-warmup-iters", "--lr-warmup-samples",
        "--lr-warmup-init", "--train-iters", "--train-samples", "--weight-decay",
        "--start-weight-decay", "--end-weight-decay", "--weight-decay-incr-style",
        "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std", "--clip-grad",
        "--log-interval", "--save-interval", "--eval-interval", "--eval-iters",
        "--exit-interval", "--save", "--load", "--vocab-file", "--merge-file",
        "--tokenizer-model", "--split", "--tensorboard-dir", "--seed",
        "--hidden-dropout", "--attention-dropout", "--data-cache-path",
        "--distributed-timeout-minutes", "--num-workers", "--wandb-project",
        "--wandb-exp-name", "--wandb-save-dir", "--timing-log-level", "--ckpt-format",
        "--dataloader-type", "--loss-scale", "--initial-loss-scale", "--min-loss-scale",
        "--loss-scale-window", "--hysteresis", "--distributed-backend",
        "--tensorboard-log-interval", "--tokenizer-type", "--make-vocab-size-divisible-by",
        "--max-position-embeddings", "--transformer-impl"), 1),
    **dict.fromkeys((
        "--use-mcore-models", "--no-gradient-accumulation-fusion",
        "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
        "--fp16-lm-cross-entropy", "--use-checkpoint-args", "--no-load-optim",
        "--no-load-rng", "--finetune", "--reset-position-ids", "--reset-attention-mask",
        "--eod-mask-loss", "--log-throughput", "--log-timers-to-tensorboard",
        "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
        "--log-num-zeros-in-grad", "--apply-query-key-layer-scaling",
        "--attention-softmax-in-fp32", "--no-async-tensor-model-parallel-allreduce",
        "--log-params-norm", "--group-query-attention", "--overlap-grad-reduce", "--bf16",
        "--fp16"), 0),
    "--rampup-batch-size": 3,  # the simulated iteration runs at the full global batch
    "--data-path": -1, "--train-data-path": -1, "--valid-data-path": -1,
    "--test-data-path": -1,  # nargs='+'
}
"""Flags read below (--bf16, --fp16, --overlap-grad-reduce, --group-query-attention, the
tokenizer's) are listed too: they are taken out of the list and translated."""
REFUSED = {
    "--accumulate-allreduce-grads-in-fp32": "fp32 gradient reduction (twice the 16-bit "
                                            "bytes) is not modelled",
    "--optimizer": "only Adam's states and step are modelled (leave the flag out)",
}


def read_args(path: str) -> list[str]:
    """The argument list in file `path`, split as a shell splits it (comments dropped)."""
    text = read_text(path, f"--megatron-args {path}", ConfigError, MAX_ARGS_BYTES)
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as err:
        raise ConfigError(f"--megatron-args {path}: cannot split it as a shell does: "
                          f"{err}") from None


def tokens(args: list[str], source: str) -> tuple[list[str], list[str]]:
    """This CLI's tokens for Megatron argument list `args`, and the notes (module
    docstring)."""
    kept, ignored, values = [], [], {}
    i = 0
    while i < len(args):
        flag, _, inline = args[i].partition("=")
        if flag in REFUSED and not (flag == "--optimizer" and _value(args, i, inline) == "adam"):
            raise ConfigError(f"{source}: {flag}: {REFUSED[flag]}")
        if flag in IGNORED:
            count = IGNORED[flag]
            if count < 0:  # one or more values, up to the next flag
                count = next((j for j, a in enumerate(args[i + 1:]) if a.startswith("--")),
                             len(args) - i - 1)
            taken = [inline] if inline else args[i + 1:i + 1 + count]
            values[flag] = taken
            ignored.append(flag)
            i += 1 + (0 if inline else count)
            continue
        if flag == "--optimizer":
            i += 1 if inline else 2
            continue
        kept.append(args[i])
        i += 1
    return _translated(kept, values, source, ignored)


def _value(args: list[str], i: int, inline: str) -> str:
    return inline or (args[i + 1] if i + 1 < len(args) else "")


def _translated(kept: list[str], values: dict[str, list[str]], source: str,
                ignored: list[str]) -> tuple[list[str], list[str]]:
    """Megatron's defaults where they differ from this CLI's (module docstring)."""
    out = ["--megatron-defaults", "--dtype", "fp32"]  # sim.cli.flags.parallel_from_args
    notes = []
    for flag in ("--bf16", "--fp16", "--overlap-grad-reduce"):
        if flag in values:
            out.append(flag)
    if "--bf16" not in values and "--fp16" not in values:
        notes.append(f"{source}: dtype fp32, Megatron's without --bf16 or --fp16")
    if "--overlap-grad-reduce" not in values:
        notes.append(f"{source}: with data parallelism, gradients reduced after the backward "
                     f"(Megatron's default without --overlap-grad-reduce)")
    if (any(a.split("=")[0] == "--num-query-groups" for a in kept)
            and "--group-query-attention" not in values):
        kept = _without(kept, "--num-query-groups")
        notes.append(f"{source}: --num-query-groups without --group-query-attention is "
                     f"ignored, as Megatron ignores it (one KV group per head)")
    if not any(a.split("=")[0] == "--vocab-size" for a in kept):
        vocab = _vocab(kept, values)
        if vocab is not None:
            out += ["--vocab-size", str(vocab)]
            notes.append(f"{source}: vocabulary {vocab:,}: GPT-2's {GPT2_VOCAB:,} BPE tokens "
                         f"(the tokenizer the list names), padded as Megatron pads it")
    if not any(a.split("=")[0] in ("--dp", "--data-parallel-size") for a in kept):
        notes.append(f"{source}: Megatron takes dp from the launch's world size, which the "
                     f"list does not hold: dp is the command line's --dp (default 1)")
    _check_positions(kept, values, source)
    real = [flag for flag in ignored if flag not in TRANSLATED]
    if real:
        notes.append(f"{source}: ignored, no effect on a modelled time or byte: "
                     f"{', '.join(sorted(set(real)))}")
    return out + kept, notes


TRANSLATED = ("--bf16", "--fp16", "--overlap-grad-reduce", "--group-query-attention",
              "--tokenizer-type", "--merge-file", "--vocab-file",
              "--make-vocab-size-divisible-by", "--max-position-embeddings")


def _without(args: list[str], flag: str) -> list[str]:
    out, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a == flag:
            skip = 1
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def _after(args: list[str], names: tuple[str, ...], default: str | None = None) -> str | None:
    """The value of the last of `names` in `args`, or `default`."""
    found = default
    for i, a in enumerate(args):
        flag, _, inline = a.partition("=")
        if flag in names:
            found = inline or (args[i + 1] if i + 1 < len(args) else default)
    return found


def _vocab(kept: list[str], values: dict[str, list[str]]) -> int | None:
    """GPT-2's vocabulary padded to a multiple of make-vocab-size-divisible-by * tp, when
    the list names a GPT-2 BPE tokenizer; else None (the model flags must give it)."""
    tokenizer = (values.get("--tokenizer-type") or [None])[0]
    if tokenizer != "GPT2BPETokenizer" and not (tokenizer is None and "--merge-file" in values):
        return None
    multiple = int((values.get("--make-vocab-size-divisible-by") or ["128"])[0])
    tp = int(_after(kept, ("--tp", "--tensor-model-parallel-size"), "1"))
    step = multiple * tp
    return -(-GPT2_VOCAB // step) * step


def _check_positions(kept: list[str], values: dict[str, list[str]], source: str) -> None:
    """--max-position-embeddings sizes the learned position table: modelled only as the
    sequence length (or unused, with rotary embeddings)."""
    given = values.get("--max-position-embeddings")
    seq = _after(kept, ("--seq-length",))
    rope = _after(kept, ("--position-embedding-type",)) == "rope"
    if given and seq and given[0] != seq and not rope:
        raise ConfigError(f"{source}: --max-position-embeddings {given[0]} differs from "
                          f"--seq-length {seq}: a learned position table of other than "
                          f"seq-length rows is not modelled")
