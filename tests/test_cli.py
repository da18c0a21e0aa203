import importlib.util
import os
import re
from importlib.util import find_spec

import pytest
import torch

from mmspec.cli import main
from mmspec.text import speculative_generate
from mmspec.text.drafters import LayerSkipDrafter, ModelDrafter, NGramDrafter
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, load_causal_lm, zoo_path


@pytest.mark.parametrize("method", ["model", "ngram", "layerskip", "ar"])
def test_mmspec_text_prints_completion_and_stats(method, capsys):
    assert main(["text", "def fibonacci(n):\n", "--method", method, "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def fibonacci(n):\n") and f"decoding  {method}" in out and "ms/token" in out
    named = {"model": "TextDraftModel(", "ngram": "PromptLookup(", "layerskip": "LayerSkip(",
             "ar": "AR(): transformers'"}
    assert named[method] in out
    comparison = {line.split()[0]: line.split() for line in out.splitlines()[-2:]}
    if method != "ar":
        assert "mean_accepted_length" in out and "target_forwards" in out
        assert set(comparison) == {"ar", method} and comparison["ar"][-1] == "1.00x"  # compared with generate
    else:  # plain AR: forwards and tokens, no acceptance figures
        assert "acceptance_rate" not in out and "mean_accepted_length" not in out and "new_tokens" in out


def test_mmspec_text_reports_bad_arguments():
    with pytest.raises(SystemExit) as exit_info:
        main(["text", "x = 1", "--max-new-tokens", "0"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize(("method", "learner"), [(["--method", "model"], "draft"),
                                                 (["--method", "heads", "--kind", "hydra"], "head")])
def test_mmspec_text_serves_a_stream_learning_online(method, learner, capsys):
    assert main(["text", "def f(x):\n", "def g(y):\n", *method, "--online-every", "1", "--max-new-tokens", "8",
                 "--temperature", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("request ")]
    assert len(lines) == 2 and lines[0].startswith("request 1: acceptance ")
    assert f"updates of the {learner} swapped in so far" in lines[1]


@pytest.mark.parametrize(("flags", "message"), [(["--online-every", "0"], "--online-every must be >= 1"),
                                                (["--method", "ngram", "--online-every", "2"], "not ngram")])
def test_mmspec_text_refuses_online_drafting_it_cannot_do(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["text", "x = 1", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_unknown_zoo_model_names_the_available_ones():
    with pytest.raises(ValueError, match="pycode/target"):
        zoo_path("pycode/nope")


def test_embedded_pair_greedy_equals_target_generate_for_every_drafter():
    """The shipped pair, in float64 (no near-tie flips): every drafter reproduces target.generate token for token."""
    target, tokenizer = load_causal_lm(TEXT_TARGET, dtype=torch.float64)
    draft, _ = load_causal_lm(TEXT_DRAFT, dtype=torch.float64)
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def push(self, item):\n"],
                      return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=24, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    expected = target.generate(**batch, do_sample=False, **kwargs)
    drafters = [ModelDrafter(draft), NGramDrafter(), LayerSkipDrafter(target, target.config.early_exit_layer)]
    for drafter in drafters:
        out, stats = speculative_generate(target, batch["input_ids"], batch["attention_mask"], drafter=drafter,
                                          temperature=0, **kwargs)
        assert torch.equal(out, expected), type(drafter).__name__
    assert stats.mean_accepted_length > 1


def test_mmspec_generate_writes_a_png_and_prints_stats(tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "out.png"
    prompts = ["two small blue squares on a striped background"]
    assert main(["generate", *prompts, "--out", str(out), "--n", "2", "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert "decoding  auto" in printed and re.search(r"chosen_by +auto: ", printed) and "seconds/image" in printed
    comparison = {line.split()[0]: line.split() for line in printed.splitlines()[-2:]}
    assert set(comparison) == {"ar", "auto"} and comparison["ar"][1] == "256"  # AR: one forward per token
    with Image.open(out) as image:
        assert image.size == (2 * 64, 64)  # one row per prompt, --n columns


def test_json_writes_the_figures_the_command_printed(tmp_path, capsys):
    import json

    report = tmp_path / "figures.json"
    assert main(["generate", "a red circle", "--out", str(tmp_path / "x.png"), "--decoding", "sjd", "--window", "4",
                 "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    runs = json.loads(report.read_text())["runs"]
    assert [run["name"] for run in runs] == ["ar", "sjd"] and runs[0]["stats"]["target_forwards"] == 256
    assert f"{runs[1]['speedup']:.2f}x" in printed and runs[1]["stats"]["method"].startswith("SJD(window=4")
    assert main(["video", "--actions", "right*2", "--frames", "2", "--steps", "1", "--out",
                 str(tmp_path / "v.gif"), "--json", str(report)]) == 0
    runs = json.loads(report.read_text())["runs"]
    assert [run["name"] for run in runs] == ["sequential", "speculative"] and runs[1]["stats"]["frames_emitted"] == 2
    assert main(["text", "x = 1", "--method", "ngram", "--max-new-tokens", "4", "--json", str(report)]) == 0
    assert [run["name"] for run in json.loads(report.read_text())["runs"]] == ["ar", "ngram"]


def test_models_lists_the_embedded_models(capsys):
    from mmspec.zoo import zoo_names

    assert main(["models"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == set(zoo_names()) and "LlamaGenPipeline" in rows["shapes"]
    assert rows["shapes"].endswith("mmspec generate") and rows["pycode/target"].endswith("mmspec text")


def test_mmspec_generate_takes_sjd_options_and_can_skip_the_comparison(tmp_path, capsys):
    assert main(["generate", "a red circle", "--out", str(tmp_path / "x.png"), "--decoding", "sjd", "--window", "4",
                 "--init", "vertical", "--coupling", "gumbel", "--no-compare"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[-1].split()[0] == "sjd" and lines[-2].split()[0] == "method"
    # a named decoding with its options: SJD with them, no "chosen_by"
    assert "SJD(window=4, init='vertical', coupling='gumbel'" in printed and "chosen_by" not in printed
    with pytest.raises(SystemExit):
        main(["generate", "a red circle", "--init", "diagonal"])


def test_mmspec_generate_cuts_a_prompt_longer_than_the_text_context_and_says_so(tmp_path, capsys, caplog):
    """As LlamaGen's T5 embedder truncates (the embedded model holds 16 words), with one warning naming the cut."""
    out = tmp_path / "x.png"
    assert main(["generate", "a red circle " * 10, "--out", str(out), "--decoding", "sjd", "--no-compare"]) == 0
    assert out.is_file()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "prompt 'a red circle a red circle a red circle a...' is 30 tokens long and the model's text context holds "
        "16; this part was cut: 'red circle a red circle a red circle a red circle a red circle'"]


def test_embedded_image_pipeline_loads_with_one_call():
    from mmspec.pipelines.llamagen import LlamaGenPipeline

    pipe = LlamaGenPipeline.from_pretrained(zoo_path("shapes"))
    assert pipe.transformer.num_image_tokens == 256 and pipe.vqvae.config.codebook_size >= 1024
    assert pipe.transformer.dtype == pipe.text_encoder.dtype == torch.float32


def test_mmspec_demo_hands_its_options_to_the_demo(monkeypatch):
    import mmspec.apps.demo
    from mmspec.apps.tabs import TABS
    from mmspec.cli import DEMO_TABS

    received = []
    monkeypatch.setattr(mmspec.apps.demo, "serve", lambda **options: received.append(options))
    assert main(["demo", "--port", "8000", "--only", "image", "--device", "cpu", "--dtype", "bfloat16"]) == 0
    assert received == [{"kinds": ("image",), "image_model": None, "text_target": None, "text_draft": None,
                         "video_model": None, "host": "127.0.0.1", "port": 8000, "device": torch.device("cpu"),
                         "dtype": "bfloat16", "warm_up": True}]
    assert main(["demo", "--no-warmup", "--device", "cpu"]) == 0
    assert received[-1]["warm_up"] is False
    assert DEMO_TABS == tuple(TABS)  # the CLI names the tabs without importing Gradio


def test_mmspec_demo_without_gradio_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gradio" else find_spec(name))
    with pytest.raises(SystemExit) as exit_info:
        main(["demo"])
    assert exit_info.value.code == 2 and 'the demo needs Gradio: pip install "mmspec[app]"' in capsys.readouterr().err


def test_mmspec_video_writes_a_gif_and_compares_with_sequential(tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "rollout.gif"
    assert main(["video", "--actions", "right*3", "down", "2*2", "--frames", "3", "--steps", "2", "--out",
                 str(out), "--upscale", "2"]) == 0
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith(("sequential", "spec"))}
    assert set(rows) == {"sequential", "speculative"}
    assert rows["sequential"][3] == "6" and rows["sequential"][4] == "0"  # computed, discarded
    assert int(rows["speculative"][2]) < int(rows["sequential"][2])  # fewer forwards
    with Image.open(out) as gif:
        assert gif.size == (64, 64) and gif.n_frames == 6


def test_mmspec_video_reports_unknown_actions():
    with pytest.raises(SystemExit) as exit_info:
        main(["video", "--actions", "jump"])
    assert exit_info.value.code == 2
    with pytest.raises(ValueError, match="the count in 'up\\*0' must be an integer >= 1"):
        from mmspec.cli import parse_actions

        parse_actions(["up*0"], ("stay", "up"))


def test_mmspec_generate_loads_a_transformers_family_checkpoint_folder(tmp_path, capsys):
    """`--model` takes a family's own checkpoint folder (here a tiny Emu3 in transformers layout) with its size and
    negative prompt; an image size the model cannot make exits with a usage error."""
    from PIL import Image

    from tests.pipelines.test_family_pipelines import emu3_pipeline

    pipe = emu3_pipeline()
    pipe.model.save_pretrained(tmp_path / "emu3")
    pipe.tokenizer.save_pretrained(tmp_path / "emu3")
    out = tmp_path / "emu3.png"
    assert main(["generate", "a red circle", "--model", str(tmp_path / "emu3"), "--height", "12", "--width", "16",
                 "--negative-prompt", "ugly", "--decoding", "sjd", "--out", str(out)]) == 0
    comparison = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[-2:]}
    assert comparison["ar"][1] == "15" and int(comparison["sjd"][1]) < 15  # 3 rows x (4 + end-of-line)
    with Image.open(out) as image:
        assert image.size == (16, 12)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "a red circle", "--model", str(tmp_path / "emu3"), "--height", "13", "--width", "16",
              "--out", str(out)])
    assert exit_info.value.code == 2


def test_version_answers_without_a_subcommand(capsys):
    import mmspec

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"mmspec {mmspec.__version__}\n"
    assert mmspec.Judge.name == "judge"  # every acceptance rule is exported beside Exact, Lantern, GSD, Typical


def test_with_an_empty_cache_generate_says_what_it_does_within_5_seconds(tmp_path, report):
    """The first run on a machine measures it for seconds to minutes: the user sees a line at once, then progress
    bars (loading, timing), not silence. The process is stopped after its first line."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "MMSPEC_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "mmspec.cli", "generate", "a red circle", "--out",
                                str(tmp_path / "x.png")], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()
        seconds = time.perf_counter() - started
    finally:
        process.kill()
        process.wait()
    report(f"mmspec generate, empty cache: first line after {seconds:.2f} s")
    assert first.startswith("mmspec generate: loading shapes on cpu") and seconds < 5
    assert not (tmp_path / "x.png").exists()
