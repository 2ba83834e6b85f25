"""``octopus-bench distributed`` end to end: two gloo ranks on the CPU at a tiny scale (started
in-process: ranks fork from the forkserver instead of importing torch each)."""

import json

from octopus.bench import distributed


def test_distributed_benchmark_on_two_cpu_ranks(tmp_path):
    out = tmp_path / "distributed.json"
    assert distributed.main(["--backend", "gloo", "--world-size", "2", "--dists", "tiny", "longtail", "--items", "300",
                             "--pipeline-items", "400", "--scale-down", "1", "--repeats", "2", "--warmup", "1",
                             "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    summary = distributed.format_report(result)  # what rank 0 printed
    assert "2 ranks over gloo" in summary and "longtail random" in summary and "sorted, by items" in summary
    assert result["schema"] == "octopus-bench-distributed/1" and result["world_size"] == 2
    assert result["environment"]["device_type"] == "cpu"
    assert [(r["distribution"], r["pattern"]) for r in result["exchange"]] == [
        ("tiny", "grouped"), ("tiny", "random"), ("longtail", "grouped"), ("longtail", "random")]
    for r in result["exchange"]:
        assert r["items_per_rank"] == 300 and sum(r["send_elements"]) == r["elements_per_rank"]
        assert r["moves"] == (r["pattern"] == "random")
        for key in ("octopus_all_to_all", "all_to_all_single", "counts_exchange", "plan_and_pack"):
            assert r[key]["ms"] > 0 and len(r[key]["times_ms"]) == 2 and len(r[key]["rank_ms"]) == 2
        assert ("move_slices" in r) == ("move_index" in r) == r["moves"]  # 300 items: fewer runs than the cap
    rows = {(r["order"], r["sharding"]): r for r in result["pipeline"]}
    assert set(rows) == {(o, s) for o in ("shuffled", "sorted") for s in ("elements", "items")}
    for r in rows.values():
        assert r["checked"] and r["items"] == 400 and sum(r["rank_items"]) == 400
        assert sum(r["rank_elements"]) == r["elements"] and r["speedup"] > 0
    # Element-balanced: within one item of the mean; by item count, the sorted batch's last rank has far more.
    assert rows[("sorted", "elements")]["element_imbalance"] < 1.1
    assert rows[("sorted", "items")]["element_imbalance"] > 1.3
