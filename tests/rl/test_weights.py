"""The weight store: atomic versioned snapshots that a real torch engine loads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from pearl.core.errors import EngineError
from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.torch import TorchEngine
from pearl.rl import Batch, GRPOTrainer, Trajectory, Turn, WeightStore, WeightStoreError


def greedy(engine: TorchEngine, rid: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    prompt = tuple(engine.tokenizer.encode("hello there", add_bos=True))
    r = engine.generate(
        GenerateRequest(rid=rid, input_ids=prompt, sampling=SamplingParams(max_new_tokens=12))
    ).result(60)
    return r.output_ids, r.logprobs


def trained(trainer: GRPOTrainer, engine: TorchEngine) -> None:
    prompt = tuple(engine.tokenizer.encode("x", add_bos=True))
    trajs = []
    for i in range(4):
        sp = SamplingParams(max_new_tokens=12, temperature=1.0, seed=i)
        r = engine.generate(GenerateRequest(rid=f"t{i}", input_ids=prompt, sampling=sp)).result(60)
        trajs.append(
            Trajectory(
                id=f"t{i}",
                group_id="g",
                task_id="x",
                turns=(Turn.of(prompt, r),),
                reward=float(i % 2),
                done=True,
            )
        )
    trainer.step(Batch(step=0, trajectories=tuple(trajs)))


def test_a_published_version_loads_into_a_real_engine(engine: TorchEngine, tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "w")
    trainer = GRPOTrainer(device="cpu", lr=3e-3)
    assert store.latest() is None and store.latest_path() is None
    p0 = trainer.publish(store)
    assert p0.name == "v00000000.safetensors" and store.latest() == 0
    tokens0, lps0 = greedy(engine, "a")
    trained(trainer, engine)
    p1 = trainer.publish(store)
    assert store.path(1) == p1 and store.latest_path() == (1, p1)
    engine.load_weights(1, store.path(1))
    tokens1, lps1 = greedy(engine, "b")
    assert (tokens1, lps1) != (tokens0, lps0) and engine.weights_version == 1
    traj = Trajectory(
        id="t",
        group_id="g",
        task_id="x",
        turns=(
            Turn(
                prompt_ids=tuple(engine.tokenizer.encode("hello there", add_bos=True)),
                output_ids=tokens1,
                logprobs=lps1,
                weights_version=1,
                finish_reason="length",
            ),
        ),
    )
    assert trainer.logprobs([traj])[0] == pytest.approx(list(lps1), abs=1e-4)
    with pytest.raises(EngineError, match="older"):
        engine.load_weights(0, store.path(0))
    assert engine.weights_version == 1
    from safetensors import safe_open

    with safe_open(str(p1), "pt") as f:  # tied embeddings are stored once
        assert "lm_head.weight" not in set(f.keys())
        assert f.metadata()["pearl_weights_version"] == "1"


def test_versions_only_go_forward_and_the_newest_k_are_kept(tmp_path: Path) -> None:
    store = WeightStore(tmp_path, keep=2)
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    for v in (0, 1, 5):
        store.publish(v, state)
    assert store.versions() == [1, 5]
    for bad in (5, 4, -1):
        with pytest.raises(WeightStoreError):
            store.publish(bad, state)
    with pytest.raises(WeightStoreError, match="pruned"):
        store.path(0)
    assert WeightStore(tmp_path, keep=2).latest() == 5  # found again after a restart
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_files_and_directories_are_published_as_they_are(
    tmp_path: Path, engine: TorchEngine
) -> None:
    store = WeightStore(tmp_path / "s")
    other = GRPOTrainer(device="cpu", seed=5)
    pt = tmp_path / "w.bin"
    torch.save(other.state_dict(), pt)
    p = store.publish(3, pt)
    assert p.name == "v00000003.pt"
    engine.load_weights(3, p)
    assert engine.weights_version == 3
    d = tmp_path / "model"
    other.model.save_pretrained(d)
    p = store.publish(4, d)
    assert p.is_dir() and store.path(4) == p and store.latest() == 4
    with pytest.raises(WeightStoreError, match="does not exist"):
        store.publish(9, tmp_path / "missing.pt")
    with pytest.raises(WeightStoreError, match="not a tensor"):
        store.publish(9, {"w": [1, 2]})  # type: ignore[dict-item]


def test_an_interrupted_publish_leaves_nothing_a_reader_could_take(tmp_path: Path) -> None:
    store = WeightStore(tmp_path)

    class Boom(dict):  # a state dict that fails while it is being written
        def items(self):
            yield "a", torch.zeros(2)
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        store.publish(0, Boom())
    assert store.versions() == [] and list(tmp_path.iterdir()) == []
    (tmp_path / ".tmp-crashed.safetensors").write_bytes(b"partial")
    assert list(WeightStore(tmp_path).root.iterdir()) == []  # swept on open


def test_concurrent_publishers_never_go_backwards(tmp_path: Path) -> None:
    store = WeightStore(tmp_path, keep=100)
    refused: list[tuple[int, int]] = []  # (version, the latest the store named)

    def publish(v: int) -> None:
        try:
            store.publish(v, {"w": torch.tensor([float(v)])})
        except WeightStoreError as e:
            refused.append((v, int(str(e).split("latest published version ")[1].split(";")[0])))

    threads = [threading.Thread(target=publish, args=(v,)) for v in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    published = store.versions()
    assert sorted(published + [v for v, _ in refused]) == list(range(20))
    assert all(latest >= v for v, latest in refused)  # refused only behind a newer version
    assert published[-1] == 19  # the newest can never be refused


def test_latest_snapshot_is_a_read_only_view_of_the_newest_complete_one(tmp_path: Path) -> None:
    from pearl.rl.weights import latest_snapshot

    root = tmp_path / "w"
    assert latest_snapshot(root) is None and not root.exists()  # nothing published, nothing made
    store = WeightStore(root, keep=2)
    assert latest_snapshot(root) is None
    for v in (1, 2, 3):
        store.publish(v, {"x": torch.zeros(2)})
    (root / ".tmp-abc.safetensors").write_bytes(b"half")  # a publish still being written
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    store.publish(4, model)
    assert latest_snapshot(root) == (4, root / "v00000004")
    assert (root / ".tmp-abc.safetensors").exists()  # a reader removes nothing
