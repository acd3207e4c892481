"""train's memory options, as a mixin of schema.py's TrainConfig: how the training forward holds the
LM head's logits (`logprob_chunk_tokens`) and how a mini-batch is cut into micro-batches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainMemoryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # as schema.py's _Section

    logprob_chunk_tokens: int | None = Field(
        None, ge=0, description="Completion positions per chunk of the LM head in the training forward: log-probs and entropy are "
        "computed chunk by chunk from the final hidden states and the backward recomputes each chunk, so the float32 "
        "(batch x length x vocabulary) logits never exist whole (the same numbers to rounding; one extra head forward). "
        "A micro-batch with no more positions than one chunk keeps the whole logits. null: 2^24 / vocabulary positions "
        "(64 MiB of logits a chunk: 512 at a 32k vocabulary), so it turns on only where the logits are large; 0: never.")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="Token budget of a forward/backward, instead of train.micro_batch_size's row count: each mini-batch's "
        "rows are sorted by length and packed into micro-batches whose padded size, rows x (longest prompt + longest completion), "
        "stays within it (a longer row alone), each computed without its all-padding columns. The update is the same for any "
        "budget (gradients accumulated over the mini-batch's normaliser). null: micro-batches by rows.")
