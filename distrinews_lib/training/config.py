"""One typed run configuration: the defaults below < the preset (--config; auto picks by GPUs) < the flags.

A preset's values are read as text (YAML's own types would make `amp: off` False and `batch_size: true` 1),
then converted and checked exactly like the same flag, so every message speaks of what the user wrote.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import yaml

from ..checkpoint import DEFAULT_CHECKPOINT
from ..data.tokenization import TRUNCATIONS
from ..devices import gpu_count
from ..errors import UserError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "presets"  # inside the package: a pip install has them too
PRESETS = ("cpu_smoke", "single_gpu", "kaggle_t4x2", "large_gpu")
AMP_MODES = ("auto", "fp16", "bf16", "off")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# A GPU of the A100/H100 class: bf16 tensor cores (compute capability 8.0+) and memory for a batch of 256 texts
# of DistilBERT-base with room to spare (40 GiB: the smallest A100). Smaller ones (T4, L4, A10) keep single_gpu.
LARGE_GPU = {"capability": (8, 0), "memory_gib": 40}
_NONE = ("null", "none", "~", "")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def at_least(low):
    return lambda v: None if v >= low else f"must be at least {low}"


def positive(v):
    return None if math.isfinite(v) and v > 0 else "must be a positive finite number"


def non_negative(v):
    return None if math.isfinite(v) and v >= 0 else "must be 0 or a positive finite number"


def fraction(v):
    return None if 0 <= v < 1 else "must be in [0, 1): the share of the optimizer steps spent warming up"


def between(low, high):
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}"


def label_list(v):
    names = [n.strip() for n in v.split(",")]
    if any(not n for n in names):
        return "must be comma-separated non-empty class names, e.g. negative,positive"
    if len(names) < 2:
        return "must name at least two classes, comma-separated"
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return f"names {', '.join(repeated)} more than once; each class needs its own name"
    return None


def column_list(v):
    return None if all(c.strip() for c in v.split(",")) else "must be column names, comma-separated"


def experiment_name(v):
    return (
        None
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}", v)
        else "must be a simple name (letters, digits, _ . -): it names the folder experiments/<name>/"
    )


def opt(default, help: str, *, check=None, choices=None, ddp: bool = False):
    return field(default=default, metadata={"help": help, "check": check, "choices": choices, "ddp": ddp})


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run is told. Frozen: a run-wide decision is made once, here or in the plan."""

    epochs: int = opt(3, "passes over the training data", check=at_least(1))
    num_samples: typing.Optional[int] = opt(
        None, "class-balanced subset of the training split (default: all)", check=at_least(4)
    )
    eval_samples: typing.Optional[int] = opt(
        None, "class-balanced subset of the test split (default: all)", check=at_least(4)
    )
    batch_size: int = opt(
        32, "examples per step and process (the global batch is this x processes x grad_accum)", check=at_least(1)
    )
    eval_batch_size: int = opt(128, "examples per evaluation batch", check=at_least(1))
    lr: float = opt(5e-5, "peak learning rate of AdamW", check=positive)
    weight_decay: float = opt(0.01, "AdamW weight decay (not on biases and LayerNorm)", check=non_negative)
    warmup_ratio: float = opt(0.06, "share of the optimizer steps with a linear warm-up", check=fraction)
    max_length: int = opt(
        128,
        "tokens per text (longer texts are cut, see --truncation); at most the model's position "
        "limit, checked when it is loaded (512 for DistilBERT)",
        check=between(8, 8192),
    )
    max_grad_norm: float = opt(1.0, "gradient clipping (0 turns it off)", check=non_negative)
    model: str = opt(
        "auto",
        "tiny, minilm, custom (a small transformer from scratch), auto, a hub id "
        "(distilbert-base-uncased) or a local folder",
    )
    data: str = opt(
        "auto",
        "where the dataset comes from: auto, hub (its cache under HF_HUB_OFFLINE=1), embedded, "
        "synthetic (both AG News only), or a folder with train.csv/test.csv (.gz ok)",
    )
    dataset: str = opt(
        "ag_news",
        "ag_news, imdb, amazon_polarity, yelp_polarity, hub:OWNER/NAME, a folder, or csv:PATH "
        "(a CSV with a header; a folder with train.csv and test.csv, or one file: 10%% held out as test)",
    )
    text_column: typing.Optional[str] = opt(
        None,
        "column(s) with the text in a CSV with a header or a hub dataset "
        "(comma-separated ones are joined; default: text)",
        check=column_list,
    )
    label_column: typing.Optional[str] = opt(None, "column with the label (default: label)", check=column_list)
    label_names: typing.Optional[str] = opt(
        None,
        "class names, comma-separated, in the order of the label indices (default: from the data)",
        check=label_list,
    )
    tokenizer: str = opt(
        "auto",
        "auto (hash for --model custom, else the model's own), hf (the model's, or DistilBERT's "
        "vocabulary for custom), hash (no vocabulary file: models trained from scratch)",
        choices=("auto", "hf", "hash"),
    )
    hash_buckets: int = opt(32768, "ids of the hash tokenizer (its embedding table's rows)", check=between(16, 1 << 24))
    truncation: str = opt(
        "head",
        "how long texts are cut to --max_length: head (the first tokens) or head_tail "
        "(the first quarter and the last three quarters)",
        choices=TRUNCATIONS,
    )
    custom_dim: int = opt(128, "--model custom: width of the token vectors", check=between(8, 4096))
    custom_layers: int = opt(2, "--model custom: encoder layers", check=between(1, 48))
    custom_heads: int = opt(4, "--model custom: attention heads (must divide --custom_dim)", check=between(1, 64))
    custom_ffn: int = opt(512, "--model custom: width of each layer's feed-forward block", check=between(8, 16384))
    custom_dropout: float = opt(0.1, "--model custom: dropout", check=fraction)
    custom_pooling: str = opt(
        "mean", "--model custom: mean of the real tokens' vectors, or the first token's", choices=("mean", "cls")
    )
    task: str = opt(
        "classify",
        "what to learn: classify the texts, or language-model them: clm (next token, a small "
        "GPT-2) or mlm (masked tokens, DistilBERT-style); the DDP lines are the same",
        choices=("classify", "clm", "mlm"),
    )
    block_size: int = opt(
        32, "--task clm/mlm: tokens per training block (the texts are packed into blocks)", check=between(8, 1024)
    )
    lm_vocab: int = opt(
        4096,
        "--task clm/mlm: the most frequent WordPiece tokens kept as the vocabulary (the rest "
        "become [UNK]); the output layer costs vocabulary x width per token",
        check=between(64, 30522),
    )
    amp: str = opt("auto", "mixed precision", choices=AMP_MODES)
    grad_accum: int = opt(1, "micro-batches per optimizer step", check=at_least(1))
    seed: int = opt(42, "seed for the model's initialisation and the data order")
    output: typing.Optional[str] = opt(
        None, "run folder for metrics and snapshots (default outputs/single or outputs/ddp)"
    )
    checkpoint: str = opt(DEFAULT_CHECKPOINT, "where the trained model is saved")
    threads: typing.Optional[int] = opt(
        None, "torch CPU threads per process (default: torch's choice)", check=at_least(1)
    )
    progress: bool = opt(True, "tqdm bar on rank 0")
    report_to: str = opt(
        "none",
        "experiment tracker rank 0 also writes to (W&B offline unless WANDB_MODE says otherwise)",
        choices=("none", "tensorboard", "wandb", "trackio"),
    )
    max_steps_per_epoch: typing.Optional[int] = opt(
        None, "stop each epoch after this many optimizer steps (benchmarks)", check=at_least(1)
    )
    # The fast path: each option can be switched off to measure what it buys.
    group_by_length: bool = opt(True, "batch texts of similar length (less padding)")
    pad_multiple: typing.Optional[int] = opt(
        None,
        "pad each batch to a multiple of this (0: no rounding; default: 8 on CUDA for tensor cores, none on CPU)",
        check=at_least(0),
    )
    pin_memory: typing.Optional[bool] = opt(None, "pinned host memory + non-blocking copies (default: on with CUDA)")
    fused_adam: typing.Optional[bool] = opt(None, "fused AdamW kernel (default: on where torch has it)")
    compile: bool = opt(False, "torch.compile the model")
    compile_mode: str = opt(
        "default",
        "torch.compile's mode (turns --compile on): reduce-overhead replays each step's kernels as CUDA graphs, "
        "with batches padded to 4 fixed widths so that a few graphs serve the whole run (a CPU just compiles)",
        choices=COMPILE_MODES,
    )
    # Fault tolerance: snapshots in <output>/snapshots/, resumed with --resume auto (or a path).
    resume: typing.Optional[str] = opt(None, "auto (newest good snapshot in --output), a snapshot path, or off")
    snapshot_every: int = opt(500, "optimizer steps between snapshots (0: only at epoch ends)", check=at_least(0))
    keep_snapshots: int = opt(2, "snapshots kept (2 or more, so a damaged one can fall back)", check=at_least(1))
    snapshots: bool = opt(True, "write training snapshots")
    backend: str = opt("auto", "process-group backend", choices=("auto", "nccl", "gloo"), ddp=True)
    ddp_timeout: float = opt(300.0, "seconds a collective may wait before failing", check=positive, ddp=True)
    debug_hangs: bool = opt(
        False,
        "the hang doctor: when a collective waits --ddp_timeout seconds or fails, one rank prints which rank is the "
        "culprit, at which collective, and its stack (the group waits a grace longer, for the report)",
        ddp=True,
    )
    no_sync: bool = opt(True, "skip the all-reduce on non-final accumulation micro-steps", ddp=True)
    bucket_cap_mb: float = opt(25.0, "DDP gradient bucket size (MB)", check=positive, ddp=True)
    gradient_as_bucket_view: bool = opt(True, "gradients live in DDP's buckets (saves a copy)", ddp=True)
    # Experiments (configs/experiments/*.yaml, run by scripts/run_experiment.py)
    experiment: typing.Optional[str] = opt(
        None,
        "experiment name: metrics, the resolved config and the checkpoint go to "
        "experiments/<name>/ (default for a YAML in configs/experiments: its name)",
        check=experiment_name,
    )
    processes: typing.Optional[int] = opt(
        None,
        "processes the experiment runs on (scripts/run_experiment.py launches "
        "that many; a launch with another number is refused)",
        check=at_least(1),
    )
    preset: str = field(default="none", metadata={"internal": True})  # set by parse()
    # the options typed on the command line (set by parse()): a later decision never overrides one of them
    given: tuple = field(default=(), metadata={"internal": True, "record": False})

    def to_dict(self) -> dict:
        """The run's options as metrics.json, config.json and the trackers record them (scalars only)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("record", True)}


def options(ddp: bool = True) -> list:
    """The user-settable fields (DDP-only ones only when ddp=True)."""
    return [f for f in fields(RunConfig) if not f.metadata.get("internal") and (ddp or not f.metadata.get("ddp"))]


_HINTS = typing.get_type_hints(RunConfig)


def _kind(f) -> tuple[type, bool]:
    hint = _HINTS[f.name]
    args = typing.get_args(hint)
    if args and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def convert(f, raw, where: str):
    """Text (from a flag or a preset) -> the field's type, checked. Raises UserError naming `where`."""
    base, optional = _kind(f)
    if not isinstance(raw, str):
        shape = {list: "a list", dict: "a mapping"}.get(type(raw), type(raw).__name__)
        raise UserError(f"{where} must be a single value, not {shape} ({raw!r}).")
    text = raw.strip()
    if text.lower() in _NONE:
        if optional:
            return None
        raise UserError(f"{where} needs a value here (it cannot be empty or null); the default is {f.default!r}.")
    try:
        if base is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            value = text.lower() in _TRUE
        elif base is int:
            value = int(text)
        elif base is float:  # YAML spells infinity and NaN .inf and .nan
            value = float({".inf": "inf", "+.inf": "inf", "-.inf": "-inf", ".nan": "nan"}.get(text.lower(), text))
        else:
            value = text
    except ValueError:
        what = {bool: "true or false", int: "a whole number", float: "a number"}[base]
        raise UserError(f"{where} expects {what}, got {raw!r}.") from None
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise UserError(f"{where}: {raw!r} is not one of {', '.join(choices)}.")
    check = f.metadata.get("check")
    problem = check(value) if check and value is not None else None
    if problem:
        raise UserError(f"{where} {problem} (got {raw!r}).")
    return value


def large_gpu(index: int = 0) -> bool:
    """Is GPU `index` of the A100/H100 class (LARGE_GPU), where the large_gpu preset's batch keeps it busy?"""
    import torch

    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor) >= LARGE_GPU["capability"] and props.total_memory >= LARGE_GPU[
        "memory_gib"
    ] * 2**30


def auto_preset() -> str:
    n = gpu_count()
    if n == 1:
        return "large_gpu" if large_gpu(0) else "single_gpu"
    return "kaggle_t4x2" if n >= 2 else "cpu_smoke"


def preset_path(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name).expanduser()
    else:
        path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(
            f"--config {name}: no such preset. Choices: auto, {', '.join(PRESETS)}, or a path to a YAML file "
            f"(presets live in {CONFIG_DIR})."
        )
    return path


def read_preset(name: str, ddp: bool = True) -> tuple[str, dict]:
    """(preset name, {field: typed value}) from distrinews_lib/presets/<name>.yaml or a YAML path; 'auto' picks by
    GPUs."""
    if name == "auto":
        name = auto_preset()
    path = preset_path(name)
    try:
        # BaseLoader: every scalar stays text, so `off`, `yes` and `1e-3` reach convert() as written.
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        raise UserError(f"{path} is not valid YAML: {' '.join(str(err).split())[:300]}") from None
    if raw in (None, ""):
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path} must hold a mapping of option: value (e.g. 'epochs: 3').")
    known = {f.name: f for f in options(ddp=True)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise UserError(
            f"preset {path.stem} sets unknown option(s): {', '.join(map(str, unknown))}. "
            f"Known: {', '.join(sorted(known))}."
        )
    stem = Path(name).stem
    values = {k: convert(known[k], v, f"preset {stem} ({path}): {k}") for k, v in raw.items()}
    if not ddp:  # DDP-only options in a shared preset are fine; the single-process script ignores them
        values = {k: v for k, v in values.items() if not known[k].metadata.get("ddp")}
    return stem, values


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one paragraph and exit code 2 (errors.main_guard), like every user mistake
        raise UserError(f"{message}. See {self.prog} --help.")


def build_parser(description: str, ddp: bool = False) -> argparse.ArgumentParser:
    p = _Parser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )  # only what was given: the preset fills the rest
    p.add_argument("--config", default="auto", help=f"preset: auto, {', '.join(PRESETS)}, or a YAML path")
    for f in options(ddp):
        base, _ = _kind(f)
        help_text = f.metadata["help"] + f" (default: {f.default})"
        if base is bool:
            p.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, help=help_text)
        else:
            p.add_argument(
                f"--{f.name}",
                type=lambda raw, f=f: convert(f, raw, f"--{f.name}"),
                metavar=f.name.upper(),
                help=help_text,
            )
    return p


def parse(description: str, argv=None, ddp: bool = False) -> RunConfig:
    flags = vars(build_parser(description, ddp).parse_args(argv))
    given = flags.pop("config", "auto")
    preset, values = read_preset(given, ddp)
    cfg = replace(RunConfig(), **{**values, **flags}, preset=preset, given=tuple(sorted(flags)))
    return finish(cfg, ddp, preset_path(auto_preset() if given == "auto" else given))


def setup(description: str, argv=None, ddp: bool = False) -> RunConfig:
    """parse(), then apply what holds for the whole process: --threads (torch's CPU threads per process)."""
    cfg = parse(description, argv, ddp)
    if cfg.threads:
        import torch  # here, not at the top: reading the flags needs no torch

        torch.set_num_threads(cfg.threads)
    return cfg


def scaled_lr(lr: float, batch_size: int, base_batch: int) -> float:
    """The square-root rule for Adam-type optimizers (Malladi et al., 2022): k times the batch, sqrt(k) times the
    rate. The linear rule (k times) is SGD's; with AdamW it overshoots (BERT fine-tuning diverges at 8 x 5e-5)."""
    return lr * math.sqrt(batch_size / base_batch)


def from_scratch_lr(batch_size: int | None = None) -> float:
    """The learning rate of a model trained from random weights: the cpu_smoke preset's (1e-3 at its batch of 32),
    scaled to `batch_size` by scaled_lr. The GPU presets' 5e-5 fine-tunes a pretrained model and leaves a random one
    near chance (47% on AG News after 3 epochs, H100)."""
    smoke = read_preset("cpu_smoke")[1]
    return scaled_lr(smoke["lr"], batch_size or smoke["batch_size"], smoke["batch_size"])


def preset_lr(preset: str) -> float | None:
    """The learning rate a shipped preset sets (None for a YAML of the user's own)."""
    return read_preset(preset)[1].get("lr") if preset in PRESETS else None


def finish(cfg: RunConfig, ddp: bool, preset_file=None) -> RunConfig:
    """Defaults that depend on other options, and checks of options together."""
    folder = Path(preset_file).resolve().parent if preset_file is not None else Path()
    if cfg.experiment is None and (folder.parent.name, folder.name) == ("configs", "experiments"):
        cfg = replace(cfg, experiment=Path(preset_file).stem)  # a YAML in configs/experiments names its experiment
    if cfg.experiment:
        folder = Path("experiments") / cfg.experiment
        if cfg.output is None:
            cfg = replace(cfg, output=str(folder))
        if cfg.checkpoint == RunConfig.checkpoint:
            cfg = replace(cfg, checkpoint=str(folder / "model.pt"))
    if cfg.output is None:
        cfg = replace(cfg, output=str(Path("outputs") / ("ddp" if ddp else "single")))
    if cfg.compile_mode != "default" and not cfg.compile:
        if "compile" in cfg.given:
            raise UserError(
                f"--compile_mode {cfg.compile_mode} compiles the model, and --no-compile says not to; drop one of them."
            )
        cfg = replace(cfg, compile=True)
    if cfg.debug_hangs:
        from .. import hang_doctor  # opt-in: a run without the flag imports none of it

        cfg = replace(cfg, ddp_timeout=hang_doctor.arm(cfg.ddp_timeout, str(Path(cfg.output) / "hangs")))
    if cfg.model == "custom" and cfg.custom_dim % cfg.custom_heads:
        raise UserError(
            f"--custom_dim {cfg.custom_dim} does not divide by --custom_heads {cfg.custom_heads}: every "
            "attention head gets an equal share of the width. Pick, e.g., --custom_heads 4 with --custom_dim 128."
        )
    return cfg
