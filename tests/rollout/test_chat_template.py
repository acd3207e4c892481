"""env.chat_template: prompts rendered through a tokenizer's template (tests/rollout/chat_models.py: the built-in
character tokenizer plus ChatML-style turn tokens), system prompts, conversational rows, and completions that
stop on the template's end-of-turn token."""

from __future__ import annotations

import pytest
import torch
from chat_models import chat_llama, chat_tokenizer
from conftest import tiny_overrides

from scalerl.errors import ScaleRLError
from scalerl.rollout.chat import prompt_format
from scalerl.types import SamplingParams, Task

def steer_head(model, tok, favour: dict[int, float], never: list[int]):
    """`model` with an LM head bias: + the given logit on the `favour` tokens, −1e4 on the `never` ones (a random
    chat Llama that ends its turns soon and never writes what a test rules out)."""
    bias = torch.zeros(len(tok))
    for token, logit in favour.items():
        bias[token] = logit
    bias[never] = -1e4
    head = torch.nn.Linear(model.config.hidden_size, len(tok), bias=True)
    head.weight.data, head.bias.data = model.lm_head.weight.data.clone(), bias
    model.lm_head = head
    return model


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A folder with `chat_tokenizer()` and a `chat_llama` of its vocabulary."""
    folder = tmp_path_factory.mktemp("chat")
    tok = chat_tokenizer()
    tok.save_pretrained(folder)
    chat_llama(tok).save_pretrained(folder)
    return folder


def _tok(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_prompts_go_through_the_template_with_system_prompt_and_messages(chat_model, tmp_path):
    tok = _tok(chat_model)
    fmt = prompt_format("auto", "be brief", tok)
    text = tok.decode(fmt.encode(Task("12+3=")))
    assert text == "<|im_start|>system be brief<|im_end|> <|im_start|>user 12+3=<|im_end|> <|im_start|>assistant "
    conversation = Task("ignored", meta={"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "2+2="}]})
    assert tok.decode(fmt.encode(conversation)) == "<|im_start|>system own<|im_end|> <|im_start|>user 2+2=<|im_end|> <|im_start|>assistant "
    assert tok.decode(prompt_format("none", None, tok).encode(Task("12+3="))) == "<s>12+3="  # raw, as the tokenizer adds BOS
    template_file = tmp_path / "t.jinja"
    template_file.write_text("{% for m in messages %}Q: {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}A: {% endif %}")
    assert tok.decode(prompt_format(str(template_file), None, tok).encode(Task("1+1="))) == "Q: 1+1= A: "
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert fmt.end_of_turn_id() == im_end and fmt.stop_ids() == [tok.eos_token_id, im_end]
    assert prompt_format(str(template_file), None, tok).stop_ids() == [tok.eos_token_id]  # that template has no end-of-turn token
    with pytest.raises(ScaleRLError, match="chat_template=none"):
        prompt_format("none", None, tok).encode(conversation)
    with pytest.raises(ScaleRLError, match="env.chat_template"):
        prompt_format(str(tmp_path / "missing.jinja"), None, tok)


def test_a_completion_stops_on_the_end_of_turn_token(chat_model):
    from transformers import AutoModelForCausalLM

    from scalerl.envs.scoring import completions_of
    from scalerl.rollout.hf import HFSampler

    tok = _tok(chat_model)
    model = AutoModelForCausalLM.from_pretrained(chat_model)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    head = torch.nn.Linear(model.config.hidden_size, len(tok), bias=True)  # a head that always prefers <|im_end|>
    torch.nn.init.zeros_(head.weight)
    head.bias.data = torch.nn.functional.one_hot(torch.tensor(im_end), len(tok)).float() * 10
    model.lm_head = head
    fmt = prompt_format("auto", None, tok)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, n=1, min_new_tokens=2)
    prompt = [fmt.encode(Task("1+1="))]
    stops = HFSampler(model, pad_id=tok.pad_token_id, eos_id=fmt.stop_ids(), device=torch.device("cpu")).sample(prompt, params)
    assert stops.completion_mask.sum().item() == 3 and not stops.truncated.item()  # 2 forced tokens, then <|im_end|>
    assert stops.completion_ids[0, 2].item() == im_end
    assert im_end not in completions_of(stops, tok)[0].token_ids  # the text ends before it, as before EOS
    eos_only = HFSampler(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, device=torch.device("cpu")).sample(prompt, params)
    assert eos_only.truncated.item() and eos_only.completion_mask.sum().item() == 8  # without it, the turn never ends


def test_the_trainer_samples_templated_prompts(chat_model, tmp_path):
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer.loop import build_roles

    config = load_config(overrides=tiny_overrides(tmp_path, "chat", **{"model.path": str(chat_model), "env.system_prompt": "sum",
                                                                       "rollout.max_new_tokens": 4}))
    rollout, _, _ = build_roles(config, DistContext(), resume=False)
    try:
        batch = rollout.produce(1)
    finally:
        rollout.close()
    text = _tok(chat_model).decode(batch.rollout.prompt_ids[0][batch.rollout.prompt_mask[0].bool()])
    assert text.startswith("<|im_start|>system sum<|im_end|> <|im_start|>user ") and text.endswith("<|im_start|>assistant ")
    assert rollout.sampler.stop_ids.tolist() == [2, _tok(chat_model).convert_tokens_to_ids("<|im_end|>")]


def test_conversational_rows_in_jsonl_become_messages(chat_model, tmp_path):
    import json

    from scalerl.envs.registry import build_env

    rows = [{"prompt": [{"role": "system", "content": "add"}, {"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)}
            for i in range(12)]
    data = tmp_path / "conv.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = build_env("math", {"data_path": str(data), "eval_size": 2})
    task = next(t for t in env.train_tasks() + env.eval_tasks() if t.answer == "4")
    assert task.prompt == "3+1=" and task.meta["messages"][0] == {"role": "system", "content": "add"}
    tok = _tok(chat_model)
    assert tok.decode(prompt_format("auto", None, tok).encode(task)) == \
        "<|im_start|>system add<|im_end|> <|im_start|>user 3+1=<|im_end|> <|im_start|>assistant "
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": [{"role": "user"}], "answer": "1"}) + "\n")
    with pytest.raises(ScaleRLError, match="a list of"):
        build_env("math", {"data_path": str(tmp_path / "bad.jsonl"), "eval_size": 1}).train_tasks()
