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
    assert set(choice.probe_ms) == {p for probes in tuning.LAYOUT_PROBES.values() for p in probes}
    for times in choice.probe_ms.values():
        assert len(times) == 4 and all(ms > 0 for ms in times.values())
    # Device-wide, the lowest worst ratio over every probe; per layout class, over its probes.
    assert (choice.strategy, choice.block_elems) == tuning.pick(choice.probe_ms)
    assert choice.by_class == {name: tuning.pick(choice.probe_ms, probes) for name, probes in tuning.LAYOUT_PROBES.items()}
    data = json.loads((cache_dir / "autotune.json").read_text())
    entry = data[tuning.cache_key(torch.device("cpu"))]
    assert (entry["strategy"], entry["block_elems"]) == (choice.strategy, choice.block_elems)
    assert {name: tuple(pair) for name, pair in entry["by_class"].items()} == choice.by_class
    assert [p.name for p in cache_dir.iterdir()] == ["autotune.json"]  # no temporary file left behind


def test_probes_of_each_layout_class_have_its_mean_item_size():
    batches = tuning._probe_batches(torch.device("cpu"))
    for name, probes in tuning.LAYOUT_PROBES.items():
        for probe in probes:
            batch = batches[probe]
            assert tuning.layout_class(len(batch), batch.numel()) == name, probe
    sizes = batches["dust_giant"].sizes.view(-1)
    assert (sizes == 0).any() and sizes.max() > 100 * sizes.float().median()  # empty items and a giant
    heavy = batches["heavy_tail"].sizes.view(-1).float()
    assert heavy.median() < 60 and heavy.max() > 100 * heavy.median()  # a few items hold most elements


def test_pick_minimizes_the_worst_ratio_and_keeps_plan_within_its_margin():
    # block_search wins on the sum of ratios (1.0 + 1.0 + 1.5 = 3.5 against 3.6) but is 1.5x
    # the fastest on the skewed probe; lookup's worst is 1.2.
    probe_ms = {"regular": {"block_search:4096": 1.0, "lookup:2048": 1.2, "plan:4096": 1.5},
                "small": {"block_search:4096": 1.0, "lookup:2048": 1.2, "plan:4096": 1.25},
                "skewed": {"block_search:4096": 1.5, "lookup:2048": 1.2, "plan:4096": 1.0}}
    assert tuning.pick(probe_ms) == ("lookup", 2048)
    assert tuning.pick(probe_ms, ("regular", "small")) == ("block_search", 4096)
    assert tuning.pick(probe_ms, ("skewed",)) == ("plan", 4096)
    # plan within PLAN_MARGIN of the winner's worst ratio is kept (the safe default).
    probe_ms["regular"]["plan:4096"] = 1.2 * (1 + tuning.PLAN_MARGIN) - 0.01
    probe_ms["small"]["plan:4096"] = 1.0
    assert tuning.pick(probe_ms) == ("plan", 4096)
    with pytest.raises(ValueError, match="no probe times"):
        tuning.pick({})
    with pytest.raises(ValueError, match="every probe"):
        tuning.pick({"a": {"plan:4096": 1.0}, "b": {"lookup:2048": 1.0}})


def test_pick_keeps_plans_default_block_size_within_the_margin():
    default = f"plan:{octopus.DEFAULT_BLOCK_ELEMS}"
    other = f"plan:{4 * octopus.DEFAULT_BLOCK_ELEMS}"
    # The larger block is a little faster on the worst probe: a tie, the default is kept.
    probe_ms = {"a": {default: 1.0, other: 1.0, "block_search:2048": 1.5},
                "b": {default: 1.0 + tuning.PLAN_MARGIN - 0.005, other: 1.0, "block_search:2048": 1.6}}
    assert tuning.pick(probe_ms) == ("plan", octopus.DEFAULT_BLOCK_ELEMS)
    # Past the margin, plan's best block size.
    probe_ms["b"][default] = 1.0 + tuning.PLAN_MARGIN + 0.01
    assert tuning.pick(probe_ms) == ("plan", 4 * octopus.DEFAULT_BLOCK_ELEMS)
    # The default within the margin of plan's best but not of the winner: plan's best, if it is.
    probe_ms = {"a": {default: 1.05, other: 1.02, "block_search:2048": 1.0}}
    assert tuning.pick(probe_ms) == ("plan", 4 * octopus.DEFAULT_BLOCK_ELEMS)
    # Neither within the margin of the winner: the winner.
    probe_ms["a"][other] = 1.04
    assert tuning.pick(probe_ms) == ("block_search", 2048)


def test_each_batch_gets_its_layout_class_choice(cache_dir):
    small = random_batch([(5, 7), (0, 3), (40, 2)], "cpu")  # 55 elements in 3 items
    large = random_batch([(3000, 1), (5000, 1)], "cpu")
    assert tuning.layout_class(len(small), small.numel()) == "small_items"
    assert tuning.layout_class(len(large), large.numel()) == "large_items"
    assert tuning.layout_class(0, 0) == "small_items"
    tuning._CHOICES[("cpu", 0)] = tuning.TunedChoice("plan", 4096, "cpu", "k", "probe",
                                                     by_class=dict(small_items=("lookup", 2048)))
    octopus.affine(small, 2.0)
    assert ("lookup", small.device) in small._metadata
    octopus.affine(large, 2.0)  # no choice for its class: the device-wide one
    assert ("plan", large.device, 4096) in large._metadata
    assert tuning.resolve("auto", None, torch.device("cpu")) == ("plan", 4096)  # layout unknown
    assert tuning.resolve("auto", None, torch.device("cpu"), 3, 55) == ("lookup", 2048)
    assert tuning.resolve("auto", 1024, torch.device("cpu"), 3, 55) == ("lookup", 1024)
    out = octopus.affine(small.values, 2.0, 1.0, offsets=small.offsets)  # the values-and-offsets form too
    torch.testing.assert_close(out, small.values * 2 + 1)


def test_build_id_is_a_digest_of_the_loaded_extension():
    import hashlib

    from octopus._library import _C
    with open(_C.__file__, "rb") as f:
        assert tuning.build_id() == hashlib.blake2b(f.read(), digest_size=8).hexdigest()
    assert f"build {tuning.build_id()}" in tuning.cache_key(torch.device("cpu"))


def test_cached_choice_is_reused_without_probing(cache_dir, monkeypatch):
    first = small_probe()
    tuning.forget()
    monkeypatch.setattr(tuning, "_probe_batches", lambda device: pytest.fail("probed although a cache exists"))
    again = octopus.autotune("cpu")
    assert again.source == "cache" and (again.strategy, again.block_elems) == (first.strategy, first.block_elems)
    assert again.by_class == first.by_class
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
    bad_class = {"strategy": "plan", "block_elems": 4096, "by_class": {"small_items": ["plan", 7]}}
    (cache_dir / "autotune.json").write_text(json.dumps({choice.key: bad_class}))
    tuning.forget()
    assert tuning.tuned_choice("cpu").source == "default"
    # An entry of an earlier octopus without per-class choices: the device-wide one for every batch.
    (cache_dir / "autotune.json").write_text(json.dumps({choice.key: {"strategy": "lookup", "block_elems": 2048}}))
    tuning.forget()
    old = tuning.tuned_choice("cpu")
    assert old.source == "cache" and old.by_class == {} and old.for_layout(3, 55) == ("lookup", 2048)


def test_cache_ignored_when_version_build_or_device_changes(cache_dir, monkeypatch):
    small_probe()
    tuning.forget()
    with monkeypatch.context() as patch:
        patch.setattr(octopus, "__version__", "99.0.0")
        assert tuning.tuned_choice("cpu").source == "default"
    tuning.forget()
    with monkeypatch.context() as patch:  # kernels rebuilt within one version
        patch.setattr(tuning, "build_id", lambda: "another build")
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
