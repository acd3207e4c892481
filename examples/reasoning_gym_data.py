"""The SFT data of the reasoning-gym tutorial: the environment's training tasks with their reference answers,
as JSONL of {prompt, response} (docs/tutorials/reasoning-gym.md).

    python examples/reasoning_gym_data.py --config examples/reasoning_gym.yaml --out runs/rg_sft.jsonl

Only training tasks are written (the held-out ones come from other seeds). The response is what the
environment's answer extraction reads: the answer alone for extract=last_line, `<answer>X</answer>` for answer_tag.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scalerl.config import load_config
from scalerl.envs.registry import build_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="A run config whose env is reasoning_gym.")
    parser.add_argument("--out", type=Path, required=True, help="The JSONL file to write.")
    args = parser.parse_args()
    config = load_config(args.config)
    env = build_env(config.env.name, config.env.args)
    tag = config.env.args.get("extract", "answer_tag") == "answer_tag"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for task in env.train_tasks():
            response = f"<answer>{task.answer}</answer>" if tag else task.answer
            f.write(json.dumps({"prompt": task.prompt, "response": response}) + "\n")
    print(f"wrote {len(env.train_tasks())} examples to {args.out}")


if __name__ == "__main__":
    main()
