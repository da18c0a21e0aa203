"""`python -m mmspec.eval.real_size` on the CPU at the tiny family configurations: the report's figures follow from
what it measured (an image is the prefill plus N / c iterations, c borrowed from the embedded model and marked so),
the weight floor counts the decoder's weights but its embedding tables, and bad flags fail before any model loads."""

import json

import pytest
import torch

from mmspec.eval import real_size


@pytest.mark.slow  # a benchmark's smoke run
def test_the_quick_report_derives_each_figure_from_its_measurements(tmp_path):
    path = tmp_path / "real_size.json"
    returned = real_size.main(["--device", "cpu", "--quick", "--batch-sizes", "1", "--iterations", "8", "--prompts",
                               "1", "--json", str(path)])
    report = json.loads(path.read_text())
    assert report["models"].keys() == returned["models"].keys() == {"janus", "emu3", "lumina_mgpt"}
    compression = report["compression"]
    assert compression["source"].startswith("embedded") and set(compression["1"]) == set(real_size.METHODS)
    for entry in report["models"].values():
        row = entry["batch_sizes"]["1"]
        ar = row["graphed_ar"]
        assert ar["ms_per_token"] > 0 and ar["over_floor"] == pytest.approx(ar["ms_per_token"]
                                                                            / ar["floor_ms_per_token"], rel=0.01)
        for method, figures in row["methods"].items():
            assert figures["borrowed"] and figures["compression"] == compression["1"][method]
            assert figures["speedup_vs_graphed_ar"] == pytest.approx(ar["image_s"] / figures["image_s"], rel=0.01)
            assert figures["speedup_vs_eager_ar"] == pytest.approx(row["eager_ar"]["image_s"] / figures["image_s"],
                                                                   rel=0.01)
            # the image: the prefill plus N / c iterations, each at least as long as a graphed AR token's
            iterations = entry["image_tokens"] / figures["compression"]
            assert figures["image_s"] >= iterations * figures["iteration_ms"] / 1000
            assert figures["iteration_over_ar"] > 0.5


def test_the_weight_floor_counts_the_decoders_weights_but_its_embedding_tables():
    backbone = torch.nn.ModuleDict({"embed": torch.nn.Embedding(1000, 8), "layer": torch.nn.Linear(8, 8)})
    assert real_size.weights_read(backbone) == (8 * 8 + 8) * 4


@pytest.mark.parametrize("flags, named", [
    (["--compression", "sjd=0.5", "mc_sjd=2", "frontier=2"], "--compression"),
    (["--compression", "sjd=3"], "--compression"),
    (["--compression", "sjd=x", "mc_sjd=2", "frontier=2"], "--compression"),
    (["--models", "janus-9000"], "--models"),
    (["--iterations", "0"], "--iterations"),
    (["--batch-sizes", "4", "--prompts", "2"], "--prompts"),
    (["--device", "tpu"], "device"),
])
def test_bad_flags_fail_in_one_line_before_any_model_loads(flags, named, capsys, monkeypatch):
    monkeypatch.setattr(real_size, "measure_model", lambda *a, **k: pytest.fail("a model was built"))
    monkeypatch.setattr(real_size, "embedded_compression", lambda *a, **k: pytest.fail("the embedded model loaded"))
    with pytest.raises(SystemExit) as exit:
        real_size.main(flags)
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert named in error
