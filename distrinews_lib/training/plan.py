"""The run plan: every run-wide decision made ONCE, on rank 0, then shared with every rank.

Left to themselves, ranks can disagree (one reaches the hub and another not, nodes see different snapshots or
GPUs) and train on different data, or hang. decide() picks config, dataset and source, model and tokenizer,
and the snapshot to resume from; prepare() loads and tokenizes that on every rank (local rank 0 first) and
checks that every rank holds the same data; any rank's failure stops every rank with one message.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from pathlib import Path

from .. import distributed as D
from ..data import lm, sources
from ..data.synthetic import SYNTHETIC_NOTE
from ..data.texts import TextOptions, TextSplits
from ..data.tokenization import TokenizedDataset, set_truncation, tiny_tokenizer, tokenize_splits
from ..errors import UserError
from ..files import atomic_write_json
from ..hub import env_says_offline, hub_reachable
from ..models.build import LOCAL_PRESETS, ModelInfo, build_model, resolve_model_name, resolve_tokenizer
from ..models.lm import build_lm
from .checkpoint import position_limit
from .config import RunConfig
from .snapshot import ResumeChoice, choose


@dataclass(frozen=True)
class RunPlan:
    cfg: RunConfig                  # rank 0's configuration (its preset, its flags)
    data_source: str                # hub, embedded, synthetic, or a folder
    model_name: str                 # tiny, minilm, a hub id or a folder
    hub: bool                       # whether rank 0 could reach the Hugging Face hub
    resume: ResumeChoice | None     # the snapshot every rank resumes from, or None
    decided_by: str                 # host that decided, for the log
    dataset: str = "ag_news"        # a known dataset, hub:OWNER/NAME, folder:PATH or csv:PATH (sources.resolve_dataset)
    tokenizer: str = "hf"           # hf (the model's own) or hash

    def describe(self) -> str:
        resume = f"resume {self.resume.path}" if self.resume else "fresh start"
        dataset = "" if self.dataset == "ag_news" else f"dataset {self.dataset} | "
        tokenizer = " | tokenizer hash" if self.tokenizer == "hash" else ""
        return (f"plan (decided on {self.decided_by}): {dataset}data {self.data_source} | model {self.model_name}"
                f"{tokenizer} | preset {self.cfg.preset} | {resume}")


def decide(cfg: RunConfig, log=print) -> RunPlan:
    """Rank 0 only (or a single process): look at this machine and decide for the whole run."""
    if cfg.processes is not None and cfg.processes != D.get_world_size():
        raise UserError(f"experiment {cfg.experiment or ''} asks for {cfg.processes} process(es) (processes: in its YAML) "
                        f"but this launch has {D.get_world_size()}. Run it with: python scripts/run_experiment.py "
                        f"{cfg.experiment or 'NAME'} (it launches the right number), or drop processes: from the YAML.")
    dataset = sources.resolve_dataset(cfg.dataset)
    local_model = cfg.model in LOCAL_PRESETS or Path(cfg.model).expanduser().is_dir()
    wants_hub = (cfg.data in ("auto", "hub") and not dataset.startswith(("folder:", "csv:"))) or not local_model
    hub = hub_reachable() if wants_hub and not env_says_offline() else False  # probed once, ≤ 3 s; never offline
    source = sources.resolve_source(cfg.data, dataset, hub)
    model_name = resolve_model_name(cfg.model, hub)
    return RunPlan(cfg=cfg, data_source=source, model_name=model_name, hub=hub,
                   resume=choose(cfg.output, cfg.resume, log), decided_by=socket.gethostname(), dataset=dataset,
                   tokenizer=resolve_tokenizer(cfg.tokenizer, model_name))


@dataclass
class PreparedRun:
    """What every rank loaded according to the plan."""

    splits: TextSplits
    model: object
    tokenizer: object
    info: ModelInfo
    train_ds: TokenizedDataset | lm.BlockDataset
    val_ds: TokenizedDataset | lm.BlockDataset
    task: str = "classify"

    @property
    def label_names(self) -> list:
        """The classes, in the order of the model's outputs: from the data, or --label_names (none for an LM)."""
        return list(self.splits.label_names) if self.task == "classify" else []


def prepare(plan: RunPlan, log=D.print0) -> PreparedRun:
    """Load the plan's data and model on every rank, tokenize, and check agreement. Collective."""
    cfg = plan.cfg
    log(plan.describe())
    if cfg.task != "classify":
        return _prepare_lm(plan, log)

    def load():
        splits = sources.load_dataset_splits(plan.dataset, plan.data_source, cfg.num_samples, cfg.eval_samples,
                                             seed=cfg.seed, opts=TextOptions.from_config(cfg))
        model, tokenizer, info = build_model(replace(cfg, model=plan.model_name, tokenizer=plan.tokenizer),
                                             splits.label_names, hub=plan.hub)
        limit = position_limit(model)
        if limit is not None and cfg.max_length > limit:
            raise UserError(f"--max_length {cfg.max_length} is beyond what {info.resolved} can read: its position "
                            f"embeddings stop at {limit} tokens. Use --max_length {limit} or less; for long texts add "
                            "--truncation head_tail, which keeps their start and their end.")
        set_truncation(tokenizer, cfg.truncation)  # training, the checkpoint and the server cut texts the same way
        return splits, model, tokenizer, info

    splits, model, tokenizer, info = D.agree(load)
    D.same_on_all_ranks(splits.fingerprint(), "the training data",
                        hint="every rank must read the same files: check --data, --dataset and $DISTRINEWS_DATA_DIR on every node")
    log(splits.describe() + f" | fingerprint {splits.fingerprint()}")
    log(splits.balance())
    if splits.is_synthetic:
        log("NOTE: " + SYNTHETIC_NOTE)
    log(f"model: {info.resolved} ({info.kind}, {info.num_parameters / 1e6:.1f}M parameters"
        f"{', pretrained' if info.pretrained else ', random init'}) | tokenizer {tokenizer_name(tokenizer)} | "
        f"{cfg.max_length} tokens, truncation {cfg.truncation} | labels {', '.join(splits.label_names)}")
    train_ds, val_ds = D.agree(D.local_main_first, tokenize_splits, splits, tokenizer, cfg.max_length)
    run = PreparedRun(splits, model, tokenizer, info, train_ds, val_ds)
    if cfg.experiment and D.get_rank() == 0:
        write_resolved_config(plan, run)
    return run


def _prepare_lm(plan: RunPlan, log) -> PreparedRun:
    """--task clm/mlm: the same texts, without their labels, cut into blocks over a frequent-token vocabulary."""
    cfg = plan.cfg
    splits = D.agree(sources.load_dataset_splits, plan.dataset, plan.data_source, cfg.num_samples, cfg.eval_samples,
                     seed=cfg.seed, opts=TextOptions.from_config(cfg))
    D.same_on_all_ranks(splits.fingerprint(), "the training data",
                        hint="every rank must read the same files: check --data, --dataset and $DISTRINEWS_DATA_DIR on every node")
    wordpiece = tiny_tokenizer()  # DistilBERT's uncased WordPiece, shipped in the package: works offline

    def tokenize():  # the [CLS]/[SEP] of each text are dropped: packing puts one [SEP] between texts
        ids = tokenize_splits(splits, wordpiece, 512)
        return [x[1:-1] for x in ids[0].input_ids], [x[1:-1] for x in ids[1].input_ids]

    train_ids, val_ids = D.agree(D.local_main_first, tokenize)
    vocab = lm.VocabSubset.from_corpus(wordpiece, train_ids, cfg.lm_vocab)  # the same on every rank: the same data
    train_ds = lm.BlockDataset(lm.pack([vocab.encode(x) for x in train_ids], cfg.block_size, vocab.sep_token_id), cfg.task,
                               vocab, cfg.seed)
    val_ds = lm.BlockDataset(lm.pack([vocab.encode(x) for x in val_ids], cfg.block_size, vocab.sep_token_id), cfg.task,
                             vocab, cfg.seed, evaluation=True)
    model, desc = build_lm(cfg.task, vocab, cfg.block_size, cfg.seed)
    info = ModelInfo(f"{cfg.task}-tiny", desc, "preset", False, sum(p.numel() for p in model.parameters()))
    log(splits.describe() + f" | fingerprint {splits.fingerprint()} | text only: the labels are not used")
    log(f"{cfg.task}: {desc}, {info.num_parameters / 1e6:.1f}M parameters | vocabulary: the {len(vocab)} most frequent "
        f"WordPiece tokens ({100 * vocab.coverage(train_ids):.0f}% of the training tokens) | {len(train_ds)} training and "
        f"{len(val_ds)} validation blocks of {cfg.block_size} tokens")
    return PreparedRun(splits, model, vocab, info, train_ds, val_ds, cfg.task)


def tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def write_resolved_config(plan: RunPlan, run: PreparedRun) -> Path:
    """<output>/config.json: every option as this run resolved it, what the plan decided, and what the data held."""
    cfg, s = plan.cfg, run.splits
    record = {"experiment": cfg.experiment, "options": cfg.to_dict(),
              "resolved": {"dataset": plan.dataset, "data_source": plan.data_source, "model": plan.model_name,
                           "model_resolved": run.info.resolved, "num_parameters": run.info.num_parameters,
                           "tokenizer": plan.tokenizer, "tokenizer_name": tokenizer_name(run.tokenizer),
                           "hub_reachable": plan.hub, "world_size": D.get_world_size(),
                           "global_batch_size": cfg.batch_size * D.get_world_size() * cfg.grad_accum,
                           "checkpoint": cfg.checkpoint, "metrics_json": str(Path(cfg.output) / "metrics.json"),
                           "metrics_csv": str(Path(cfg.output) / "metrics.csv")},
              "data": {"title": s.title, "detail": s.detail, "label_names": s.label_names, "fingerprint": s.fingerprint(),
                       "train_size": len(s.train_texts), "test_size": len(s.test_texts),
                       "class_counts": {"train": s.class_counts("train"), "test": s.class_counts("test")}},
              "decided_by": plan.decided_by}
    return atomic_write_json(Path(cfg.output) / "config.json", record)
