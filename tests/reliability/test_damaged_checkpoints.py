"""A damaged newest checkpoint never blocks a resume: it is detected (sizes and hashes of save
time), set aside as `.damaged` (`.unverified` without a manifest: never opened), and the run resumes
from the newest intact one, ending exactly where the undamaged run ends."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from faults_common import overrides, same_run, train
from scalerl.config import load_config
from scalerl.errors import ScaleRLError
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer import loop


def _truncate(path, keep=0.5):
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _garbage(path):
    path.write_bytes(os.urandom(path.stat().st_size))


DAMAGE = {  # what a disk, a copy or a person can do to the newest checkpoint's files
    "model.safetensors truncated to half": lambda d: _truncate(d / "model.safetensors"),
    "model.safetensors empty": lambda d: _truncate(d / "model.safetensors", 0),
    "model.safetensors one byte flipped (same size)": lambda d: _flip_byte(d / "model.safetensors"),
    "dcp/__0_0.distcp (weights and optimizer shards) garbage of the same size": lambda d: _garbage(d / "dcp" / "__0_0.distcp"),
    "dcp/__0_0.distcp missing": lambda d: (d / "dcp" / "__0_0.distcp").unlink(),
    "dcp/.metadata (DCP's commit record) missing": lambda d: (d / "dcp" / ".metadata").unlink(),
    "trainer_state.json not JSON": lambda d: (d / "trainer_state.json").write_text("{ step: 6, broken"),
    "trainer_state.json missing": lambda d: (d / "trainer_state.json").unlink(),
    "rng_rank0.pt truncated": lambda d: _truncate(d / "rng_rank0.pt"),
    "manifest.json garbage": lambda d: (d / "manifest.json").write_text("not json"),
    "config.json missing": lambda d: (d / "config.json").unlink(),
    # a checkpoint written before manifests existed, or whose manifest was deleted: never opened (it might hold anything)
    "no manifest, dcp/__0_0.distcp truncated": lambda d: ((d / "manifest.json").unlink(), _truncate(d / "dcp" / "__0_0.distcp")),
    "no manifest, trainer_state.json not JSON": lambda d: ((d / "manifest.json").unlink(),
                                                         (d / "trainer_state.json").write_text("{")),
}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    runs = tmp_path_factory.mktemp("straight")
    train(runs, "run")
    return runs / "run"


def _crashed_copy(straight, runs):
    """The straight run as a crash after step 7 leaves it: checkpoints of steps 2, 4 and 6, no summary."""
    run = runs / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "checkpoints" / "step_0000008")
    (run / "summary.json").unlink()
    return run


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(straight, runs, capsys, fault, damage):
    run = _crashed_copy(straight, runs)
    newest = run / "checkpoints" / "step_0000006"
    DAMAGE[damage](newest)

    summary = loop.train(load_config(overrides=overrides(runs, "run")), resume=True)

    err = capsys.readouterr().err
    aside = "unverified" if damage.startswith("no manifest") else "damaged"
    warning = next(line for line in err.splitlines() if "is damaged" in line or "has no manifest.json" in line)
    assert "step_0000006" in warning and (run / "checkpoints" / f"step_0000006.{aside}").is_dir()
    assert same_run(run, straight, 8), "the resumed run differs from the undamaged one"
    assert summary["steps"] == 8
    why = ("no manifest.json: nothing in it read" if aside == "unverified" else
           re.search(r"is damaged [(](.*)[)]; moved", warning).group(1))
    fault("checkpoints", f"newest checkpoint damaged: {damage}",
          f"warned ({why}), set aside as .{aside}, resumed from step 4; metrics and final weights identical to the undamaged run")


def test_every_checkpoint_damaged_is_a_one_line_error(straight, runs, fault):
    run = _crashed_copy(straight, runs)
    for folder in ckpt.complete_checkpoints(run / "checkpoints"):
        _truncate(folder / "model.safetensors")
    with pytest.raises(ScaleRLError, match="no intact checkpoint") as err:
        loop.train(load_config(overrides=overrides(runs, "run")), resume=True)
    assert "\n" not in str(err.value)
    fault("checkpoints", "every checkpoint damaged (3 of 3 truncated)", f"one-line error: {str(err.value).replace(str(runs), 'runs')}")


def test_verification_names_what_changed(tmp_path):
    folder = tmp_path / "step_0000001"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"abc")
    ckpt.write_manifest(folder)
    assert ckpt.verify_checkpoint(folder) is None
    (folder / "a.bin").write_bytes(b"abd")
    assert ckpt.verify_checkpoint(folder) == "a.bin does not match its SHA-256 of save time"
    (folder / "a.bin").write_bytes(b"ab")
    assert ckpt.verify_checkpoint(folder) == "a.bin has 2 bytes, 3 were saved"
    (folder / "a.bin").unlink()
    assert ckpt.verify_checkpoint(folder) == "a.bin is missing"
