"""A checkpoint is data: a pickle planted in one never runs on resume (issue 34, item 1).

The payload, when unpickled, creates a marker file (nothing else): each test plants it where a
checkpoint holds a pickle (DCP's `.metadata`, a DCP shard's non-tensor entry, `rng_rank0.pt`, a
legacy `optimizer.pt`, the replay buffer's files, an extra file) and asserts the marker never
appears, whether the manifest is left stale, deleted, or forged to match the payload; and that a
signed manifest (`SCALERL_CHECKPOINT_KEY`) refuses a forged one. Tiny: the built-in model, saved
and loaded with save_checkpoint / load_checkpoint / load_newest_intact directly."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir
from scalerl.replay import storage
from scalerl.replay.buffer import ReplayBuffer
from scalerl.replay.group import ReplayGroup
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer.checkpoint_trust import read_dcp_metadata

CTX = DistContext()
NEWEST, OLDER = "step_0000002", "step_0000001"


class Payload:
    """Unpickling this creates the file `marker` (empty): the proof that a pickle from a checkpoint ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payload(marker, *, torch_save=False) -> bytes:
    if not torch_save:
        return pickle.dumps(Payload(marker))
    buffer = io.BytesIO()
    torch.save({"torch": Payload(marker)}, buffer)  # what an RNG or optimizer file would hold
    return buffer.getvalue()


def _group(seed: int) -> ReplayGroup:
    gen = torch.Generator().manual_seed(seed)
    return ReplayGroup(prompt_ids=torch.randint(0, 100, (3,), generator=gen), completion_ids=torch.randint(0, 100, (2, 4), generator=gen),
                       completion_mask=torch.ones(2, 4, dtype=torch.long), sampler_logprobs=-torch.rand(2, 4, generator=gen),
                       truncated=torch.zeros(2, dtype=torch.bool), rewards=torch.randn(2, generator=gen),
                       task_rewards=torch.randn(2, generator=gen), policy_version=seed, prompt=f"prompt {seed}")


def _fresh(lr=1e-3):
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir())
    return model, torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))


def _save(root, step, model, optimizer, replay):
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    return ckpt.save_checkpoint(root, step, ctx=CTX, model=model, tokenizer=tokenizer, optimizer=optimizer,
                                rng={"torch": torch.get_rng_state()}, trainer_state={"note": "saved"}, keep_last=2,
                                rank_files=lambda folder: replay.save(folder / "replay_rank0"))


def _train_and_save(root):
    """Checkpoints of steps 1 and 2 (weights, AdamW moments, RNG, a prioritised replay buffer); the step-2 state."""
    torch.manual_seed(0)
    model, optimizer = _fresh()
    replay = ReplayBuffer(capacity=8, kind="prioritized", chunk_size=2)
    for step in (1, 2):
        model(torch.tensor([[1, 2, 3, step]]), labels=torch.tensor([[1, 2, 3, step]])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        replay.add([_group(2 * step), _group(2 * step + 1)], priorities=[0.5 * step, 2.0])
        _save(root, step, model, optimizer, replay)
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "moments": [optimizer.state[p]["exp_avg_sq"].clone() for p in model.parameters()],
            "rng": torch.get_rng_state(), "replay": replay}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved") / "checkpoints"
    return root, _train_and_save(root)


@pytest.fixture
def root(saved, tmp_path):
    """A fresh copy of the saved checkpoints (steps 1 and 2) for one test to attack."""
    copy = tmp_path / "checkpoints"
    shutil.copytree(saved[0], copy)
    return copy


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload_ran"
    yield path
    assert not path.exists(), "the planted pickle ran"


def _resume(root):
    """What loop.restore does: the newest intact checkpoint into a fresh model (weights, optimizer, RNG, replay)."""
    model, optimizer = _fresh(lr=5e-3)
    lines: list[str] = []

    def load(folder):
        state, rng = ckpt.load_checkpoint(folder, ctx=CTX, model=model, optimizer=optimizer)
        return state, rng, ReplayBuffer.load(folder / "replay_rank0")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = ckpt.load_newest_intact(root, CTX, load, lines.append)
    return loaded, lines, model, optimizer


def _reforge(folder, replay_file=None):
    """What a forger does after planting: re-hash the replay buffer's meta.json (for `replay_file`) and the manifest."""
    if replay_file is not None:
        meta_path = folder / "replay_rank0" / storage.META
        meta = json.loads(meta_path.read_text())
        sha = hashlib.sha256((folder / "replay_rank0" / replay_file).read_bytes()).hexdigest()
        for entry in [meta["priorities"], *meta["chunks"]]:
            if entry["file"] == replay_file:
                entry["sha256"] = sha
        meta_path.write_text(json.dumps(meta))
    ckpt.write_manifest(folder)


# --- DCP's .metadata -------------------------------------------------------------------------------


def test_planted_metadata_with_the_manifest_left_stale_is_set_aside_unread(root, marker, fault):
    (root / NEWEST / "dcp" / ".metadata").write_bytes(_payload(marker))
    loaded, lines, _, _ = _resume(root)
    assert loaded[0]["step"] == 1, "resumed from the older, intact checkpoint"
    assert (root / f"{NEWEST}.damaged").is_dir() and len(lines) == 1
    assert "dcp/.metadata has" in lines[0] or "dcp/.metadata does not match" in lines[0], lines
    fault("checkpoints", "a __reduce__ pickle planted as dcp/.metadata, manifest left stale",
          f"never ran; {lines[0].split(' (')[1].split(');')[0]}: set aside as .damaged, resumed from the older one")


def test_planted_metadata_with_the_manifest_deleted_is_never_opened(root, marker, fault):
    (root / NEWEST / "dcp" / ".metadata").write_bytes(_payload(marker))
    (root / NEWEST / ckpt.MANIFEST).unlink()
    loaded, lines, _, _ = _resume(root)
    assert loaded[0]["step"] == 1
    assert (root / f"{NEWEST}.unverified").is_dir() and not (root / f"{NEWEST}.damaged").exists()
    assert len(lines) == 1 and f"{NEWEST} has no manifest.json" in lines[0] and "nothing in it was read" in lines[0], lines
    fault("checkpoints", "a __reduce__ pickle planted as dcp/.metadata, manifest.json deleted (before: test-loaded, it ran)",
          f"never ran; one warning: {lines[0]}")


def test_planted_metadata_with_a_forged_manifest_is_refused_by_the_allow_list(root, marker, fault):
    (root / NEWEST / "dcp" / ".metadata").write_bytes(_payload(marker))
    _reforge(root / NEWEST)
    with pytest.raises(ScaleRLError) as err:
        _resume(root)
    message = str(err.value)
    assert "io.open" in message and str(root / NEWEST / "dcp" / ".metadata") in message and "\n" not in message
    assert (root / NEWEST).is_dir(), "left where it is, for the user to see"
    fault("checkpoints", "a __reduce__ pickle planted as dcp/.metadata, manifest.json re-hashed to match (before: it ran)",
          f"never ran; one-line error: {message.replace(str(root), 'checkpoints')}")


def test_dcp_metadata_pointing_outside_its_folder_is_refused(root, marker):
    folder = root / NEWEST / "dcp"
    metadata = read_dcp_metadata(folder / ".metadata")
    for info in metadata.storage_data.values():
        info.relative_path = "../../../../etc/passwd"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    _reforge(root / NEWEST)
    with pytest.raises(ScaleRLError, match="names the shard '../../../../etc/passwd'"):
        _resume(root)


def test_the_allow_list_admits_what_dcp_writes(saved):
    """A real .metadata unpickles to the same Metadata as DCP's own reader gives (every class it holds admitted)."""
    path = saved[0] / NEWEST / "dcp" / ".metadata"
    with open(path, "rb") as f:
        plain = pickle.load(f)  # the checkpoint this test module saved itself
    assert read_dcp_metadata(path) == plain


# --- the other pickles a checkpoint holds ----------------------------------------------------------


def test_a_pickle_in_a_dcp_shard_non_tensor_entry_never_runs(root, marker, fault):
    """DCP saves non-tensor entries (the optimizer's param_groups) with torch.save and loads them with
    torch.load(weights_only=False): a forged shard whose lr is a pickle must be refused."""
    model, optimizer = _fresh()
    state = ckpt._sharded_state(model, optimizer, {})
    state["optim"]["param_groups"][0]["lr"] = Payload(marker)
    shutil.rmtree(root / NEWEST / "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=root / NEWEST / "dcp", no_dist=True)
    _reforge(root / NEWEST)
    with pytest.raises(ScaleRLError) as err:
        _resume(root)
    message = str(err.value)
    assert "io.open" in message and "param_groups.0.lr" in message and "\n" not in message
    fault("checkpoints", "a DCP shard re-saved with a __reduce__ pickle as the optimizer's lr, manifest re-hashed (before: it ran)",
          f"never ran; one-line error: {message.replace(str(root), 'checkpoints')}")


@pytest.mark.parametrize("name", ["rng_rank0.pt", "optimizer.pt (a legacy checkpoint, no dcp/)"])
def test_a_pickle_as_an_rng_or_optimizer_file_never_runs(root, marker, fault, name):
    folder = root / NEWEST
    target = folder / name.split()[0]
    if name.startswith("optimizer.pt"):
        shutil.rmtree(folder / "dcp")
    target.write_bytes(_payload(marker, torch_save=True))
    _reforge(folder)
    with pytest.raises(ScaleRLError) as err:
        _resume(root)
    message = str(err.value)
    assert "io.open" in message and str(target) in message and "\n" not in message
    fault("checkpoints", f"a __reduce__ pickle (torch.save) planted as {name}, manifest re-hashed",
          f"never ran; one-line error: {message.replace(str(root), 'checkpoints')}")


REPLAY_PLANTS = {  # what a forger can put into the replay buffer's files (their SHA-256 in meta.json re-hashed too)
    "priorities .npy replaced by a raw pickle": lambda path, marker: path.write_bytes(_payload(marker)),
    "priorities .npy of dtype object holding the pickle": lambda path, marker: np.save(
        path, np.array([Payload(marker)], dtype=object), allow_pickle=True),
    "a chunk .safetensors replaced by a raw pickle": lambda path, marker: path.write_bytes(_payload(marker)),
}


@pytest.mark.parametrize("plant", list(REPLAY_PLANTS))
def test_a_pickle_in_the_replay_buffer_never_runs(root, marker, fault, plant):
    folder = root / NEWEST
    meta = json.loads((folder / "replay_rank0" / storage.META).read_text())
    name = meta["chunks"][0]["file"] if "chunk" in plant else meta["priorities"]["file"]
    path = folder / "replay_rank0" / name
    REPLAY_PLANTS[plant](path, marker)
    _reforge(folder, name)
    with pytest.raises(ScaleRLError) as err:
        _resume(root)
    message = str(err.value)
    assert name in message and "\n" not in message
    fault("checkpoints", f"replay buffer: {plant}, meta.json and manifest re-hashed",
          f"never ran; one-line error: {message.replace(str(root), 'checkpoints')[:220]}")


def test_a_replay_meta_naming_a_path_outside_its_folder_is_refused(root):
    meta_path = root / NEWEST / "replay_rank0" / storage.META
    meta = json.loads(meta_path.read_text())
    meta["priorities"]["file"] = "../../../rng_rank0.pt"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ScaleRLError, match="names '../../../rng_rank0.pt', not a file name this layout writes"):
        ReplayBuffer.load(root / NEWEST / "replay_rank0")


@pytest.mark.parametrize("extra", ["pytorch_model.bin", "dcp/__1_0.distcp", "replay_rank1/meta.json"])
def test_a_file_the_manifest_does_not_list_is_refused(root, marker, fault, extra):
    path = root / NEWEST / extra
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(_payload(marker))
    loaded, lines, _, _ = _resume(root)
    assert loaded[0]["step"] == 1 and (root / f"{NEWEST}.damaged").is_dir()
    assert f"{extra} is not in manifest.json" in lines[0], lines
    fault("checkpoints", f"a pickle planted as an extra file {extra}, not in the manifest",
          f"never read; warned ({extra} is not in manifest.json), set aside as .damaged, resumed from the older one")


def test_links_and_stray_folders_are_refused(tmp_path):
    folder = tmp_path / "step_0000001"
    (folder / "dcp").mkdir(parents=True)
    (folder / "dcp" / "a.bin").write_bytes(b"abc")
    ckpt.write_manifest(folder)
    assert ckpt.verify_checkpoint(folder) is None
    (folder / "empty").mkdir()
    assert ckpt.verify_checkpoint(folder) == "empty/ is not in manifest.json (added after the save)"
    (folder / "empty").rmdir()
    (folder / "link.bin").symlink_to(folder / "dcp" / "a.bin")
    assert ckpt.verify_checkpoint(folder) == "link.bin is a symbolic link, a save writes none"
    (folder / "link.bin").unlink()
    (folder / ckpt.MANIFEST).write_text(json.dumps({"files": {"../outside": {"bytes": 3, "sha256": "0" * 64}}}))
    assert ckpt.verify_checkpoint(folder) == "manifest.json is damaged"
    (folder / ckpt.MANIFEST).unlink()
    assert ckpt.verify_checkpoint(folder) == ckpt.NO_MANIFEST


def test_load_checkpoint_alone_verifies_first(root, marker):
    """Called directly (not through load_newest_intact), load_checkpoint checks the manifest before opening anything."""
    (root / NEWEST / "dcp" / ".metadata").write_bytes(_payload(marker))
    model, optimizer = _fresh()
    for damage in ("stale", "deleted"):
        if damage == "deleted":
            (root / NEWEST / ckpt.MANIFEST).unlink()
        with pytest.raises(ScaleRLError, match=f"checkpoint {root / NEWEST} not loaded"):
            ckpt.load_checkpoint(root / NEWEST, ctx=CTX, model=model, optimizer=optimizer)


# --- signing -----------------------------------------------------------------------------------------


def test_a_signed_manifest_refuses_a_forgery_and_loads_when_intact(tmp_path, monkeypatch, fault):
    monkeypatch.setenv(ckpt.KEY_ENV, "a secret of the run's owner")
    signed = tmp_path / "signed"
    _train_and_save(signed)
    assert (signed / NEWEST / ckpt.SIGNATURE).is_file()
    intact, _, _, _ = _resume(signed)
    assert intact[0]["step"] == 2, "the correctly signed checkpoint loads"

    forged = tmp_path / "forged"
    shutil.copytree(signed, forged)
    state = json.loads((forged / NEWEST / "trainer_state.json").read_text())
    (forged / NEWEST / "trainer_state.json").write_text(json.dumps({**state, "step": 999}))  # data only: no pickle
    _reforge(forged / NEWEST)
    with pytest.raises(ScaleRLError) as err:
        _resume(forged)
    message = str(err.value)
    assert f"checkpoint {forged / NEWEST}: manifest.sig does not match manifest.json" in message and "\n" not in message
    assert (forged / NEWEST).is_dir(), "not set aside: a forgery (or another key) is an error, not damage"

    (forged / NEWEST / ckpt.SIGNATURE).unlink()
    with pytest.raises(ScaleRLError, match=f"checkpoint {forged / NEWEST} has no manifest.sig and SCALERL_CHECKPOINT_KEY is set"):
        _resume(forged)
    monkeypatch.setenv(ckpt.KEY_ENV, "another key")
    with pytest.raises(ScaleRLError, match="manifest.sig does not match"):
        _resume(signed)
    monkeypatch.delenv(ckpt.KEY_ENV)
    unsigned, _, _, _ = _resume(signed)  # without the key manifest.sig is ignored
    assert unsigned[0]["step"] == 2
    fault("checkpoints", "SCALERL_CHECKPOINT_KEY set (manifest.sig: HMAC-SHA256 of manifest.json): trainer_state.json "
          "changed and manifest.json re-hashed; then manifest.sig deleted; then another key",
          f"one-line errors: {message.replace(str(tmp_path), '<tmp>')}; ...has no manifest.sig and SCALERL_CHECKPOINT_KEY "
          "is set...; ...does not match...; the intact signed checkpoint loads")


def test_an_empty_key_is_refused_before_saving(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.KEY_ENV, "")
    with pytest.raises(ScaleRLError, match="SCALERL_CHECKPOINT_KEY is set but empty"):
        _train_and_save(tmp_path / "checkpoints")
    assert not (tmp_path / "checkpoints" / OLDER).exists()


# --- what still works --------------------------------------------------------------------------------


def test_a_save_load_round_trip_is_bitwise(saved, root):
    expected = saved[1]
    (state, rng, replay), lines, model, optimizer = _resume(root)
    assert lines == [] and state["step"] == 2 and state["note"] == "saved"
    assert all(torch.equal(v, expected["weights"][k]) for k, v in model.state_dict().items())
    assert all(torch.equal(optimizer.state[p]["exp_avg_sq"], m) for p, m in zip(model.parameters(), expected["moments"]))
    assert optimizer.param_groups[0]["lr"] == 1e-3 and optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    assert torch.equal(rng["torch"], expected["rng"])
    assert len(replay) == len(expected["replay"]) == 4
    assert np.array_equal(replay._tree.leaves(), expected["replay"]._tree.leaves())
    assert all(torch.equal(replay[i].completion_ids, expected["replay"][i].completion_ids) for i in range(4))


# --- end to end --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_scalerl_train_resume_never_runs_a_planted_pickle(runs, tmp_path, capsys, fault):
    """The real path: `scalerl train --resume` (loop.restore) on a run whose newest checkpoint holds the payload."""
    from faults_common import cli_args, run_cli_train, train

    marker = tmp_path / "payload_ran"
    short = {"train.steps": 4}  # checkpoints of steps 2 and 4
    train(runs, "run", **short)
    newest = runs / "run" / "checkpoints" / "step_0000004"
    (newest / "dcp" / ".metadata").write_bytes(_payload(marker))
    ckpt.write_manifest(newest)  # forged to match
    forged = run_cli_train("--resume", *cli_args(runs, "run", **short), process=True)  # a process of its own
    lines = [line for line in forged.stderr.splitlines() if line.strip()]
    assert forged.returncode == 2 and len(lines) == 1 and "io.open" in lines[0], forged.stderr
    assert not marker.exists(), "the planted pickle ran"

    (newest / ckpt.MANIFEST).unlink()  # now without a manifest: set aside unread, resumed from step 2
    summary = train(runs, "run", resume=True, **short)
    warning = next(line for line in capsys.readouterr().err.splitlines() if "has no manifest.json" in line)
    assert not marker.exists(), "the planted pickle ran"
    assert summary["steps"] == 4 and (runs / "run" / "checkpoints" / "step_0000004.unverified").is_dir()
    assert ckpt.verify_checkpoint(runs / "run" / "checkpoints" / "step_0000004") is None  # saved again, whole
    fault("checkpoints", "scalerl train --resume on a run whose newest checkpoint holds a __reduce__ pickle as "
          "dcp/.metadata: manifest re-hashed, then deleted",
          f"never ran; exit 2, one line: {lines[0].replace(str(runs), 'runs')}; then: {warning.split(';')[0]}, resumed "
          "from step 2 and finished")
