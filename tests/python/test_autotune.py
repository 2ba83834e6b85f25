"""octopus.autotune: the probe's choice, strategy="auto", and the on-disk cache."""

import json

import pytest
import torch

import octopus
from octopus import tuning

from conftest import random_batch


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OCTOPUS_CACHE_DIR", str(tmp_path))
    tuning.forget()
    yield tmp_path
    tuning.forget()


def small_probe(**kw):
    return octopus.autotune("cpu", force=True, strategies=["plan", "block_search"], block_sizes=[1024, 4096],
                            repeats=1, **kw)


def test_autotune_picks_a_measured_candidate_and_saves_it(cache_dir):
    choice = small_probe()
    assert choice.source == "probe"
    assert (choice.strategy, choice.block_elems) in {(s, b) for s in ["plan", "block_search"] for b in [1024, 4096]}
    assert set(choice.probe_ms) == {"memory_bound", "location_bound"}
    for times in choice.probe_ms.values():
        assert len(times) == 4 and all(ms > 0 for ms in times.values())
    # The winner has the smallest summed relative time.
    score = {c: sum(t[c] / min(t.values()) for t in choice.probe_ms.values()) for c in choice.probe_ms["memory_bound"]}
    assert min(score, key=score.get) == f"{choice.strategy}:{choice.block_elems}"
    data = json.loads((cache_dir / "autotune.json").read_text())
    entry = data[tuning.cache_key(torch.device("cpu"))]
    assert (entry["strategy"], entry["block_elems"]) == (choice.strategy, choice.block_elems)
    assert [p.name for p in cache_dir.iterdir()] == ["autotune.json"]  # no temporary file left behind


def test_cached_choice_is_reused_without_probing(cache_dir, monkeypatch):
    first = small_probe()
    tuning.forget()
    monkeypatch.setattr(tuning, "_probe_batches", lambda device: pytest.fail("probed although a cache exists"))
    again = octopus.autotune("cpu")
    assert again.source == "cache" and (again.strategy, again.block_elems) == (first.strategy, first.block_elems)
    tuning.forget()
    assert tuning.tuned_choice("cpu").source == "cache"


def test_corrupt_cache_file_is_survived_and_replaced(cache_dir):
    (cache_dir / "autotune.json").write_text("{not json")
    assert tuning.tuned_choice("cpu").source == "default"
    choice = small_probe()
    data = json.loads((cache_dir / "autotune.json").read_text())
    assert data[choice.key]["strategy"] == choice.strategy
    # A well-formed file with a malformed entry is ignored too.
    (cache_dir / "autotune.json").write_text(json.dumps({choice.key: {"strategy": "warp_magic", "block_elems": 7}}))
    tuning.forget()
    assert tuning.tuned_choice("cpu").source == "default"


def test_cache_ignored_when_version_or_device_changes(cache_dir, monkeypatch):
    small_probe()
    tuning.forget()
    with monkeypatch.context() as patch:
        patch.setattr(octopus, "__version__", "99.0.0")
        assert tuning.tuned_choice("cpu").source == "default"
    tuning.forget()
    with monkeypatch.context() as patch:
        patch.setattr(tuning, "device_name", lambda device: "some other device")
        assert tuning.tuned_choice("cpu").source == "default"
    tuning.forget()
    assert tuning.tuned_choice("cpu").source == "cache"


def test_failed_write_leaves_the_old_cache_intact(cache_dir, monkeypatch):
    small_probe()
    before = (cache_dir / "autotune.json").read_text()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tuning.json, "dump", broken_dump)
    with pytest.warns(UserWarning, match="could not write"):
        small_probe()
    assert (cache_dir / "autotune.json").read_text() == before
    assert [p.name for p in cache_dir.iterdir()] == ["autotune.json"]


def test_auto_strategy_uses_the_choice(cache_dir):
    batch = random_batch([(5, 7), (0, 3), (40, 2)], "cpu")
    tuning._CHOICES[("cpu", 0)] = tuning.TunedChoice("lookup", 2048, "cpu", "k", "probe")
    out = octopus.affine(batch, 2.0, 1.0)
    assert ("lookup", batch.device) in batch._metadata
    torch.testing.assert_close(out.values, batch.values * 2 + 1)
    tuning._CHOICES[("cpu", 0)] = tuning.TunedChoice("plan", 2048, "cpu", "k", "probe")
    octopus.affine(batch, 2.0)
    assert ("plan", batch.device, 2048) in batch._metadata
    octopus.affine(batch, 2.0, block_elems=1024)  # an explicit block size wins
    assert ("plan", batch.device, 1024) in batch._metadata
    with pytest.raises(ValueError, match="strategy must be one of 'auto'"):
        octopus.affine(batch, 2.0, strategy="fastest")


def test_auto_strategy_without_tuning_is_the_default():
    choice = tuning.tuned_choice("cpu")
    assert (choice.strategy, choice.block_elems, choice.source) == (
        octopus.DEFAULT_STRATEGY, octopus.DEFAULT_BLOCK_ELEMS, "default")


def test_auto_strategy_under_torch_compile():
    values, offsets = torch.randn(10), torch.tensor([0, 3, 10])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(v, o):
        return octopus.affine(v, 2.0, 1.0, offsets=o)

    torch.testing.assert_close(f(values, offsets), values * 2 + 1)


def test_unwritable_cache_dir_still_tunes(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("OCTOPUS_CACHE_DIR", str(blocker / "sub"))  # a directory under a file: cannot exist
    with pytest.warns(UserWarning, match="could not write"):
        choice = small_probe()
    assert tuning.tuned_choice("cpu") == choice
