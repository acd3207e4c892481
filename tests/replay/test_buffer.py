"""ReplayBuffer: sampling frequencies (chi-square), importance weights by hand, β annealing, the ring,
and save/load: bitwise, incremental, crash-consistent, loud when damaged."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scalerl.errors import ScaleRLError
from scalerl.replay import storage
from scalerl.replay.buffer import ReplayBuffer, importance_weights
from scalerl.replay.group import TENSOR_FIELDS, ReplayGroup

# chi-square 0.999 quantile for 10 - 1 = 9 degrees of freedom (scipy.stats.chi2.ppf(0.999, 9) = 27.877)
CHI2_999_DF9 = 27.877


def make_group(seed: int, P: int = 3, G: int = 2, T: int = 4, version: int = 0) -> ReplayGroup:
    gen = torch.Generator().manual_seed(seed)
    return ReplayGroup(
        prompt_ids=torch.randint(0, 1000, (P,), generator=gen),
        completion_ids=torch.randint(0, 1000, (G, T), generator=gen),
        completion_mask=torch.randint(0, 2, (G, T), generator=gen),
        sampler_logprobs=-torch.rand(G, T, generator=gen),
        truncated=torch.rand(G, generator=gen) > 0.5,
        rewards=torch.randn(G, generator=gen),
        task_rewards=torch.randn(G, generator=gen),
        policy_version=version,
        prompt=f"prompt {seed}: ünïcode ✓",
    )


def ragged_groups(n: int, start: int = 0) -> list[ReplayGroup]:
    return [make_group(start + i, P=1 + (i % 5), G=1 + (i % 3), T=(i * 7) % 11, version=start + i) for i in range(n)]


def assert_same_group(a: ReplayGroup, b: ReplayGroup) -> None:
    for name in TENSOR_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.policy_version, a.prompt) == (b.policy_version, b.prompt)


def assert_same_buffer(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert (len(a), a.position, a.evicted, a.samples_drawn, a.capacity, a.kind) == \
           (len(b), b.position, b.evicted, b.samples_drawn, b.capacity, b.kind)
    for slot in range(len(a)):
        assert_same_group(a[slot], b[slot])
    slots = np.arange(a.capacity)
    assert np.array_equal(a._tree.leaves(), b._tree.leaves())  # bitwise, empty slots included
    assert a._tree.total() == b._tree.total()
    assert np.array_equal(a.priorities(slots), b.priorities(slots))


def chi_square(buffer: ReplayBuffer, expected_p: np.ndarray, n: int = 20_000) -> float:
    counts = np.bincount(buffer.sample(n).indices, minlength=len(expected_p))
    expected = n * expected_p
    return float(((counts - expected) ** 2 / expected).sum())


def filled(kind: str, priorities: list[float], **kw) -> ReplayBuffer:
    buffer = ReplayBuffer(len(priorities), kind, **kw)
    buffer.add(ragged_groups(len(priorities)), priorities)
    return buffer


# --- sampling frequencies ---------------------------------------------------------------------------

def test_frequencies_match_priorities_alpha_1():
    k = np.arange(1, 11, dtype=np.float64)
    buffer = filled("prioritized", k.tolist(), alpha=1.0, eps=0.0)
    assert np.array_equal(buffer.priorities(np.arange(10)), k)  # (|δ| + 0)^1
    assert chi_square(buffer, k / k.sum()) < CHI2_999_DF9  # P(i) = i / 55
    # the test has power: the same draws are far from uniform
    assert chi_square(buffer, np.full(10, 0.1)) > 10 * CHI2_999_DF9


def test_frequencies_match_priorities_alpha_half():
    k = np.arange(1, 11, dtype=np.float64)
    buffer = filled("prioritized", k.tolist(), alpha=0.5, eps=0.0)
    assert np.allclose(buffer.priorities(np.arange(10)), np.sqrt(k), rtol=1e-15)
    assert chi_square(buffer, np.sqrt(k) / np.sqrt(k).sum()) < CHI2_999_DF9  # P(i) = √i / Σ √j
    assert chi_square(buffer, k / k.sum()) > 4 * CHI2_999_DF9  # and not the α = 1 frequencies


def test_uniform_ignores_priorities():
    k = np.arange(1, 11, dtype=np.float64)
    buffer = filled("uniform", k.tolist(), alpha=1.0)
    assert chi_square(buffer, np.full(10, 0.1)) < CHI2_999_DF9
    sample = buffer.sample(50)
    assert np.array_equal(sample.weights, np.ones(50))


def test_eps_keeps_zero_priorities_reachable():
    # δ = 0 still gives p = (0 + ε)^α > 0
    buffer = filled("prioritized", [0.0, 1.0], alpha=0.6, eps=1e-2)
    assert buffer.priorities(np.array([0]))[0] == pytest.approx(1e-2 ** 0.6)
    assert 0 in buffer.sample(2_000).indices


# --- importance weights and β ------------------------------------------------------------------------

def test_importance_weights_formula():
    # N = 4, β = 1: N·P = [0.4, 1.6] → w = [2.5, 0.625] → / max = [1, 0.25]
    assert np.allclose(importance_weights(np.array([0.1, 0.4]), 4, 1.0), [1.0, 0.25], rtol=1e-15)
    # β = 0 weighs everything equally
    assert np.array_equal(importance_weights(np.array([0.1, 0.4]), 4, 0.0), [1.0, 1.0])


def test_sampled_weights_by_hand():
    # α = 1, ε = 0, priorities 1..4: P = [0.1, 0.2, 0.3, 0.4], N = 4, first β = 0.5
    # N·P = [0.4, 0.8, 1.2, 1.6]; w = (N·P)^-0.5 = [1.5811, 1.1180, 0.9129, 0.7906]
    # slot 0 is in the batch, so max w = 1.5811 and w = [1, 1/√2, 1/√3, 1/2]
    buffer = filled("prioritized", [1.0, 2.0, 3.0, 4.0], alpha=1.0, eps=0.0, beta=0.5, beta_steps=10)
    sample = buffer.sample(200)
    assert sample.beta == 0.5 and 0 in sample.indices
    expected = np.array([1.0, 1 / np.sqrt(2), 1 / np.sqrt(3), 0.5])
    assert np.allclose(sample.weights, expected[sample.indices], rtol=1e-12)
    assert [g.policy_version for g in sample.groups] == sample.indices.tolist()  # group k is slot indices[k]


def test_beta_annealing_endpoints():
    buffer = filled("prioritized", [1.0, 2.0], beta=0.4, beta_final=1.0, beta_steps=4)
    assert buffer.beta_at(0) == 0.4
    assert buffer.beta_at(2) == pytest.approx(0.7)
    assert buffer.beta_at(4) == 1.0 and buffer.beta_at(100) == 1.0
    betas = [buffer.sample(1).beta for _ in range(6)]  # one step of the schedule per sample call
    assert betas == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    assert buffer.samples_drawn == 6


# --- the ring -----------------------------------------------------------------------------------------

def test_ring_overwrites_oldest_and_counts_evictions():
    buffer = ReplayBuffer(4)
    buffer.add(ragged_groups(3))
    assert (len(buffer), buffer.evicted, buffer.position) == (3, 0, 3)
    slots = buffer.add(ragged_groups(3, start=3))  # versions 3, 4, 5 into slots 3, 0, 1
    assert slots.tolist() == [3, 0, 1]
    assert (len(buffer), buffer.evicted, buffer.position) == (4, 2, 2)
    assert [buffer[s].policy_version for s in range(4)] == [4, 5, 2, 3]
    buffer.add(ragged_groups(6, start=6))  # more than the capacity at once, slots 2, 3, 0, 1, 2, 3: the last 4 stay
    assert buffer.evicted == 2 + 6 and [buffer[s].policy_version for s in range(4)] == [8, 9, 10, 11]
    assert buffer.position == 0


def test_overwritten_slots_lose_their_priority():
    buffer = ReplayBuffer(4, "prioritized", alpha=1.0, eps=0.0)
    assert buffer.add(ragged_groups(1)).tolist() == [0] and buffer.priorities(np.array([0]))[0] == 1.0  # empty: 1.0
    buffer.add(ragged_groups(3, start=1), [2.0, 3.0, 4.0])
    buffer.update_priorities(np.array([0]), np.array([100.0]))
    buffer.add(ragged_groups(1, start=4))  # overwrites slot 0: the max of the groups still held, 4, not 100
    assert buffer.priorities(np.arange(4)).tolist() == [4.0, 2.0, 3.0, 4.0]
    buffer.add(ragged_groups(1, start=5), [7.0])  # slot 1, an explicit priority
    assert buffer.priorities(np.arange(4)).tolist() == [4.0, 7.0, 3.0, 4.0]
    assert buffer._tree.total() == 18.0


def test_update_priorities_stores_abs_plus_eps_to_alpha():
    buffer = filled("prioritized", [1.0, 1.0, 1.0], alpha=0.5, eps=0.25)
    buffer.update_priorities(np.array([0, 2, 0]), np.array([-0.75, 2.0, 3.75]))  # slot 0 repeats: last wins
    assert buffer.priorities(np.arange(3)).tolist() == [2.0, 1.25 ** 0.5, 1.5]  # √4, √1.25, √2.25
    with pytest.raises(IndexError):
        buffer.update_priorities(np.array([3]), np.array([1.0]))


def test_add_copies_and_checks_groups():
    group = make_group(0)
    buffer = ReplayBuffer(2)
    buffer.add([group])
    group.completion_ids.zero_()
    assert not torch.equal(buffer[0].completion_ids, group.completion_ids)
    bad = make_group(1)
    bad.sampler_logprobs = bad.sampler_logprobs.double()
    with pytest.raises(ValueError, match="sampler_logprobs"):
        buffer.add([make_group(2), bad])
    assert len(buffer) == 1  # nothing of a rejected call is stored
    with pytest.raises(ValueError, match="rewards"):
        buffer.add([_with(make_group(3, G=2), rewards=torch.zeros(3))])  # G = 3 rewards for G = 2 completions


def _with(group: ReplayGroup, **fields) -> ReplayGroup:
    for name, value in fields.items():
        setattr(group, name, value)
    return group


# --- persistence --------------------------------------------------------------------------------------

def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("added", [11, 23])  # part full; wrapped around the ring
def test_save_load_is_bitwise_and_draws_the_same(tmp_path, kind, added):
    buffer = ReplayBuffer(20, kind, chunk_size=4, seed=3)
    buffer.add(ragged_groups(added))
    rng = np.random.default_rng(0)
    for _ in range(3):
        sample = buffer.sample(5)
        buffer.update_priorities(sample.indices, rng.normal(size=5))
    buffer.save(tmp_path / "replay")
    restored = ReplayBuffer.load(tmp_path / "replay")
    assert_same_buffer(buffer, restored)
    for _ in range(3):  # the RNG and the β schedule continue where they were
        a, b = buffer.sample(7), restored.sample(7)
        assert np.array_equal(a.indices, b.indices) and np.array_equal(a.weights, b.weights) and a.beta == b.beta


def test_incremental_save_rewrites_only_dirty_chunks(tmp_path):
    folder = tmp_path / "replay"
    buffer = ReplayBuffer(40, "prioritized", chunk_size=4)
    buffer.add(ragged_groups(11))  # chunks 0, 1 full; chunk 2 holds slots 8..10
    buffer.save(folder)
    before = file_hashes(folder)
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    buffer.add(ragged_groups(2, start=11))  # slots 11 (chunk 2) and 12 (chunk 3)
    buffer.update_priorities(np.array([0]), np.array([5.0]))  # priorities change, chunk 0 does not
    written = buffer.save(folder)
    after = file_hashes(folder)
    chunks = sorted(n for n in after if n.startswith("chunk_"))
    assert chunks == ["chunk_00000.g000001.safetensors", "chunk_00001.g000001.safetensors",
                      "chunk_00002.g000002.safetensors", "chunk_00003.g000002.safetensors"]
    for name in chunks[:2]:  # untouched: same file, same bytes, same mtime
        assert after[name] == before[name] and (folder / name).stat().st_mtime_ns == mtimes[name]
    assert "chunk_00002.g000001.safetensors" not in after  # the superseded file is gone
    assert sorted(p.name for p in written) == ["chunk_00002.g000002.safetensors", "chunk_00003.g000002.safetensors",
                                               "meta.json", "priorities.g000002.npy"]
    assert_same_buffer(buffer, ReplayBuffer.load(folder))
    # a loaded buffer saves incrementally into its folder too; into another folder it writes everything
    restored = ReplayBuffer.load(folder)
    assert [p.name for p in restored.save(folder)] == ["priorities.g000003.npy", "meta.json"]
    assert len([p for p in restored.save(tmp_path / "copy") if p.name.startswith("chunk_")]) == 4
    assert_same_buffer(buffer, ReplayBuffer.load(tmp_path / "copy"))


def test_crash_before_meta_keeps_the_previous_save(tmp_path, monkeypatch):
    folder = tmp_path / "replay"
    buffer = ReplayBuffer(16, "prioritized", chunk_size=4)
    buffer.add(ragged_groups(6))
    buffer.save(folder)
    snapshot = ReplayBuffer.load(folder)
    buffer.add(ragged_groups(5, start=6))
    real_write = storage.atomic_write

    def crash_on_meta(path, data):
        if path.name == storage.META:
            raise OSError("simulated crash before the commit")
        return real_write(path, data)

    monkeypatch.setattr(storage, "atomic_write", crash_on_meta)
    with pytest.raises(OSError, match="simulated"):
        buffer.save(folder)
    assert_same_buffer(snapshot, ReplayBuffer.load(folder))  # new chunk files exist, unnamed: ignored
    monkeypatch.setattr(storage, "atomic_write", real_write)
    buffer.save(folder)  # the dirty chunks were kept, so this save writes them; leftovers are removed
    assert_same_buffer(buffer, ReplayBuffer.load(folder))
    named = {e["file"] for e in storage.read_meta(folder)["chunks"]} | {storage.read_meta(folder)["priorities"]["file"]}
    assert {p.name for p in folder.iterdir()} == named | {"meta.json"}


@pytest.fixture
def saved(tmp_path) -> Path:
    buffer = ReplayBuffer(12, "prioritized", chunk_size=4)
    buffer.add(ragged_groups(9))
    buffer.save(tmp_path / "replay")
    return tmp_path / "replay"


def _load_error(folder: Path) -> str:
    with pytest.raises(ScaleRLError) as err:
        ReplayBuffer.load(folder)
    message = str(err.value)
    assert "\n" not in message and ("delete" in message or "pass the folder" in message)  # one line, with the fix
    return message


def test_missing_chunk_is_named(saved):
    (saved / "chunk_00001.g000001.safetensors").unlink()
    assert "chunk_00001.g000001.safetensors is missing" in _load_error(saved)


def test_damaged_chunk_is_named(saved):
    path = saved / "chunk_00002.g000001.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    message = _load_error(saved)
    assert "chunk_00002.g000001.safetensors is damaged" in message and "SHA-256" in message


def test_truncated_priorities_are_named(saved):
    path = saved / "priorities.g000001.npy"
    path.write_bytes(path.read_bytes()[:50])
    assert "priorities.g000001.npy is damaged" in _load_error(saved)


def test_missing_or_garbled_meta_is_named(saved):
    (saved / "meta.json").write_text('{"schema": 1, "buff')
    assert "meta.json is damaged" in _load_error(saved)
    (saved / "meta.json").unlink()
    assert "meta.json is missing" in _load_error(saved)


def test_chunk_with_wrong_shapes_is_named(saved):
    # a chunk whose bytes are consistent with meta.json but whose tensors do not add up
    path = saved / "chunk_00000.g000001.safetensors"
    tensors = storage.load_tensors(path.read_bytes())
    tensors["rewards"] = tensors["rewards"][:-1]
    data = storage.save_tensors(tensors)
    path.write_bytes(data)
    meta = storage.read_meta(saved)
    meta["chunks"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (saved / "meta.json").write_text(json.dumps(meta))
    message = _load_error(saved)
    assert "chunk_00000.g000001.safetensors is damaged" in message and "`rewards`" in message
