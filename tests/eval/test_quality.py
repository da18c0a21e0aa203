"""`python -m mmspec.eval.quality` at a tiny size on the embedded image model's components around its 2-layer draft
(`small_image_model`): prompt files, method specs, clear errors, the
report's keys, resumability (nothing regenerated, a missing image remade identically, a relabelled method or other
weights refused) and sharding with `accelerate launch` (the same images and quality numbers as one process)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec.core.files import read_prompts
from mmspec.eval.quality import main
from mmspec.eval.samples import Method, SampleStore, generate, presets
from mmspec.zoo.shapes import scenes

TINY = ["--methods", "ar", "sjd", "--num-prompts", "3", "--ar-seed-sets", "2", "--batch-size", "2"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Every run here uses one thread, as each process of the sharded run does (torchrun's default): float reductions
    then agree, and a near-tie in a sampled token's CDF cannot fall differently between two runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(small_image_model) -> list[str]:
    return [*TINY, "--model", small_image_model]


def pixels(folder: Path) -> dict[str, np.ndarray]:
    return {str(p.relative_to(folder)): np.asarray(Image.open(p)) for p in sorted(folder.rglob("*.png"))}


def token_ids(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): json.loads(Image.open(p).text["mmspec"])["token_ids"]
            for p in sorted(folder.rglob("*.png"))}


def quality_of(report: dict) -> dict:
    return {label: m["quality"] for label, m in report["methods"].items()}


def test_prompt_files(tmp_path):
    (tmp_path / "a.txt").write_text("a red circle\n\n  two blue squares  \n")
    (tmp_path / "b.tsv").write_text("image_id\tcaption\n1\ta red circle\n2\ttwo blue squares\n")
    (tmp_path / "c.tsv").write_text("1\ta red circle\n")
    (tmp_path / "d.json").write_text(json.dumps(["a red circle", {"caption": "two blue squares"}]))
    (tmp_path / "e.json").write_text(json.dumps({"annotations": [{"image_id": 1, "caption": "a red circle"}]}))
    assert read_prompts(tmp_path / "a.txt") == ["a red circle", "two blue squares"]
    assert read_prompts(tmp_path / "b.tsv") == ["a red circle", "two blue squares"]
    assert read_prompts(tmp_path / "c.tsv") == ["a red circle"]
    assert read_prompts(tmp_path / "d.json") == ["a red circle", "two blue squares"]
    assert read_prompts(tmp_path / "e.json") == ["a red circle"]
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="has no prompts"):
        read_prompts(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="prompts: no file"):
        read_prompts(tmp_path / "missing.txt")


def test_method_specs():
    assert Method.parse("sjd").options == presets()["sjd"] and Method.parse("sjd").lossless
    assert Method.parse("tree").options["tree_width"] > 1 and Method.parse("tree").lossless
    lantern = Method.parse("lantern")
    assert not lantern.lossless and lantern.options["acceptance"] == "lantern"
    custom = Method.parse("wide=sjd:window=24,coupling=gumbel")
    assert custom.label == "wide" and custom.options == {**presets()["sjd"], "window": 24, "coupling": "gumbel"}
    relaxed = Method.parse("d02=lantern:lantern_delta=0.2")
    assert relaxed.options == {**presets()["lantern"], "lantern_delta": 0.2} and not relaxed.lossless
    assert Method.parse("draft:draft_length=2").label == "draft_draft_length_2"
    with pytest.raises(ValueError, match="unknown preset"):
        Method.parse("beam")
    with pytest.raises(ValueError, match="bad option 'depth=3'"):
        Method.parse("sjd:depth=3")


@pytest.mark.parametrize("argv, message", [
    (["--num-prompts", "1"], "at least 2 images"),
    (["--images-per-prompt", "0"], "images_per_prompt: must be >= 1"),
    (["--ar-seed-sets", "1"], "ar_seed_sets: at least 2"),
    (["--methods", "sjd", "lantern"], "include 'ar'"),
    (["--methods", "ar", "x=sjd", "x=lantern"], "labels must be unique"),
    (["--reference", "nowhere"], "neither 'data', a method label"),
    (["--clip-model", "/nowhere/clip"], "clip_model: no folder"),
    (["--inception-weights", "/nowhere/inception.pth"], "inception_weights: no file"),
])
def test_clear_errors_before_generating(tmp_path, argv, message):
    with pytest.raises(ValueError, match=message):
        main(["--out-dir", str(tmp_path / "images"), "--num-prompts", "4", *argv])
    assert not (tmp_path / "images").exists() or not list((tmp_path / "images").rglob("*.png"))


def test_prompt_file_errors(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "coco.txt").write_text("a giraffe eating leaves\na red circle on a plain background\n")
    with pytest.raises(ValueError, match="has no prompts"):
        main(["--prompts", str(tmp_path / "empty.txt"), "--reference", "ar"])
    with pytest.raises(ValueError, match="reference: 'data'"):
        main(["--prompts", str(tmp_path / "coco.txt")])
    with pytest.raises(ValueError, match="does not know every word"):  # the in-domain CLIP cannot score COCO captions
        main(["--prompts", str(tmp_path / "coco.txt"), "--reference", "ar", "--out-dir", str(tmp_path / "images")])


def test_prompt_file_with_a_reference_folder(tmp_path, small_image_model):
    images, captions = scenes(0, 3, "heldout")
    (tmp_path / "prompts.tsv").write_text("id\tcaption\n" + "".join(f"{i}\t{c}\n" for i, c in enumerate(captions)))
    (tmp_path / "real").mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image).save(tmp_path / "real" / f"{i}.png")
    report = main(["--prompts", str(tmp_path / "prompts.tsv"), "--reference", str(tmp_path / "real"), "--methods",
                   "ar", "--ar-seed-sets", "2", "--batch-size", "3", "--model", small_image_model, "--out-dir",
                   str(tmp_path / "images")])
    assert report["reference"] == "reference" and report["prompts"] == 3
    assert "fid_ar_vs_reference" in report and "real_resampled" not in report
    assert report["images_made_by_main_process"] == 6


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny) -> tuple[dict, Path]:
    """The tiny run in one process: (report, folder with its images, JSON and plot); tests copy the folder."""
    folder = tmp_path_factory.mktemp("one_process")
    report = main([*tiny, "--out-dir", str(folder / "images"), "--json", str(folder / "first.json"),
                   "--plot", str(folder / "plot.png")])
    return report, folder


@pytest.mark.slow  # whole evaluation runs: the slow tier
def test_report_and_resume(one_process, tiny, tmp_path):
    first = one_process[0]
    shutil.copytree(one_process[1], tmp_path, dirs_exist_ok=True)
    out = tmp_path / "images"
    assert first["images_made_by_main_process"] == 3 * 2 + 3
    for key in ("fid_ar_vs_data", "fid_exact_vs_data", "fid_ar_seed_spread", "clip_ar", "clip_exact",
                "speedup_exact_vs_ar", "fid_exact_within_ar_spread", "exact_same_law_as_ar_p",
                "fid_real_resampled_vs_data", "speedup_sjd_vs_ar", "fid_sjd_vs_data", "sjd_same_law_as_ar_p"):
        assert key in first  # the roles (exact, lantern) and every method by its label
    assert first["speedup_sjd_vs_ar"] == first["speedup_exact_vs_ar"]
    assert first["methods"]["ar"]["seed_sets"] == 2 and first["methods"]["sjd"]["seed_sets"] == 1
    assert first["methods"]["sjd"]["speed"]["step_compression"] > 1.5
    assert json.loads((tmp_path / "first.json").read_text())["fid_ar_vs_data"] == first["fid_ar_vs_data"]
    assert (tmp_path / "plot.png").stat().st_size > 0
    before, tokens_before = pixels(out), token_ids(out)
    assert len(before) == 9 and all(len(ids.split()) == 256 for ids in tokens_before.values())

    second = main([*tiny, "--out-dir", str(out)])
    assert second["images_made_by_main_process"] == 0 and quality_of(second) == quality_of(first)

    remade = "sjd/set0/00001-0.png"
    (out / remade).unlink()
    third = main([*tiny, "--out-dir", str(out)])
    assert third["images_made_by_main_process"] == 1
    after = pixels(out)
    assert after.keys() == before.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before if k != remade)
    # the same tokens (per-row generator); decoded alone rather than in a batch of 2, the VQ decoder's float
    # arithmetic may round a pixel differently by one grey level
    assert token_ids(out) == tokens_before
    assert np.abs(before[remade].astype(int) - after[remade]).max() <= 1
    for label, quality in quality_of(third).items():
        assert quality == pytest.approx(quality_of(first)[label], rel=1e-2, abs=1e-3)

    several = main([*tiny, "--method-seed-sets", "2", "--out-dir", str(out)])  # adds sjd's seed set 1
    assert several["images_made_by_main_process"] == 3 and several["methods"]["sjd"]["seed_sets"] == 2
    assert 0 <= several["fid_exact_vs_ar_welch_p"] <= 1
    assert several["methods"]["sjd"]["seed_spread"]["clip_score"] > 0

    with pytest.raises(ValueError, match="holds images of another setting"):
        main(["--methods", "ar", "sjd=sjd:window=8", *tiny[3:], "--out-dir", str(out)])


def test_a_store_made_with_other_weights_is_refused(small_image_model, tmp_path):
    """The store pins the model's weights (a digest), not only its name: a retrained model's run never reuses the
    images of the model it replaced."""
    from mmspec.pipelines.auto import AutoARImagePipeline

    pipe = AutoARImagePipeline.from_pretrained(small_image_model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    store, plan = SampleStore(tmp_path, ["a red circle"], 1, 0, {}), [(Method.parse("ar"), 0)]
    assert generate(pipe, store, plan, 1, "shapes") == 1
    assert generate(pipe, store, plan, 1, "shapes") == 0  # the same weights: resumed
    with torch.no_grad():
        pipe.transformer.output.weight[0, 0] += 1.0
    with pytest.raises(ValueError, match="holds images of another setting"):
        generate(pipe, store, plan, 1, "shapes")


@pytest.mark.slow  # whole evaluation runs: the slow tier
def test_sharded_run_matches_one_process(one_process, tiny, tmp_path):
    one, one_folder = one_process
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "mmspec.eval.quality",
               *tiny, "--out-dir", str(tmp_path / "two"), "--json", str(tmp_path / "two.json")]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=600)
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["processes"] == 2
    assert 0 < two["images_made_by_main_process"] < one["images_made_by_main_process"]
    one_pixels, two_pixels = pixels(one_folder / "images"), pixels(tmp_path / "two")
    assert one_pixels.keys() == two_pixels.keys() and len(one_pixels) == 9
    # the same tokens; decoded in other batches, the VQ decoder's float arithmetic may round a pixel by one grey level
    assert token_ids(one_folder / "images") == token_ids(tmp_path / "two")
    assert max(np.abs(one_pixels[k].astype(int) - two_pixels[k]).max() for k in one_pixels) <= 1
    for label, quality in quality_of(two).items():
        assert quality == pytest.approx(quality_of(one)[label], rel=1e-2, abs=1e-3)
