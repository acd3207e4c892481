"""`scalerl sft`: supervised fine-tuning on prompt/response data, the warm start before RL.

    sft.data → examples: prompts through the run's prompt format (env.chat_template, env.system_prompt, as
               `scalerl train` renders them), responses + the stop token (EOS, or the template's end of turn)
    each update: sft.batch_size examples (or packed rows) in the order of the pass (`update_rows`)
               → SFTLearner.update (scalerl/learner/sft.py): masked cross-entropy on response tokens only
    sft.stop_at_loss: the run ends early once the mean loss of the last sft.stop_window updates is <= it
               (`stop_reason`); the window's losses ride in each checkpoint, so a resumed run stops where the whole one would
    checkpoint.every / the end: a checkpoint of `scalerl train`'s format (weights and AdamW moments through
               DCP, the policy as a Hugging Face folder, manifest); --resume continues from the newest intact one
    the end: the model written to sft.out (default <run folder>/model), a Hugging Face folder that
               `scalerl train --set model.path=...` starts from as it is

The model, precision mode, optimizer and lr schedule (optim.*), parallel strategy, seed, threads, checkpoints
and run folder are the run config's own sections: one config file can hold `sft:` beside the RL settings.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from scalerl.config import Config
from scalerl.errors import ScaleRLError

log = logging.getLogger(__name__)


def total_updates(config: Config, rows: int) -> int:
    """sft.steps, or sft.epochs passes of ceil(rows / batch_size) updates."""
    return config.sft.steps or config.sft.epochs * math.ceil(rows / config.sft.batch_size)


def update_rows(n_rows: int, update: int, batch_size: int, seed: int, shuffle: bool) -> list[int]:
    """The row indices of optimizer update `update` (0-based): passes over the rows one after the other, each in
    the order of `random.Random(f"{seed}:{pass}")` (with shuffle); a pure function, so a resumed run takes the same."""
    per_pass = math.ceil(n_rows / batch_size)
    epoch, k = divmod(update, per_pass)
    order = list(range(n_rows))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order[k * batch_size: (k + 1) * batch_size]


def stop_reason(losses: list[float], stop_at_loss: float | None, window: int) -> str | None:
    """Why the fine-tuning stops early after these update losses (oldest first), or None to go on:
    mean(losses[-window:]) <= stop_at_loss, once there are `window` of them; never without a stop_at_loss."""
    if stop_at_loss is None or len(losses) < window:
        return None
    mean = sum(losses[-window:]) / window
    return f"sft.stop_at_loss: mean loss of the last {window} updates {mean:.4f} <= {stop_at_loss}" if mean <= stop_at_loss else None


def load_examples(config: Config, tokenizer: Any) -> list[Any]:
    """The data as rows of examples ((prompt ids, response ids), packed or one per row), cut to sft.max_length."""
    from scalerl.learner.forgetting import AnchorData
    from scalerl.learner.sft import pack, truncate
    from scalerl.rollout.chat import prompt_format

    prompts = prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer)
    data = AnchorData.build(config.sft.data, prompts.encode, tokenizer, prompts.stop_ids()[-1], config.train.seed, where="sft.data")
    examples, dropped = truncate(list(zip(data.prompts, data.responses)), config.sft.max_length)
    if dropped:
        log.warning("sft.data: %d of %d examples have a prompt of sft.max_length (%d) tokens or more and were dropped",
                    dropped, len(data), config.sft.max_length)
    if not examples:
        raise ScaleRLError(f"sft.data: no example fits in sft.max_length={config.sft.max_length} tokens; raise it")
    return pack(examples, config.sft.max_length) if config.sft.packing else [[e] for e in examples]


def check_sft(config: Config) -> None:
    if config.sft.data is None:
        raise ScaleRLError("sft.data: give the data to fine-tune on (--set sft.data=FILE: JSONL of {prompt, response} or {messages})")
    if not config.sft.data.exists():
        raise ScaleRLError(f"sft.data: {config.sft.data} does not exist; give a JSONL file or a save_to_disk folder")
    if config.precision_policy.loss_scaling:
        raise ScaleRLError("scalerl sft: precision.compute=fp16 (dynamic loss scaling) is not supported yet; use bf16 or fp32")
    if config.sft.packing and config.model.attn_implementation not in ("sdpa", "eager", "auto"):
        raise ScaleRLError(f"sft.packing needs model.attn_implementation sdpa or eager (a block-diagonal mask), not "
                           f"{config.model.attn_implementation}")


def run_sft(config: Config, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune (or resume fine-tuning); returns the summary also written to <run folder>/summary.json."""
    from scalerl.config.checks import check_once
    from scalerl.distributed.context import init_distributed, shutdown
    from scalerl.trainer.run_lock import RunLock

    check_sft(config)
    check_once(config)
    ctx = init_distributed(config.train.device, config.health.hang.deadline_s)
    try:
        with RunLock() as lock:
            return _fine_tune(config, ctx, resume, overwrite, lock)
    finally:
        shutdown(ctx)


def _build(config: Config, ctx: Any, run_dir: Path, resume: bool) -> tuple[Any, Any, list[Any]]:
    """(tokenizer, SFTLearner, rows): the policy loaded as `scalerl train` loads it, wrapped by the parallel strategy,
    with the RL learner's optimizer builder."""
    from scalerl.distributed.build import build_strategy
    from scalerl.distributed.context import seed_everything, set_threads
    from scalerl.learner.optim import build_optimizer
    from scalerl.learner.sft import SFTLearner
    from scalerl.models.build import build_policy
    from scalerl.models.loading import load_tokenizer
    from scalerl.models.logprobs import CompletionModel
    from scalerl.precision.apply import autocast_context, check_precision
    from scalerl.trainer.setup import prepare_run_dir, what_ran

    set_threads(config.train.threads)
    seed_everything(config.train.seed + ctx.rank)
    check_precision(config.precision_policy, ctx.device)
    tokenizer = load_tokenizer(config.model)
    rows = load_examples(config, tokenizer)
    policy = build_policy(config, ctx.device)
    prepare_run_dir(config, ctx, run_dir, resume, what_ran(config, ctx, policy))
    policy.train()
    parallel = build_strategy(config.parallel, ctx, config.precision_policy)
    forward = parallel.wrap(CompletionModel(policy))
    lr = config.sft.lr or config.optim.lr
    optimizer = build_optimizer([(policy, lr)], config.optim.model_copy(update={"lr": lr}), config.precision_policy, ctx.device)
    learner = SFTLearner(policy=policy, forward=forward, optimizer=optimizer, parallel=parallel, ctx=ctx, optim=config.optim,
                         autocast=lambda: autocast_context(config.precision_policy, ctx.device),
                         fp32_head=config.precision_policy.fp32_lm_head, total_updates=total_updates(config, len(rows)),
                         micro_batch_size=config.sft.micro_batch_size, pad_id=tokenizer.pad_token_id, lr=lr)
    return tokenizer, learner, rows


def _fine_tune(config: Config, ctx: Any, resume: bool, overwrite: bool, lock: Any) -> dict[str, Any]:
    import torch

    from scalerl.trainer import checkpoint as ckpt
    from scalerl.trainer.setup import check_run_dir

    run_dir = check_run_dir(config, resume, overwrite, lock if ctx.is_main else None)
    tokenizer, learner, rows = _build(config, ctx, run_dir, resume)
    root, sft, total = run_dir / "checkpoints", config.sft, learner.total_updates
    parts = {"model": learner.policy, "optimizer": learner.optimizer}
    start, losses = 0, []  # losses: the last sft.stop_window updates' (what stop_reason reads)
    if resume:
        if ctx.is_main:
            ckpt.remove_partial(root)
        loaded = ckpt.load_newest_intact(root, ctx, lambda folder: ckpt.load_checkpoint(folder, ctx=ctx, **parts),
                                         lambda line: print(line, file=sys.stderr))
        if loaded is not None:
            state, rng = loaded
            learner.load_state_dict(state["sft"])
            start, losses = state["step"], list(state.get("losses", []))
            if rng is not None:
                torch.set_rng_state(rng["torch"])
    metrics_file = run_dir / "metrics.jsonl"
    began, last, step = time.perf_counter(), {}, start
    stopped = stop_reason(losses, sft.stop_at_loss, sft.stop_window)  # a resumed run that had already stopped takes no update
    while stopped is None and step < total:
        step += 1
        chosen = update_rows(len(rows), step - 1, sft.batch_size, config.train.seed, sft.shuffle)
        last = {"step": step, **learner.update([rows[i] for i in chosen[ctx.rank::ctx.world_size]])}
        losses = (losses + [last["loss"]])[-sft.stop_window:]
        stopped = stop_reason(losses, sft.stop_at_loss, sft.stop_window)
        done = stopped is not None or step == total
        if ctx.is_main:
            with metrics_file.open("a") as f:
                f.write(json.dumps(last) + "\n")
            if done or step % max(1, total // 10) == 0:
                print(f"sft step {step}/{total}  loss {last['loss']:.4f}  lr {last['lr']:.2e}  grad_norm {last['grad_norm']:.3f}", flush=True)
        if (config.checkpoint.every and step % config.checkpoint.every == 0) or (done and config.checkpoint.save_final):
            ckpt.save_checkpoint(root, step, ctx=ctx, tokenizer=tokenizer, rng={"torch": torch.get_rng_state()},
                                 trainer_state={"step": step, "sft": learner.state_dict(), "losses": losses},
                                 keep_last=config.checkpoint.keep_last, **parts)
    stopped = stopped or f"sft.steps ({total}) reached"
    if ctx.is_main:
        print(f"sft: stopped at update {step}: {stopped}", flush=True)
    learner.parallel.close()
    out = sft.out or run_dir / "model"
    if ctx.is_main:
        write_model(run_dir, out, learner.policy)
    ctx.barrier()
    summary = {"steps": step, "max_steps": total, "stopped": stopped, "examples": sum(len(r) for r in rows), "rows": len(rows), "final_loss": last.get("loss"),
               "model": str(out), "seconds": round(time.perf_counter() - began, 2)}
    if ctx.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"sft: wrote {out} (use it as model.path for scalerl train)")
    return summary


def write_model(run_dir: Path, out: Path, policy: Any) -> None:
    """The newest checkpoint's policy as a Hugging Face folder at `out` (`scalerl export`'s, in the weights' dtype)."""
    import torch

    from scalerl.jobs.export import export_model

    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(next(policy.parameters()).dtype, "fp32")
    export_model(run_dir, out, dtype, overwrite=True, warn=lambda line: print(line, file=sys.stderr))
