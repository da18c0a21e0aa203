"""Smoke test of the text-pair training script: a few steps on a small corpus, save, resume, reload."""

import json
import shutil

import torch

from mmspec.zoo import load_causal_lm
from mmspec.zoo.text_corpus import corpus_files, is_held_out, stdlib_root
from mmspec.zoo.train_text import main


def small_corpus(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    sources = [stdlib_root() / "json" / name for name in ("__init__.py", "decoder.py", "encoder.py", "scanner.py")]
    for i in range(40):
        shutil.copy(sources[i % len(sources)], root / f"module_{i}.py")
    assert any(is_held_out(f"module_{i}.py") for i in range(40))
    return root


def test_train_save_resume_and_reload(tmp_path):
    root = small_corpus(tmp_path)
    assert corpus_files("held_out", root) and corpus_files("train", root)
    args = ["--corpus-root", str(root), "--work-dir", str(tmp_path / "work"), "--out-dir", str(tmp_path / "out"),
            "--batch-size", "2", "--seq-len", "32", "--ckpt-every", "1", "--draft-distill-steps", "1"]
    main(args + ["--target-steps", "1", "--draft-steps", "1"])
    main(args + ["--target-steps", "2", "--draft-steps", "1", "--only", "target"])  # resumes at step 1
    assert torch.load(tmp_path / "work" / "ckpt-target.pt", weights_only=False)["step"] == 2
    for name in ("target", "draft"):
        metrics = json.loads((tmp_path / "out" / name / "training_metrics.json").read_text())
        assert metrics["held_out_ppl"] > 1 and metrics["tokens_seen"] > 0
        model, tokenizer = load_causal_lm(tmp_path / "out" / name)
        assert model.dtype == torch.float32 and not model.training
        assert tokenizer.decode(tokenizer("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"
    target, _ = load_causal_lm(tmp_path / "out" / "target")
    assert target.config.early_exit_layer == 3
    draft_metrics = json.loads((tmp_path / "out" / "draft" / "training_metrics.json").read_text())
    assert draft_metrics["distill_steps"] == 1 and draft_metrics["pretrain"]["held_out_ppl"] > 1
    assert (tmp_path / "work" / "ckpt-draft-distill.pt").exists()
