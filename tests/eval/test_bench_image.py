"""`mmspec.eval.bench_image`'s arguments and its summary of a partial run (`--methods`); the benchmark itself runs in
tests/eval/test_gpu_suite.py."""

import pytest

from mmspec.eval import bench_image
from mmspec.eval.bench_image import METHODS, Row, summary


@pytest.mark.parametrize(("argv", "message"), [
    (["--methods", "heads", "hedas"], "--methods: unknown hedas; choose from sjd_published, sjd_maximal"),
    (["--sweep", "--methods", "heads"], "--methods picks the rows of the method table"),
    (["--default-policy", "--methods", "heads"], "--methods picks the rows of the method table"),
])
def test_bad_arguments_fail_before_any_model_loads(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(bench_image.AutoARImagePipeline, "from_pretrained", pytest.fail)
    with pytest.raises(SystemExit) as exit_:
        bench_image.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_summary_of_a_partial_run_gives_the_figures_of_what_ran():
    def row(method, compression, latency):
        return Row(method, 1, 256 / compression, compression, latency, 0.1, 2.0 / latency)

    rows = [row("ar", 1.0, 2.0), row("draft", 1.4, 2.0), row("heads", 2.1, 2.0), row("heads_lantern", 3.7, 1.1)]
    methods = {name: METHODS[name] for name in ("ar", "draft", "heads", "heads_lantern")}
    result = summary(rows, {1: {1: 1.0}}, methods)
    assert result["heads_over_draft_step_compression_bs1"] == 1.5  # the exact heads over the draft GPT
    assert result["heads_lantern_over_heads_speed_bs1"] == round(2.0 / 1.1, 3)
    assert not any(key.startswith(("sjd", "best")) for key in result)  # no SJD row ran
    assert summary([row("ar", 1.0, 2.0), row("heads_lantern", 3.7, 1.1)], {1: {1: 1.0}},
                   {name: METHODS[name] for name in ("ar", "heads_lantern")}) == {
        "heads_lantern_step_compression_bs1": 3.7, "heads_lantern_speedup_vs_ar_bs1": round(2.0 / 1.1, 3)}
