"""The service benchmark end to end on the tiny image model (the slow tier: a Ray instance of its own)."""

import json

import pytest

from tests.models.llamagen_tiny import tiny_pipeline

pytestmark = pytest.mark.slow
pytest.importorskip("ray")


def test_the_benchmark_reports_each_replica_count_against_one_and_direct_calls(tmp_path):
    from mmspec.eval import bench_serve

    folder = tmp_path / "tiny_image"
    tiny_pipeline().save_pretrained(folder)
    out = tmp_path / "serve.json"
    report = bench_serve.main(["--model", str(folder), "--replicas", "1", "2", "--requests", "4", "--rounds", "2",
                               "--port", "8768", "--json", str(out)])
    assert json.loads(out.read_text()) == report
    one, two = report["service"]
    assert (one["replicas"], two["replicas"]) == (1, 2) and one["vs_one_replica"] == 1.0
    for figures in (one, two):
        assert len(figures["round_s"]) == 2 and 0 < figures["p50_latency_s"] <= figures["p99_latency_s"]
        assert figures["vs_direct_calls"] == pytest.approx(figures["images_per_s"] / report["direct"]["images_per_s"],
                                                           rel=0.01)
