"""What `--dry-run` checks beyond the schema, without training: the model (a local folder's tokenizer loads;
a hub id is in the local cache or answers within seconds), the environment's data (every file parses and has
the columns the environment needs; rows counted), every prompt fits the model's positions (or
`rollout.truncate_prompts` cuts it), every reward function (imports and is called once on a
sample row) and the code environment's sandbox. Each problem is one line naming the key and the fix; each
check is bounded by `CHECK_TIMEOUT_S` so a dry run answers in seconds (`HF_HUB_OFFLINE=1`: the cache only).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from scalerl.config import Config
from scalerl.errors import ScaleRLError

CHECK_TIMEOUT_S = 4.0


def _bounded(fn: Callable[[], Any], what: str, fix: str) -> Any:
    """fn() in a daemon thread, given at most CHECK_TIMEOUT_S seconds; a ScaleRLError naming `what` otherwise."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the caller, which raises it
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True, name=f"dry-run {what}")
    thread.start()
    thread.join(CHECK_TIMEOUT_S)
    if thread.is_alive():
        raise ScaleRLError(f"{what}: no answer within {CHECK_TIMEOUT_S:g} s; {fix}")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0][:200] if lines else "") or type(err).__name__


def check_hub_id(repo: str, field: str) -> str:
    """A hub id: in the local Hugging Face cache, else (unless HF_HUB_OFFLINE=1) known to the hub within seconds."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return f"{field}: {repo} (hub id, in the local cache)"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ScaleRLError(f"{field}: {repo} is not a local folder and not in the Hugging Face cache, and the hub is off "
                           "(HF_HUB_OFFLINE=1); download it first or give a local model folder")

    def ask() -> None:
        from huggingface_hub import HfApi

        HfApi().model_info(repo, timeout=CHECK_TIMEOUT_S)

    try:
        _bounded(ask, field, f"{repo} is not a local folder and the hub does not answer; give a local model folder")
    except ScaleRLError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever the hub client raises: the id cannot be had
        raise ScaleRLError(f"{field}: {repo} is not a local folder and the hub cannot give it ({type(err).__name__}: "
                           f"{_first_line(err)}); give a local model folder or check the id") from None
    return f"{field}: {repo} (hub id, reachable)"


def check_model(config: Config) -> list[str]:
    """The model and its tokenizer: a local folder's tokenizer loads (with an EOS token); a hub id can be had."""
    from scalerl.models.paths import resolve_model_path

    lines = []
    for field, value in (("model.path", config.model.path), ("model.tokenizer", config.model.tokenizer)):
        if value is None:
            continue
        source = resolve_model_path(value, field)
        lines.append(f"{field}: {value}" if os.path.isdir(source) else check_hub_id(source, field))
    if config.model.path != "builtin" or config.model.tokenizer:
        lines += check_tokenizer_files(config)
    return lines


def check_tokenizer_files(config: Config) -> list[str]:
    """A local tokenizer's JSON files parse and tokenizer.json has a vocabulary (read as JSON: importing transformers
    alone takes seconds)."""
    import json

    from scalerl.models.paths import resolve_model_path

    field = "model.tokenizer" if config.model.tokenizer else "model.path"
    folder = resolve_model_path(config.model.tokenizer or config.model.path, field)
    if not os.path.isdir(folder):
        return []
    size = None
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                tree = json.loads(f.read().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ScaleRLError(f"{field}: {path} is not valid JSON ({type(err).__name__}: {_first_line(err)}); "
                               "restore the tokenizer's files") from None
        if name == "tokenizer.json":
            vocab = tree.get("model", {}).get("vocab") if isinstance(tree, dict) else None
            if vocab is not None and not vocab:
                raise ScaleRLError(f"{field}: {path} has an empty vocabulary; point model.tokenizer at a tokenizer that has one")
            size = len(vocab) if vocab is not None else None
    return [f"tokenizer: {folder}" + (f" ({size} tokens)" if size else "")]


def check_environment(config: Config):
    """The environment builds from env.args (every data file read and checked); (report lines, environment)."""
    from scalerl.envs.registry import build_env

    env = build_env(config.env.name, config.env.args)
    train, held_out = len(env.train_tasks()), len(env.eval_tasks())
    return [f"env {config.env.name}: {train} training tasks, {held_out} held-out tasks"], env


def check_sandbox(config: Config) -> list[str]:
    """The code environment: its sandbox runs a program at the configured isolation."""
    if config.env.name != "code":
        return []
    from scalerl.envs.sandbox import SandboxSetupError, run_sandboxed

    isolation = config.env.args.get("isolation", "auto")
    try:
        result = _bounded(lambda: run_sandboxed("print('ok')", timeout_s=CHECK_TIMEOUT_S, isolation=isolation),
                          "env.args.isolation", "the sandbox does not start; try isolation: process")
    except SandboxSetupError as err:
        raise ScaleRLError(f"env.args.isolation: {_first_line(err)}; try isolation: process") from None
    if result.stdout.strip() != "ok":
        raise ScaleRLError(f"env.args.isolation: the sandbox ran a test program and it failed ({result.stderr.strip()[-200:]}); "
                           "try isolation: process")
    return [f"sandbox: {result.isolation}"]


def check_reward_functions(config: Config, env: Any) -> list[str]:
    """Each reward function imports and, called once on a sample row, returns one finite-or-None score."""
    from scalerl.rewards.safe_call import (
        RewardCallError,
        call_function,
        check_length,
        resolve_function,
    )

    lines = []
    task = env.train_tasks()[0] if env is not None else None
    prompt = task.prompt if task is not None and isinstance(task.prompt, str) else "1 + 1 ="
    completion = str(task.answer) if task is not None and task.answer is not None else "2"
    if task is None:
        kwargs = {"answers": [completion], "tasks": [task], "finished": [True], "group_ids": [0]}
    else:  # the sample row's columns by name, as in training (RewardInputs.function_kwargs)
        from scalerl.rewards.components import RewardInputs

        kwargs = RewardInputs([prompt], [completion], [True], [task], [0], None).function_kwargs()
    for i, comp in enumerate(config.reward.components):
        if comp.function is None:
            continue
        where = f"reward.components.{i}.function"
        fn = resolve_function(comp.function, where)
        if env is None:  # the environment did not build (its line is above): no row of the user's data to call it on
            lines.append(f"reward {comp.name}: {comp.function} imports; not called (no sample row: the environment did not build)")
            continue
        try:
            scores = _bounded(lambda fn=fn, comp=comp: check_length(call_function(fn, comp.function, [prompt], [completion], kwargs,
                                                                                   comp.timeout_s), 1, comp.function),
                              where, f"{comp.function} did not return within {CHECK_TIMEOUT_S:g} s on one sample row")
        except ScaleRLError:
            raise
        except RewardCallError as err:
            raise ScaleRLError(f"{where}: {err.message}; fix the function") from None
        except Exception as err:  # noqa: BLE001 - whatever the user's function raises is reported, in one line
            raise ScaleRLError(f"{where}: {comp.function} raised {type(err).__name__}: {_first_line(err)} on a sample row "
                               f"(prompt {prompt[:40]!r}); fix the function") from None
        as_completion = "its answer as the completion" if task is not None and task.answer is not None else "the completion"
        lines.append(f"reward {comp.name}: {comp.function} scored {scores[0]:.4g} on the first training row (prompt "
                     f"{prompt[:40]!r}, {as_completion} {completion[:40]!r})")
    return lines


def check_prompt_lengths(config: Config, env: Any) -> list[str]:
    """Every training and held-out prompt, encoded as the run encodes it (tokenizer and env.chat_template), fits in the
    model's positions less max_new_tokens, or rollout.truncate_prompts cuts it (scalerl/rollout/prompt_fit.py)."""
    from scalerl.models.loading import load_tokenizer
    from scalerl.rollout.chat import prompt_format
    from scalerl.rollout.prompt_fit import fit_notice, fit_problem, measure, prompt_limit

    positions = model_config_positions(config)
    limit = prompt_limit(config, positions)
    if env is None or limit is None:  # the model (and the engine) say no limit: nothing to check
        return []
    fmt = prompt_format(config.env.chat_template, config.env.system_prompt, load_tokenizer(config.model))
    lengths = measure(fmt, [("training", env.train_tasks()), ("held-out", env.eval_tasks()[: config.eval.max_tasks])], limit)
    problem = fit_problem(config, lengths, limit, positions)
    if problem is not None:
        raise ScaleRLError(problem)
    notice = fit_notice(config, lengths, limit)
    return [f"prompts: {notice}" if notice else
            f"prompts: the longest ({lengths.where}) has {lengths.longest} tokens of the {limit} that fit"]


def model_config_positions(config: Config) -> int | None:
    """The model's positions from its config.json: a local folder's, or a hub id's in the local cache (None: unknown)."""
    import json

    from scalerl.models.paths import max_positions, read_model_config, resolve_model_path

    source = resolve_model_path(config.model.path)
    if os.path.isdir(source):
        has_config = os.path.isfile(os.path.join(source, "config.json"))
        return max_positions(read_model_config(source, "model.path")) if has_config else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json")
    if not isinstance(cached, str):
        return None
    try:
        with open(cached, "rb") as f:
            return max_positions(json.loads(f.read()))
    except (OSError, ValueError):
        return None


def preflight(config: Config) -> tuple[list[str], list[str]]:
    """(what was checked, one line each; the problems found, one line each)."""
    report: list[str] = []
    problems: list[str] = []
    env = None

    def attempt(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except ScaleRLError as err:
            problems.append(str(err))
            return None

    report += attempt(lambda: check_model(config)) or []
    built = attempt(lambda: check_environment(config))
    if built is not None:
        report += built[0]
        env = built[1]
    report += attempt(lambda: check_prompt_lengths(config, env)) or []
    report += attempt(lambda: check_sandbox(config)) or []
    report += attempt(lambda: check_reward_functions(config, env)) or []
    return report, problems
