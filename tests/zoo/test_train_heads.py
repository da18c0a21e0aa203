"""The head trainer: its unrolled training steps give the laws drafting gives (EAGLE's training-time test, Hydra's
heads), on the same prefix, so what is trained is what drafts; and the command runs end to end on the embedded
target (a few samples and steps) and writes the held-out metrics beside the heads."""

import json

import pytest
import torch

from mmspec.adapters.features import FeatureTap
from mmspec.core.drafting.heads import HeadProposer
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.training import heads as head_training
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.text import speculative_generate
from mmspec.text.head_drafters import HeadDrafter
from mmspec.zoo import train_heads
from tests.text.test_head_drafters import tiny_llama  # noqa: F401  (the fixture)


def drafted_laws(target, head, prompt, monkeypatch):
    """(sequence [1, T], [(last committed absolute position, q [2, V] of the round's two drafts, drafts [2])])."""
    rounds = []
    chain = HeadProposer.chain

    def recording(self, seq, committed, *args, **kwargs):
        draft = chain(self, seq, committed, *args, **kwargs)
        rounds.append((int(committed[0]), draft.q[0].clone(), draft.tokens[0].clone()))
        return draft

    monkeypatch.setattr(HeadProposer, "chain", recording)
    out, _ = speculative_generate(target, prompt, drafter=HeadDrafter(target, head), max_new_tokens=24,
                                  temperature=1.0, draft_length=2, generator=torch.Generator().manual_seed(0))
    P = prompt.shape[1]
    return out, [(P - 2 + c, q, d) for c, q, d in rounds]  # model view c - 1 sits at absolute P - 1 + c - 1


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "hydra"])
def test_training_steps_give_the_drafting_laws(tiny_llama, kind, monkeypatch):  # noqa: F811
    """"eagle3": an EAGLE head fusing both decoder layers' outputs with the feature (a random fuser)."""
    torch.manual_seed(1)
    if kind == "hydra":
        head = HydraHead(feature_size=32, vocab_size=64, num_heads=2, hidden=48).eval()
    else:
        head = EagleHead(feature_size=32, vocab_size=64, n_head=4, ffn_hidden=48,
                         feature_layers=(0, 1) if kind == "eagle3" else ()).eval()
        if kind == "eagle3":
            torch.nn.init.normal_(head.fuser.weight, std=0.1)
    prompt = torch.randint(0, 32, (1, 6), generator=torch.Generator().manual_seed(2))
    sequence, rounds = drafted_laws(tiny_llama, head, prompt, monkeypatch)
    teacher = train_heads.TextTeacher(tiny_llama)
    teacher.tap = FeatureTap.of(teacher.lm_head, head.tapped_layers(teacher.layers))
    batch = teacher.pairs(sequence)
    with torch.no_grad():
        if kind != "hydra":
            predictions = head_training.eagle_steps(head, batch, unroll=1, noise=0.0)
            laws = [head.logits(hidden).softmax(-1)[0] for hidden in predictions]  # step s, column i
        else:
            predictions = head_training.hydra_steps(head, batch, noise=0.0)
            laws = [head.logits(hidden).softmax(-1)[0] for hidden in predictions]  # head k, column i
    checked_second = 0
    for last, q, drafts in rounds:
        column = last - 1  # the pair of the last committed token
        torch.testing.assert_close(q[0], laws[0][column], atol=1e-5, rtol=1e-4)
        if last + 1 < sequence.shape[1] and sequence[0, last + 1] == drafts[0]:  # the first draft was kept
            # EAGLE: step 1 reads its step-0 prediction at the column before; Hydra: head 1 at the same root
            torch.testing.assert_close(q[1], laws[1][column if kind == "hydra" else column + 1], atol=1e-5,
                                       rtol=1e-4)
            checked_second += 1
    assert len(rounds) > 3 and checked_second > 0


@pytest.mark.slow  # the command end to end
def test_the_command_trains_and_saves_both_heads(tmp_path):
    train_heads.main(["--target", "pycode/target", "--samples", "6", "--held-out", "2", "--new-tokens", "8",
                      "--sample-batch", "3", "--steps", "1", "--batch-size", "2", "--out-dir", str(tmp_path / "out"),
                      "--work-dir", str(tmp_path / "work")])
    for kind, head_class, depths in (("eagle", EagleHead, 3), ("hydra", HydraHead, 4)):
        folder = tmp_path / "out" / f"{kind}_head"
        metrics = json.loads((folder / "training_metrics.json").read_text())
        assert len(metrics["held_out_alpha_by_depth"]) == depths
        assert all(0 < a <= 1 for a in metrics["held_out_alpha_by_depth"])
        # the head keeps its held-out acceptance in its config, where `decoding="auto"` reads it
        loaded = head_class.from_pretrained(folder)
        assert loaded.config.acceptance == {"by_depth": metrics["held_out_alpha_by_depth"]}
    kept = torch.load(tmp_path / "work" / "samples.pt")
    train_heads.main(["--target", "pycode/target", "--kinds", "hydra", "--samples", "8", "--held-out", "2",
                      "--new-tokens", "8", "--sample-batch", "3", "--steps", "1", "--batch-size", "2", "--out-dir",
                      str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")])
    topped_up = torch.load(tmp_path / "work" / "samples.pt")
    assert topped_up.shape[0] == 8 and torch.equal(topped_up[:6], kept)  # kept ones reused, two more drawn
    # a fine-tune from the saved head trains from it, not from the plain run's finished checkpoint in the same work
    # folder (which would "resume" at its last step and train nothing)
    # ... and may fuse decoder layers' outputs with the feature (EAGLE-3), starting as the saved head
    train_heads.main(["--target", "pycode/target", "--kinds", "eagle", "--samples", "8", "--held-out", "2",
                      "--new-tokens", "8", "--steps", "1", "--batch-size", "2", "--tv-weight", "1",
                      "--feature-layers", "3", "7", "--init-from", str(tmp_path / "out"),
                      "--out-dir", str(tmp_path / "tuned"), "--work-dir", str(tmp_path / "work")])
    start, tuned = (EagleHead.from_pretrained(tmp_path / name / "eagle_head") for name in ("out", "tuned"))
    assert not torch.equal(start.fc.weight, tuned.fc.weight)
    assert list(tuned.config.feature_layers) == [3, 7] and tuned.fuser.weight.shape == (192, 576)
    metrics = json.loads((tmp_path / "tuned" / "eagle_head" / "training_metrics.json").read_text())
    assert metrics["init_from"] == str(tmp_path / "out") and metrics["tv_weight"] == 1.0
    assert metrics["feature_layers"] == [3, 7]


def test_the_guided_law_trained_is_the_law_decoding_samples():
    """The image trainer's guided law (its loss and held-out alpha) is the decoding's processed CFG law."""
    g = torch.Generator().manual_seed(0)
    conditional, unconditional = torch.randn(2, 3, 5, 16, generator=g)
    decoded = process_logits(conditional, SamplingConfig(guidance_scale=3.0), unconditional)
    trained = train_heads.guided(torch.cat([conditional, unconditional]), 3.0).softmax(-1)
    torch.testing.assert_close(trained, decoded)


def test_bad_arguments_fail_before_any_model_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_heads.main(["--target", "pycode/target", "--held-out", "10", "--samples", "10"])
    assert exit_info.value.code == 2
    assert "--held-out (10) must be below --samples (10)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        train_heads.main(["--target", "pycode/target", "--feature-layers", "3", "12"])
    assert exit_info.value.code == 2
    assert "--feature-layers must be distinct indices of the target's 12 decoder layers (0 .. 11), got 3 12" in (
        capsys.readouterr().err)


def test_partial_alignment_aligns_only_its_share_of_the_feature():
    """FSPAD's partial alignment: with --align-share 0.5 the target feature's second half does not enter the loss."""
    torch.manual_seed(0)
    head = EagleHead(feature_size=8, vocab_size=16, n_head=2, ffn_hidden=8)
    head.bind(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    tokens = torch.randint(0, 16, (2, 5))
    batch = head_training.Pairs(tokens, torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.rand(2, 5, 16).softmax(-1),
                              torch.arange(5).expand(2, -1))
    moved = batch._replace(target_features=torch.cat([batch.target_features[..., :4],
                                                      batch.target_features[..., 4:] + 5], -1))
    predictions = head_training.eagle_steps(head, batch, unroll=1, noise=0.0)

    def losses(b, share):
        return torch.stack(train_heads.depth_losses(head, b, predictions, 1.0, align_share=share))

    torch.testing.assert_close(losses(batch, 0.5), losses(moved, 0.5))
    assert (losses(moved, 1.0) > losses(batch, 1.0)).all()


def test_a_feature_sampling_head_started_from_a_plain_one_predicts_as_it_does(tmp_path):
    """--init-from with --feature-sampling: the saved head's weights, zero for the sampled feature's inputs."""
    torch.manual_seed(0)
    plain = EagleHead(feature_size=8, vocab_size=16, n_head=2, ffn_hidden=8).eval()
    plain.save_pretrained(tmp_path / "eagle_head")
    sampling = EagleHead(feature_size=8, vocab_size=16, n_head=2, ffn_hidden=8, feature_sampling=True).eval()
    train_heads.start_from(sampling, tmp_path / "eagle_head")
    tokens, features = torch.randint(0, 16, (2, 5)), torch.randn(2, 5, 8)
    embedding, lm_head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)
    for head in (plain, sampling):
        head.bind(embedding, lm_head)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    arguments = (tokens, features, torch.arange(5).expand(2, -1), mask)
    torch.testing.assert_close(sampling(*arguments), plain(*arguments))
    with pytest.raises(ValueError, match="holds another kind of head"):
        train_heads.start_from(HydraHead(feature_size=8, vocab_size=16, num_heads=2, hidden=8), tmp_path / "eagle_head")


def test_a_fusing_head_started_from_a_plain_one_predicts_as_it_does(tmp_path):
    """--init-from with --feature-layers: the saved head's weights, and a fuser that reads the feature alone."""
    torch.manual_seed(0)
    plain = EagleHead(feature_size=8, vocab_size=16, n_head=2, ffn_hidden=8).eval()
    plain.save_pretrained(tmp_path / "eagle_head")
    fusing = EagleHead(feature_size=8, vocab_size=16, n_head=2, ffn_hidden=8, feature_layers=(0, 2)).eval()
    train_heads.start_from(fusing, tmp_path / "eagle_head")
    tokens, features = torch.randint(0, 16, (2, 5)), torch.randn(2, 5, 8)
    layer_outputs = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    embedding, lm_head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)
    for head in (plain, fusing):
        head.bind(embedding, lm_head)
    positions = torch.arange(5).expand(2, -1)
    torch.testing.assert_close(fusing(tokens, fusing.fuse(torch.cat([layer_outputs, features], -1)), positions, mask),
                               plain(tokens, plain.fuse(features), positions, mask))


def test_the_tv_term_is_the_rejection_rate_of_the_law_decoding_accepts_against():
    """--tv-weight adds w x (1 - alpha) per depth, alpha = sum_x min(p, q) of the laws decoding accepts against (the
    guided ones for images, the plain ones for text), computed here independently in float64."""
    torch.manual_seed(0)
    head = EagleHead(feature_size=8, vocab_size=16, n_head=2, ffn_hidden=8, positions="2d", grid_size=4)
    head.bind(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    tokens = torch.randint(0, 16, (4, 5))
    laws = torch.rand(4, 5, 16).softmax(-1)
    batch = head_training.Pairs(tokens, torch.randn(4, 5, 8), torch.randn(4, 5, 8), laws, torch.arange(5).expand(4, -1),
                              torch.rand(2, 5, 16).softmax(-1))
    predictions = head_training.eagle_steps(head, batch, unroll=1, noise=0.0)
    plain = train_heads.depth_losses(head, batch, predictions, 1.0, 3.0)
    weighted = train_heads.depth_losses(head, batch, predictions, 1.0, 3.0, tv_weight=2.0)
    for d, hidden in enumerate(head_training.aligned(head, predictions)):
        logits = head.logits(hidden).double()
        q = (logits[2:] + 3.0 * (logits[:2] - logits[2:])).softmax(-1)  # conditional rows first, then their twins
        alpha = torch.minimum(batch.guided_laws[:, d:].double(), q).sum(-1).mean()
        torch.testing.assert_close((weighted[d] - plain[d]).double(), 2.0 * (1 - alpha), atol=1e-6, rtol=1e-5)
    text = batch._replace(guided_laws=None)  # text: the plain laws are the ones decoding accepts against
    plain = train_heads.depth_losses(head, text, predictions, 1.0)
    weighted = train_heads.depth_losses(head, text, predictions, 1.0, tv_weight=2.0)
    for d, hidden in enumerate(head_training.aligned(head, predictions)):
        alpha = torch.minimum(laws[:, d:].double(), head.logits(hidden).double().softmax(-1)).sum(-1).mean()
        torch.testing.assert_close((weighted[d] - plain[d]).double(), 2.0 * (1 - alpha), atol=1e-6, rtol=1e-5)
