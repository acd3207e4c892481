"""Memory arithmetic on small shapes, worked out by hand."""

import math

import pytest

from scalerl.errors import ScaleRLError
from scalerl.predict.cost import efficiency_for, run_cost
from scalerl.predict.memory import MODEL_PRESETS, ModelShape, estimate_memory, gpus_needed, shape_of_model_path


def test_builtin_params():
    # V=55, h=128, i=512, L=4, 4 heads × 32: embed 7040; layer 4·128·128 + 3·128·512 + 256 = 262400;
    # 7040 + 4·262400 + 128 + 7040 (untied head) = 1,063,808 — the README's "1.06M"
    assert shape_of_model_path("builtin").params == 1_063_808


def test_llama2_7b_params():
    assert abs(MODEL_PRESETS["7b"].params - 6.738e9) < 1e6  # Llama-2-7B: 6,738,415,616


def test_components_small_shape():
    s = ModelShape(vocab=10, hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4)
    # params: embed 80; layer 2·8·8 + 2·8·4 + 3·8·16 + 16 = 128 + 64 + 384 + 16 = 592; 80 + 1184 + 8 + 80 = 1352
    assert s.params == 1352
    m = estimate_memory(s, precision="fp32", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4, reference=True)
    assert m["weights"] == m["gradients"] == m["reference"] == 1352 * 4 and m["optimizer"] == 1352 * 8
    # per layer per token (8 + 2·1/2)·8 + 4·16 = 136; all layers + final norm 2·136 + 24 = 296 elements;
    # 2 × 8 tokens × 296 × 4 B = 18944; logits 2 × 6 × 10 × 4 = 480 → 19424
    assert m["activations"] == 19424
    # KV: 2 layers × 2 × 1 kv head × 4 × (4 sequences × 8 tokens) × 4 B = 2048
    assert m["kv_cache"] == 2048
    # the backward's start: 4 × the 480 B of float32 logits (the log-softmax's backward), more than the head
    # weight's float32 gradient (10 × 8 × 4 B)
    assert m["backward_transient"] == 4 * 480
    assert m["peak"] == 1352 * 20 + 19424 + 4 * 480
    wide = ModelShape(vocab=10, hidden=64, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4)
    w = estimate_memory(wide, precision="fp32", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4)
    assert w["backward_transient"] == 10 * 64 * 4  # a wide head: its gradient (2,560 B) outweighs 4 × 480
    wc = estimate_memory(wide, precision="compressed", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4)
    assert wc["backward_transient"] == 10 * 64 * 6  # bf16 weights: and its bf16 cast
    assert m["error_feedback"] == m["working_copy"] == 0
    # optim.offload: the 8 bytes of moments per parameter leave the device; the host holds them and its float32
    # copies of the weights and gradients
    off = estimate_memory(s, precision="fp32", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4, reference=True,
                          offload=True)
    assert off["optimizer"] == 0 and off["host"] == 1352 * 16 and off["peak"] == m["peak"] - 1352 * 8 and m["host"] == 0
    # health.nonfinite's restore point: a host copy of the weights and the moments, beside the offloaded ones
    point = estimate_memory(s, precision="fp32", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4, reference=True,
                            offload=True, restore_point=True)
    assert point["restore_point"] == 1352 * 12 and point["host"] == 1352 * 28 and point["peak"] == off["peak"]
    m8 = estimate_memory(s, precision="standard", optim_8bit=True, micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4)
    # 8-bit moments: 2 bytes per value plus two float32 scales per 256-value block of each tensor; the tensors
    # (embed 80, per layer 64 + 32 + 32 + 64 + 128·3 + 8 + 8, final norm 8, head 80) hold at most 256 values
    # each, so one block each: 1 + 9·2 + 1 + 1 = 21 tensors, 21 blocks → 2 × (1352 + 4·21)
    assert len(s.tensors()) == 21 and sum(math.prod(t) for t in s.tensors()) == 1352
    # autocast's bf16 copy: every weight but the embedding (80), the FP32 head (80) and the norms (5 × 8)
    assert m8["optimizer"] == 2 * (1352 + 4 * 21) and m8["weights"] == 1352 * 4 and m8["working_copy"] == (1352 - 160 - 40) * 2
    # bf16 elements (the residual stream cast to bf16), plus the norms' float32 inputs: 4 bytes per hidden unit per
    # layer and token, 2 for the final norm; the head's float32 copy of its input (2 × 6 positions × 8 × 4 B)
    assert m8["activations"] == 2 * 8 * (296 * 2 + 2 * 4 * 8 + 2 * 8) + 480 + 2 * 6 * 8 * 4
    # precision.fp32_residual: the float32 residual stream and norm outputs, 14 bytes per hidden unit per layer and token, 6 at the end
    m32r = estimate_memory(s, precision="standard", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4, fp32_residual=True)
    assert m32r["activations"] == 2 * 8 * (296 * 2 + 2 * 14 * 8 + 6 * 8) + 480
    c = estimate_memory(s, precision="compressed", micro_batch=2, prompt_len=3, completion_len=5, rollout_sequences=4,
                        reference=True, reference_8bit=True)
    assert c["weights"] == c["gradients"] == 1352 * 2 and c["error_feedback"] == 1352 + 4 * 21
    # bf16 weights: no cast copy, but the FP32 head's float32 copy of its weight (10 × 8 × 4 B); the norms'
    # float32 inputs (4 bytes per hidden unit per layer and token, 2 for the final norm); the head's float32
    # copy of its input (2 × 6 positions × 8 × 4 B)
    assert c["working_copy"] == 10 * 8 * 4 and c["activations"] == 2 * 8 * (296 * 2 + 2 * 4 * 8 + 2 * 8) + 480 + 2 * 6 * 8 * 4
    # int8 reference: the 14 linear weights (all but embed and head: 2·(64+32+32+64+128·3) = 1152 values, 2·(8+4+4+8+16+16+8)
    # = 128 rows) at 1 byte + 4 per row; the embedding, head and norms (200 values) at 2 bytes
    assert c["reference"] == 1152 + 4 * 128 + 2 * 200


def test_gpus_and_cost():
    mem = {"states": 100 * 2**30, "activations": 18 * 2**30, "backward_transient": 2 * 2**30, "kv_cache": 10 * 2**30}
    # budget 0.9 × 80 = 72 GiB; 72 − (18 + 2) = 52 per GPU for states → ceil(100 / 52) = 2
    assert gpus_needed(mem, 80) == 2
    assert gpus_needed({**mem, "activations": 80 * 2**30}, 80) is None
    assert gpus_needed({**mem, "backward_transient": 5 * 2**30}, 80) == 3  # 72 − (18 + 5) = 49 per GPU → ceil(100 / 49)
    c = run_cost(steps=1000, tokens_per_step=3.6e5, tokens_per_s=1e5, gpus=8, price_per_gpu_hour=2.0, efficiency=0.8)
    # hours = 1000 × 3.6e5 / 1e5 / 3600 = 1; cost = 2 × 8 GPU-h / 0.8 = 20
    assert c["hours"] == 1.0 and c["gpu_hours"] == 8.0 and c["cost"] == 20.0
    assert efficiency_for(6.7e9) == 0.85 and efficiency_for(13e9) == 0.72 and efficiency_for(69e9) == 0.53


def test_bad_precision():
    with pytest.raises(ScaleRLError, match="--precision"):
        estimate_memory(MODEL_PRESETS["7b"], precision="int4", micro_batch=1, prompt_len=1, completion_len=1, rollout_sequences=1)


def _random_batch(vocab: int, micro: int, prompt: int, completion: int):
    """`micro` rows of random prompt and completion tokens, no padding, each row its own group."""
    import torch

    from scalerl.types import Rollout

    g = torch.Generator().manual_seed(1)
    ones = lambda n: torch.ones(micro, n, dtype=torch.long)  # noqa: E731
    return Rollout(prompt_ids=torch.randint(3, vocab, (micro, prompt), generator=g), prompt_mask=ones(prompt),
                   completion_ids=torch.randint(3, vocab, (micro, completion), generator=g), completion_mask=ones(completion),
                   sampler_logprobs=torch.zeros(micro, completion), group_ids=torch.arange(micro),
                   truncated=torch.zeros(micro, dtype=torch.bool))


@pytest.mark.parametrize("mode, fp32_residual, chunk", [("fp32", False, 0), ("standard", False, 0), ("standard", True, 0),
                                                        ("compressed", False, 0), ("fp32", False, 5), ("compressed", False, 5)])
def test_activations_and_working_copy_match_what_autograd_saves(mode, fp32_residual, chunk):
    """Each mode's forward, as the learner runs it (weights dtype, bf16 autocast, FP32 head), against the
    estimate: the tensors autograd saves for backward (parameters excluded) split into the working copy
    (bf16 casts of fp32 weights, or the FP32 head's float32 weight copy) and activations."""
    import contextlib

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scalerl.models.logprobs import completion_forward
    from scalerl.config.plan import precision_policy
    from scalerl.precision.apply import prepare_policy, weights_dtype

    h, i, layers, heads, kv, vocab, micro, prompt, completion = 64, 192, 2, 4, 2, 50, 4, 12, 6
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=heads,
                                         num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=False,
                                         attn_implementation="sdpa"))
    policy = precision_policy(mode, fp32_residual=fp32_residual)
    model = model.to(weights_dtype(policy)).train()
    prepare_policy(model, policy, torch.device("cpu"))  # standard: the residual stream in bf16 unless fp32_residual
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    casts = {p.numel() * 2 for p in model.parameters() if p.dim() == 2}
    head_copy = model.lm_head.weight.numel() * 4
    saved, copies = {}, {}

    def pack(t):
        ptr, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        if ptr not in params:
            copy = (t.dtype == torch.bfloat16 and nbytes in casts) if mode == "standard" else (
                mode != "fp32" and t.dtype == torch.float32 and nbytes == head_copy)
            (copies if copy else saved)[ptr] = nbytes
        return t

    batch = _random_batch(vocab, micro, prompt, completion)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if policy.autocast_dtype else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        completion_forward(model, batch, fp32_head=policy.fp32_lm_head, chunk_tokens=chunk)
    shape = ModelShape(vocab=vocab, hidden=h, intermediate=i, layers=layers, heads=heads, kv_heads=kv, head_dim=h // heads)
    est = estimate_memory(shape, precision=mode, micro_batch=micro, prompt_len=prompt, completion_len=completion, rollout_sequences=micro,
                          fp32_residual=fp32_residual, logprob_chunk=chunk)
    assert sum(copies.values()) == est["working_copy"]
    assert sum(saved.values()) == pytest.approx(est["activations"], rel=0.03)


@pytest.mark.parametrize("mode, vocab, hidden, micro, completion, chunk", [
    ("fp32", 4000, 32, 4, 15, 0), ("compressed", 4000, 32, 4, 15, 0), ("fp32", 2000, 512, 1, 3, 0), ("compressed", 2000, 512, 1, 3, 0),
    ("fp32", 4000, 32, 4, 15, 16), ("compressed", 4000, 32, 4, 15, 16), ("fp32", 2000, 512, 4, 15, 8)])  # the chunked head
def test_backward_transient_matches_what_the_backward_allocates(mode, vocab, hidden, micro, completion, chunk):
    """The bytes the backward allocates beyond what it frees, at their highest, against `backward_transient`:
    a large vocabulary makes the log-softmax's 4 × logits the larger, a wide head its weight's gradient. Every
    tensor an aten op creates during backward is tracked (a TorchDispatchMode; each storage counted once, until
    it is freed); the forward's saved tensors are left out (the backward frees them later than these peaks)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import LlamaConfig, LlamaForCausalLM

    from scalerl.models.logprobs import completion_forward
    from scalerl.config.plan import precision_policy
    from scalerl.precision.apply import weights_dtype

    prompt = 6
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      vocab_size=vocab, tie_word_embeddings=False, attn_implementation="sdpa")
    policy = precision_policy(mode)
    model = LlamaForCausalLM(cfg).to(weights_dtype(policy)).train()
    batch = _random_batch(vocab, micro, prompt, completion)
    for p in model.parameters():  # a second micro-batch's backward: the gradients exist already
        p.grad = torch.zeros_like(p)
    out = completion_forward(model, batch, fp32_head=policy.fp32_lm_head, chunk_tokens=chunk)
    loss = -(out.logprobs.float() * torch.randn(micro, 1)).mean()

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live, self.peak, self.seen = 0, 0, set()

        def _freed(self, ptr, nbytes):
            self.live -= nbytes
            self.seen.discard(ptr)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for t in tree_flatten(out)[0]:  # new storages only: not in-place results nor views of an input
                if (isinstance(t, torch.Tensor) and (s := t.untyped_storage()).data_ptr() not in self.seen | inputs
                        and s.nbytes()):
                    self.seen.add(s.data_ptr())
                    self.live += s.nbytes()
                    weakref.finalize(s, self._freed, s.data_ptr(), s.nbytes())
            self.peak = max(self.peak, self.live)
            return out

    with Live() as tracker:
        loss.backward()
    shape = ModelShape(vocab=vocab, hidden=hidden, intermediate=64, layers=1, heads=2, kv_heads=2, head_dim=hidden // 2)
    est = estimate_memory(shape, precision=mode, micro_batch=micro, prompt_len=prompt, completion_len=completion,
                          rollout_sequences=2 * micro, logprob_chunk=chunk)["backward_transient"]
    assert tracker.peak == pytest.approx(est, rel=0.1)
