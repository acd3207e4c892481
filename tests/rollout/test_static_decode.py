"""rollout.decode (scalerl/rollout/static_decode.py): decoding on a static KV cache gives the model's own forward's
tokens and log-probs, for every family it takes (llama, mistral, qwen2's biases, qwen3's q/k norms, grouped-query
attention, sdpa and eager arithmetic), keeps its buffers across generations of one shape, and leaves what it cannot
do (another family, a short sliding window) to the model's forward."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from scalerl.errors import ScaleRLError
from scalerl.rollout.hf import CompileTrial, HFSampler
from scalerl.rollout.static_decode import StaticDecoder, decode_path, unsupported
from scalerl.types import SamplingParams

PROMPTS = [[1, 5, 6, 14, 7, 9, 15], [1, 5, 14, 7, 15], [1, 9, 9, 14, 9, 9, 15]]  # left padding differs between rows
SMALL = dict(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _model(model_type: str, attn: str = "sdpa", **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


def _sample(model, decode: str, params: SamplingParams, autocast=None, sampler: HFSampler | None = None):
    sampler = sampler or HFSampler(model, pad_id=0, eos_id=2, device=torch.device("cpu"), decode=decode, autocast=autocast)
    return sampler.sample(PROMPTS, params, seeds=[11, 12, 13]), sampler


@pytest.mark.parametrize("model_type, extra", [("llama", {}), ("mistral", {}), ("qwen2", {}), ("qwen3", {"head_dim": 8})])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_static_cache_samples_the_models_own_tokens(model_type, extra, attn):
    model = _model(model_type, attn, **extra)
    if model_type == "qwen2":  # its q/k/v biases (zero at init) must count
        for layer in model.get_decoder().layers:
            torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.5)
            torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.5)
    assert unsupported(model, 32) is None
    params = SamplingParams(max_new_tokens=12, min_new_tokens=12, temperature=1.0, n=4)  # 12 decode steps, no early stop
    own, _ = _sample(model, "hf", params)
    static, sampler = _sample(model, "auto", params)
    assert sampler._static is not None and sampler._static.length == own.prompt_ids.shape[1] + 11  # it decoded
    assert torch.equal(static.completion_ids, own.completion_ids)
    torch.testing.assert_close(static.sampler_logprobs, own.sampler_logprobs, atol=1e-5, rtol=1e-5)


def test_under_bf16_autocast_it_runs_the_same_arithmetic():
    model = _model("llama", "eager")
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, n=1)  # greedy
    own, _ = _sample(model, "hf", params, autocast)
    static, sampler = _sample(model, "auto", params, autocast)
    assert sampler._static is not None
    assert sampler._static.keys[0].dtype == torch.bfloat16  # what autocast casts the cache to for every product, once
    assert torch.equal(static.completion_ids, own.completion_ids)
    torch.testing.assert_close(static.sampler_logprobs, own.sampler_logprobs, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_under_standard_precision_its_log_probs_are_the_models_own(attn):
    """precision.mode=standard casts the residual stream to bf16, so the model's forward runs its rotary embedding in
    bf16: the static decode does too (its rotary in float32 moved the log-probs by up to 7e-4)."""
    from scalerl.config import load_config
    from scalerl.precision.apply import prepare_policy

    model = _model("llama", attn)
    prepare_policy(model, load_config(overrides={"precision.mode": "standard"}).precision_policy, torch.device("cpu"))
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=10, min_new_tokens=10, temperature=1.0, n=3)
    own, _ = _sample(model, "hf", params, autocast)
    static, sampler = _sample(model, "auto", params, autocast)
    assert sampler._static.cos.dtype == torch.bfloat16
    assert torch.equal(static.completion_ids, own.completion_ids)
    assert torch.equal(static.sampler_logprobs, own.sampler_logprobs)


def test_eager_attention_over_the_whole_buffer_ignores_what_the_columns_not_yet_written_hold():
    """Eager attention runs over every column of the buffers, the unwritten ones masked: whatever an earlier generation
    left there (here NaN) must not reach this one's numbers."""
    model = _model("llama", "eager")
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0, n=2)
    own, _ = _sample(model, "hf", params)
    _, sampler = _sample(model, "auto", params)
    for buffer in (*sampler._static.keys, *sampler._static.values):
        buffer.fill_(float("nan"))
    again, _ = _sample(model, "auto", params, sampler=sampler)
    assert torch.equal(again.completion_ids, own.completion_ids)
    torch.testing.assert_close(again.sampler_logprobs, own.sampler_logprobs, atol=1e-5, rtol=1e-5)


def test_buffers_are_kept_for_generations_of_one_shape():
    model = _model("llama")
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0, n=2)
    _, sampler = _sample(model, "auto", params)
    buffers = sampler._static.keys[0]
    sampler.sync_weights(None, 1)  # the next step's weights, as in a run: a shape that served two versions is training's
    again, _ = _sample(model, "auto", params, sampler=sampler)
    assert sampler._static.keys[0] is buffers  # reused, not reallocated
    fresh, _ = _sample(model, "hf", params)
    assert torch.equal(again.completion_ids, fresh.completion_ids)  # a reused buffer holds nothing of the last generation
    shorter = [[1, 5, 14, 7, 15]] * 3  # shorter prompts, the same rows: the same buffers (a multiple of 16 long)
    own = HFSampler(model, pad_id=0, eos_id=2, device=torch.device("cpu"), decode="hf").sample(shorter, params, seeds=[1, 2, 3])
    assert torch.equal(sampler.sample(shorter, params, seeds=[1, 2, 3]).completion_ids, own.completion_ids)
    assert sampler._static.keys[0] is buffers and sampler._static.capacity == 16
    one = sampler.sample(PROMPTS[:1], params, seeds=[5])  # other rows (an evaluation's, say): buffers of its own, freed after it
    assert torch.equal(one.completion_ids, own_sampler(model).sample(PROMPTS[:1], params, seeds=[5]).completion_ids)
    assert sampler._static.keys[0] is buffers  # the buffers of several generations stay


def test_the_prompts_cache_goes_to_each_completions_rows_without_a_repeated_copy(monkeypatch):
    """n completions a prompt: the static buffers take the prompt's cache into its n rows directly; the model's cache is
    not repeated n times first (a copy as large as the buffers' prompt part: with 480-token prompts at W2's width the
    generation's peak fell from 4.2-4.3 to 2.5-2.6 GB, bench/prefill_memory.py). The model's forward (decode=hf) still
    repeats it."""
    from transformers import DynamicCache

    model = _model("llama")
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0, n=3)
    own, _ = _sample(model, "hf", params)
    repeated = []
    monkeypatch.setattr(DynamicCache, "batch_repeat_interleave", lambda self, n: repeated.append(n))
    static, sampler = _sample(model, "auto", params)
    assert repeated == [] and sampler._static is not None
    assert torch.equal(static.completion_ids, own.completion_ids)  # each row decoded from its own prompt's cache
    torch.testing.assert_close(static.sampler_logprobs, own.sampler_logprobs, atol=1e-5, rtol=1e-5)


def own_sampler(model, decode: str = "hf") -> HFSampler:
    return HFSampler(model, pad_id=0, eos_id=2, device=torch.device("cpu"), decode=decode)


@pytest.fixture
def decoders(monkeypatch):
    """A weak reference to every StaticDecoder made, with the garbage collector off: what is alive is what is referenced."""
    made, init = [], StaticDecoder.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(StaticDecoder, "__init__", recording)
    gc.collect()
    gc.disable()
    yield made
    gc.enable()


def test_a_shape_seen_once_gives_way_and_a_shape_seen_often_stays(decoders):
    """The kept buffers are those of the shape that served several weight versions (training's: one generation a
    step), so that an evaluation's larger batch does not hold its buffers through every later step; a shape of one
    version (the evaluation before step 1, in as many batches as it takes) gives way to the next. Buffers let go of
    are freed then, not when the garbage collector comes."""
    model = _model("llama")
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0, n=2)
    sampler = own_sampler(model, "auto")
    for _ in range(3):  # an evaluation in three batches of 24 rows, one version: kept until another shape comes
        sampler.sample(PROMPTS * 4, params, seeds=list(range(12)))
    assert sampler._static.keys[0].shape[0] == 24 and sampler._static.uses == 1 and len(decoders) == 1
    for version in (1, 2, 3):  # training steps, 6 rows: the first replaces the 24-row buffers, the others reuse them
        sampler.sync_weights(None, version)
        sampler.sample(PROMPTS, params, seeds=[1, 2, 3])
    kept = sampler._static.keys[0]
    assert kept.shape[0] == 6 and sampler._static.uses == 3 and len(decoders) == 2
    assert decoders[0]() is None  # the evaluation's, gone
    for _ in range(2):  # a later evaluation: buffers of its own while it runs, freed after; training's stay
        sampler.sample(PROMPTS * 4, params, seeds=list(range(12)))
    assert sampler._static.keys[0] is kept and sampler._static.uses == 3
    assert len(decoders) == 4 and [ref() is None for ref in decoders] == [True, False, True, True]


def test_what_it_cannot_do_goes_to_the_models_forward():
    short_window = _model("mistral", sliding_window=8)
    assert unsupported(short_window, 20) == "a sliding window of 8 positions, shorter than 20"
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=2)
    static, sampler = _sample(short_window, "auto", params)
    assert sampler._static is None
    assert torch.equal(static.completion_ids, _sample(short_window, "hf", params)[0].completion_ids)
    assert "is not one of" in unsupported(_model("gpt2", n_embd=32, n_layer=2, n_head=4), 20)
    gpt2 = _model("gpt2", n_embd=32, n_layer=2, n_head=4)
    assert decode_path(gpt2, "auto") == "the model's forward (model type 'gpt2' is not one of llama, mistral, qwen2, qwen3)"
    assert decode_path(short_window, "auto") == "static KV cache" and decode_path(short_window, "hf").endswith("(rollout.decode=hf)")
    with pytest.raises(ValueError, match="decode='static'; use auto, hf or compiled"):
        HFSampler(short_window, pad_id=0, eos_id=2, device=torch.device("cpu"), decode="static")


def test_the_compiled_step_samples_the_same_tokens(caplog):
    """rollout.decode=compiled: the static step through torch.compile (fixed shapes: the whole buffer, a mask), once
    per batch shape; the same tokens as the model's forward, and a prompt of another length reuses the graph."""
    model = _model("llama", num_hidden_layers=1)  # one layer: the smallest graph to compile (~6 s on 2 cores)
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0, n=2)
    own, _ = _sample(model, "hf", params)
    compiled, sampler = _sample(model, "compiled", params)
    assert sampler._static.compiled and sampler._static.capacity % 16 == 0
    assert "compiling the decode step for 6 rows x 16 positions (once per batch shape" in caplog.text
    assert torch.equal(compiled.completion_ids, own.completion_ids)
    torch.testing.assert_close(compiled.sampler_logprobs, own.sampler_logprobs, atol=1e-5, rtol=1e-5)
    graph = sampler._static
    for buffer in graph.values:  # the compiled step attends over every column: what an earlier generation left there
        buffer.fill_(float("nan"))  # (here NaN) must not reach the next one's numbers
    assert torch.equal(sampler.sample(PROMPTS, params, seeds=[11, 12, 13]).completion_ids, own.completion_ids)
    shorter = [[1, 5, 14, 7, 15]] * 3  # another prompt length, the same rows: the same buffers and graph
    assert torch.equal(sampler.sample(shorter, params, seeds=[1, 2, 3]).completion_ids,
                       HFSampler(model, pad_id=0, eos_id=2, device=torch.device("cpu"), decode="hf").sample(shorter, params, seeds=[1, 2, 3]).completion_ids)
    assert sampler._static is graph


def _trial_sampler(monkeypatch, model, planned: int, seconds: dict[bool, float], decode: str = "auto") -> HFSampler:
    """A sampler whose kept decoder's generations are timed as `seconds[compiled]` (the verdict's input, fixed)."""
    record = CompileTrial.record
    monkeypatch.setattr(CompileTrial, "record", lambda self, decoder, _s, version: record(self, decoder, seconds[decoder.compiled], version))
    return HFSampler(model, pad_id=0, eos_id=2, device=torch.device("cpu"), decode=decode, planned_generations=planned)


def test_auto_compiles_a_long_runs_decode_step_and_keeps_it_when_faster(monkeypatch, caplog):
    """rollout.decode=auto: once its first generations say that the run's remaining ones would take over AHEAD_S
    eagerly, the kept decoder's step is compiled (really: torch.compile) and kept when its generations are faster;
    every generation samples the model's own tokens, before, during and after."""
    model = _model("llama", num_hidden_layers=1)  # one layer: the smallest graph to compile
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0, n=2)
    own, _ = _sample(model, "hf", params)
    sampler = _trial_sampler(monkeypatch, model, planned=1000, seconds={False: 1.0, True: 0.5})
    compiled_at = []
    for generation in range(1, 9):  # 1 warm-up + 3 timed eagerly; the 5th compiles; 3 more timed compiled
        sampler.sync_weights(None, generation - 1)  # a training step's policy version (the learner's own weights)
        out, _ = _sample(model, "auto", params, sampler=sampler)
        assert torch.equal(out.completion_ids, own.completion_ids), generation
        torch.testing.assert_close(out.sampler_logprobs, own.sampler_logprobs, atol=1e-5, rtol=1e-5)
        if sampler._static.compiled:
            compiled_at.append(generation)
    assert compiled_at == [4, 5, 6, 7, 8]  # swapped after the 4th generation's verdict, in place for the 5th
    assert sampler.trial.verdict == "kept" and sampler._static.uses == 8  # weight versions, carried over the swap
    assert "1000 generations ahead" not in caplog.text and "996 generations ahead at 1 s each (996 s): compiling" in caplog.text
    assert "took 0.5 s a generation against 1 s eagerly" in caplog.text and caplog.text.rstrip().endswith("kept")


def _no_compile(fn, **_options):  # torch.compile's stand-in: the step as it is (what the verdict does not look at)
    return fn


@pytest.mark.parametrize("planned, compiled_s, verdict, compiled_after", [
    (1000, 0.5, "kept", True),  # faster: kept
    (1000, 2.0, "reverted", False),  # the compiled step slower: back to the eager one
    (1000, 0.97, "reverted", False),  # within MARGIN: not worth a graph
    (600, 0.5, None, False),  # 596 generations x 1 s ahead: under AHEAD_S, never tried
])
def test_auto_goes_back_to_the_eager_step_or_never_tries(monkeypatch, planned, compiled_s, verdict, compiled_after):
    monkeypatch.setattr("scalerl.rollout.static_decode.torch.compile", _no_compile)
    model = _model("llama", num_hidden_layers=1)
    params = SamplingParams(max_new_tokens=4, min_new_tokens=4, temperature=1.0, n=2)
    own, _ = _sample(model, "hf", params)
    sampler = _trial_sampler(monkeypatch, model, planned=planned, seconds={False: 1.0, True: compiled_s})
    for version in range(12):
        sampler.sync_weights(None, version)
        out, _ = _sample(model, "auto", params, sampler=sampler)
        assert torch.equal(out.completion_ids, own.completion_ids)
    assert sampler.trial.verdict == verdict and sampler._static.compiled is compiled_after
    assert len(sampler.trial.eager) == CompileTrial.TIMED + 1  # the warm-up and the last TIMED, however long the run
    evaluation = sampler.sample(PROMPTS[:2], params, seeds=[11, 12])  # another shape: its own decoder, eager, gone after
    assert torch.equal(evaluation.completion_ids, own.completion_ids[:4]) and sampler._static.compiled is compiled_after


def _broken_compile(fn, **_options):
    def step(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\n(details)")
    return step


def test_a_step_that_does_not_compile_runs_eagerly_under_auto_and_stops_an_explicit_compiled(monkeypatch, caplog):
    monkeypatch.setattr("scalerl.rollout.static_decode.torch.compile", _broken_compile)
    model = _model("llama", num_hidden_layers=1)
    params = SamplingParams(max_new_tokens=4, min_new_tokens=4, temperature=1.0, n=2)
    own, _ = _sample(model, "hf", params)
    sampler = _trial_sampler(monkeypatch, model, planned=1000, seconds={False: 1.0, True: 0.5})
    for version in range(7):
        sampler.sync_weights(None, version)
        out, _ = _sample(model, "auto", params, sampler=sampler)
        assert torch.equal(out.completion_ids, own.completion_ids)
    assert sampler.trial.verdict == "failed" and not sampler._static.compiled
    assert "the decode step did not compile (RuntimeError: InvalidCxxCompiler: No working C++ compiler found); it runs eagerly" in caplog.text
    with pytest.raises(ScaleRLError, match=r"^rollout.decode=compiled: torch.compile failed on the decode step \(RuntimeError: "
                       r"InvalidCxxCompiler: No working C\+\+ compiler found\); use rollout.decode=auto"):
        _sample(model, "compiled", params)
