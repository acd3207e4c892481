"""The `sft:` section: what `scalerl sft` trains on and how many updates it takes (its model, precision, optimizer,
parallel strategy, checkpoints and run folder are the run config's own sections, shared with `scalerl train`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from scalerl.config.schema import _Section


class SFTConfig(_Section):
    data: Path | None = Field(None, description="`scalerl sft`'s data: JSONL of {prompt, response} (TRL's 'completion' too; a prompt may be chat messages) "
                                                "or of {messages} whose last message is the assistant's reply, or a `datasets` save_to_disk folder of those columns.")
    epochs: int = Field(1, ge=1, description="Passes over the data (when sft.steps is unset).")
    steps: int | None = Field(None, ge=1, description="Optimizer updates; default: sft.epochs passes over the data (the last update of a pass may be smaller).")
    stop_at_loss: float | None = Field(None, gt=0, description="Early stop: end the fine-tuning at the first update after which the mean training loss of "
                                                               "the last sft.stop_window updates is <= this value (sft.steps stays the most updates and the lr "
                                                               "schedule's length); summary.json records the update it stopped at and why. Default: no early stop.")
    stop_window: int = Field(20, ge=1, description="Updates whose mean loss sft.stop_at_loss compares (a single update's loss is one batch's; "
                                                    "no stop before this many updates).")
    batch_size: int = Field(32, ge=1, description="Examples (or packed rows) per optimizer update, over all processes.")
    micro_batch_size: int | None = Field(None, ge=1, description="Examples (or packed rows) per forward/backward on a process (gradient accumulation); default: the process's whole share.")
    max_length: int = Field(1024, ge=2, description="Longest prompt + response in tokens; longer examples lose the end of their response (one with no response token left is dropped).")
    packing: bool = Field(False, description="Concatenate examples into rows of up to max_length tokens; each example attends only to itself (a block-diagonal mask, positions restarting), "
                                             "so the loss equals the unpacked one. Needs model.attn_implementation sdpa or eager.")
    lr: float | None = Field(None, gt=0, description="Peak learning rate of the fine-tuning (optim.* gives the rest of AdamW and the schedule); default: optim.lr, "
                                                    "so one config can hold an SFT rate beside the RL one.")
    shuffle: bool = Field(True, description="Visit the data in a new order each pass (a function of train.seed and the pass).")
    out: Path | None = Field(None, description="Folder the fine-tuned model is written to (Hugging Face format, usable as model.path); default: <run folder>/model.")
