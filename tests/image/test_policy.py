"""`decoding="auto"` (mmspec.image.policy): the choice follows the cost curve and the acceptance, a named decoding
wins (settings without one are refused, not read as a choice), and a cost curve is reused only for the model and device
it was measured on."""

import json
import re

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.measured import MeasurementCache, device_fingerprint
from mmspec.core.stats import SpecStats
from mmspec.image.policy import (
    HEAD_LENGTHS,
    TREES,
    WINDOWS,
    DecodingPolicy,
    HeadChain,
    head_compression,
    load_prior,
    measure_overheads,
    model_fingerprint,
    tree_key,
)
from mmspec.models.heads import EagleHead
from mmspec.models.llamagen.adapter import LlamaGenAdapter

CFG = SamplingConfig(guidance_scale=3.0)
PRIOR = {1: {2: 1.4, 4: 2.0, 8: 2.6, 16: 3.0, 32: 3.2}, 8: {2: 1.3, 4: 1.7, 8: 2.0, 16: 2.2, 32: 2.3}}


@pytest.fixture(scope="module")
def pipe(small_image_model):
    from mmspec.pipelines.llamagen import LlamaGenPipeline

    pipe = LlamaGenPipeline.from_pretrained(small_image_model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def adapter(pipe):
    return LlamaGenAdapter(pipe.transformer, pipe.vqvae)


def put_curve(cache, model, curve: dict[int, float], batch_size: int = 1, overhead: float = 0.0, head=None) -> None:
    """`curve` and a flat per-iteration overhead (for AR, every window, the trees and the chains of `head`) in
    `cache` for `model`: the policy then measures nothing."""
    where = (model_fingerprint(model), device_fingerprint(torch.device("cpu")))
    cache.put(*where, f"B={batch_size} cfg", {str(W): seconds for W, seconds in curve.items()})
    names = [str(W) for W in (1, *WINDOWS)] + [tree_key(tree) for tree in TREES]
    if head is not None:
        names += [HeadChain(head, length, ()).name for length in HEAD_LENGTHS]
    cache.put(*where, f"B={batch_size} cfg overhead", {**dict.fromkeys(names, overhead), "prefill": 0.0})


def trusting(cache: MeasurementCache, **settings) -> DecodingPolicy:
    """A policy that reads its cache's made-up curves as they are (no probe of the machine)."""
    return DecodingPolicy(cache=cache, prior=PRIOR, check_cached=False, **settings)


def policy_with_curve(tmp_path, adapter, curve: dict[int, float], batch_size: int = 1,
                      overhead: float = 0.0) -> DecodingPolicy:
    """A policy whose cache already holds `curve` and `overhead` for this adapter, device and batch size (nothing is
    measured)."""
    cache = MeasurementCache("cost_curves", tmp_path)
    put_curve(cache, adapter, curve, batch_size, overhead)
    return trusting(cache, windows=(2, 4, 8, 16, 32), tree_prior={})


def test_a_flat_cost_curve_picks_a_wide_window_and_a_compute_bound_one_picks_ar(tmp_path, adapter, pipe):
    condition = pipe.encode_prompt(["a red circle"])
    flat = {1: 1.0, 2: 1.0, 4: 1.05, 8: 1.1, 16: 1.2, 32: 1.5}  # a GPU: a window costs about one token
    choice = policy_with_curve(tmp_path / "flat", adapter, flat).choose(adapter, condition, 1, CFG)
    assert choice.window == 16 and choice.decoding.name == "sjd" and choice.predicted_speedup > 2
    assert "sjd window 16" in choice.reason and "cached" in choice.reason
    linear = {W: float(W) for W in (1, 2, 4, 8, 16, 32)}  # compute-bound: W tokens cost W AR steps
    choice = policy_with_curve(tmp_path / "linear", adapter, linear).choose(adapter, condition, 1, CFG)
    assert choice.window == 1 and choice.decoding.name == "ar" and "no window pays" in choice.reason


def test_with_captured_steps_the_policy_times_replayed_iterations(tmp_path, pipe):
    """A model with captured steps (tape graphs here, CUDA graphs on a GPU) is priced by its replayed iterations,
    cached under their own key; the decoding chosen then replays the graphs the measurement captured."""
    from mmspec.models.llamagen.graphs import WindowGraphs

    graphs = WindowGraphs(pipe.transformer, capture=False)
    adapter = LlamaGenAdapter(pipe.transformer, pipe.vqvae, graphs)
    condition = pipe.encode_prompt(["a red circle"])
    cache = MeasurementCache("cost_curves", tmp_path)
    policy = DecodingPolicy(cache=cache, prior=PRIOR, windows=(2, 4), tree_prior={})
    choice = policy.choose(adapter, condition, 1, CFG)
    saved = cache.get(model_fingerprint(adapter), device_fingerprint(torch.device("cpu")), "B=1 cfg replayed")
    assert set(saved) == {"prefill", "1", "2", "4"} and all(seconds > 0 for seconds in saved.values())
    assert cache.get(model_fingerprint(adapter), device_fingerprint(torch.device("cpu")), "B=1 cfg") is None
    if choice.window > 1:
        assert "replayed from graphs" in choice.reason
    # each candidate's steps, captured while measuring, on the cache of its window (AR's, W 2's, W 4's)
    assert len(graphs.stores) == 3 and all(steps.shells for _, _, steps in graphs.stores.values())

    def decoded(model):  # the chosen decoding, on the caches the measurement left (writable outside it)
        with torch.no_grad():
            steps = list(choice.decoding.run(model, condition, CFG, torch.Generator().manual_seed(0), SpecStats()))
        return steps[-1].tokens

    assert torch.equal(decoded(adapter), decoded(LlamaGenAdapter(pipe.transformer, pipe.vqvae)))


def test_cached_replayed_iterations_a_probe_disagrees_with_are_measured_again(tmp_path, pipe, caplog):
    """Replayed iterations cached with window 4 at 10 AR steps (no machine's: a busy one's, or another's) are probed
    before use (AR's replayed step and the widest candidate's), found off and measured again. Companion: a policy
    that trusts its cache reads them as they are."""
    import logging

    from mmspec.models.llamagen.graphs import WindowGraphs

    adapter = LlamaGenAdapter(pipe.transformer, pipe.vqvae, WindowGraphs(pipe.transformer, capture=False))
    condition = pipe.encode_prompt(["a red circle"])
    cache = MeasurementCache("cost_curves", tmp_path)
    poisoned = {"prefill": 0.0, "1": 1.0, "2": 10.0, "4": 10.0}
    cache.put(model_fingerprint(adapter), device_fingerprint(torch.device("cpu")), "B=1 cfg replayed", poisoned)
    assert trusting(cache, windows=(2, 4), tree_prior={}).replayed_iterations(adapter, condition, 1, CFG,
                                                                               (1, 2, 4)) == (poisoned, False)
    policy = DecodingPolicy(cache=cache, prior=PRIOR, windows=(2, 4), tree_prior={})
    with caplog.at_level(logging.WARNING, logger="mmspec.image.policy"):
        seconds, measured = policy.replayed_iterations(adapter, condition, 1, CFG, (1, 2, 4))
    assert measured and seconds["4"] / seconds["1"] < 5
    assert ("the cached replayed iterations for B=1 cfg replayed disagrees with a probe now (sjd window 4 costs"
            in caplog.text)


def test_a_frontier_tree_is_chosen_where_its_extra_tokens_cost_little(tmp_path, adapter, pipe):
    """With a tree prior of 3.6 tokens per forward at window 16 (20 nodes) against the chain's 3.0: on a flat curve
    the tree wins; where each token costs (a CPU) the chain's 16 tokens beat the tree's 20. An adapter without
    forward_tree never gets one."""
    condition = pipe.encode_prompt(["a red circle"])
    trees = {1: {(16, 2, 2): 3.6}}
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.1}
    cache = MeasurementCache("cost_curves", tmp_path)
    put_curve(cache, adapter, flat)
    policy = trusting(cache, windows=(2, 4, 8, 16), tree_prior=trees)
    choice = policy.choose(adapter, condition, 1, CFG)
    assert (choice.window, choice.decoding.tree_width, choice.decoding.tree_depth) == (16, 2, 2), choice.reason
    assert "2 x 2 frontier tree" in choice.reason and "20-token forward" in choice.reason
    steep = {W: 1.0 + 0.3 * W for W in (1, 2, 4, 8, 16, 32)}
    put_curve(cache, adapter, steep)
    choice = trusting(cache, windows=(2, 4, 8, 16), tree_prior=trees).choose(
        adapter, condition, 1, CFG)
    assert choice.decoding.name == "sjd" and not choice.decoding.tree, choice.reason
    chain_only = type("ChainOnly", (), {"grid": adapter.grid, "vocab_size": adapter.vocab_size,
                                        "transformer": adapter.transformer})()
    assert DecodingPolicy(cache=cache, prior=PRIOR, tree_prior=trees).trees(1) == [(16, 2, 2)]
    put_curve(cache, chain_only, flat)
    choice = trusting(cache, windows=(2, 4, 8, 16), tree_prior=trees).choose(
        chain_only, condition, 1, CFG)
    assert not choice.decoding.tree, choice.reason


def test_a_small_predicted_gain_stays_ar_below_the_margin(tmp_path, adapter, pipe):
    """At batch 8, window 4 predicted 1.7 / 1.6 = 1.06x: under the 1.1x margin, so AR."""
    condition = pipe.encode_prompt(["a red circle"] * 8)
    curve = {1: 1.0, 2: 1.3, 4: 1.6, 8: 3.0, 16: 6.0, 32: 12.0}
    choice = policy_with_curve(tmp_path, adapter, curve, batch_size=8).choose(adapter, condition, 8, CFG)
    assert choice.window == 1, choice.reason
    assert "1.06x" in choice.reason


def test_the_runs_own_acceptance_moves_the_choice(tmp_path, adapter, pipe):
    """A model that accepts less than the prior says makes a wide window pay less: after runs that reached half the
    prior's excess compression, the predicted compression halves its excess."""
    condition = pipe.encode_prompt(["a red circle"])
    policy = policy_with_curve(tmp_path, adapter, {1: 1.0, 2: 1.2, 4: 1.5, 8: 1.6, 16: 3.0, 32: 5.0})
    first = policy.choose(adapter, condition, 1, CFG)
    assert first.window == 8
    from mmspec.core.stats import SpecStats

    observed = 1 + (PRIOR[1][8] - 1) / 2
    stats = SpecStats(target_forwards=1 + round(256 / observed), prefill_forwards=1, new_tokens=torch.tensor([256]))
    policy.record(first, 1, CFG, stats)
    assert policy.compression(8, 1) == pytest.approx(observed, rel=0.01)
    assert policy.compression(16, 1) == pytest.approx(1 + (PRIOR[1][16] - 1) / 2, rel=0.01)
    assert policy.choose(adapter, condition, 1, CFG) is first  # a choice holds until reconsidered
    policy.reconsider()
    assert policy.choose(adapter, condition, 1, CFG).predicted_speedup < first.predicted_speedup


def test_a_seed_gives_the_same_image_on_every_auto_call(pipe):
    """The unseeded runs in between move the acceptance estimate, and on a busy machine may have the policy choose
    again; seeded calls keep the choice the first of them was given, so the tokens repeat."""
    seeded = lambda: [torch.Generator().manual_seed(i) for i in range(2)]  # noqa: E731
    first = pipe(["a red circle"] * 2, generator=seeded(), output_type="latent")
    for _ in range(3):
        pipe(["a red circle"] * 2, output_type="latent")
    again = pipe(["a red circle"] * 2, generator=seeded(), output_type="latent")
    assert again.stats.decoding == first.stats.decoding and torch.equal(again.images, first.images)


def test_a_named_decoding_wins_and_settings_without_a_name_are_refused(pipe):
    generator = torch.Generator().manual_seed(0)
    out = pipe("a red circle", generator=generator, output_type="latent", decoding="sjd", window=4)
    assert out.stats.chosen_by is None and "window=4" in out.stats.method
    out = pipe("a red circle", generator=generator, output_type="latent", decoding="ar")
    assert out.stats.chosen_by is None and out.stats.method == "AR()" and out.stats.target_forwards == 256
    with pytest.raises(ValueError, match=r"\['window'\] set a named decoding; name it \(decoding='sjd' / 'pjd'\)"):
        pipe("a red circle", output_type="latent", window=4)
    with pytest.raises(ValueError, match=r'decoding="auto" chooses the decoding and its settings'):
        pipe("a red circle", output_type="latent", decoding="auto", acceptance="lantern")
    out = pipe("a red circle", generator=generator, output_type="latent")
    assert out.stats.chosen_by.startswith("auto: ")


def test_the_cost_curve_is_measured_once_then_read_from_disk(tmp_path, adapter, pipe):
    condition = pipe.encode_prompt(["a red circle"] * 2)
    policy = DecodingPolicy(cache=MeasurementCache("cost_curves", tmp_path), prior=PRIOR, tree_prior={})
    curve, measured = policy.cost_curve(adapter, condition, 2, CFG)
    assert measured and set(curve) == {1, *WINDOWS} and all(seconds > 0 for seconds in curve.values())
    assert len(list(tmp_path.glob("*.json"))) == 1
    again = DecodingPolicy(cache=MeasurementCache("cost_curves", tmp_path), prior=PRIOR, tree_prior={},
                           check_cached=False)  # a new process, the same machine
    assert again.cost_curve(adapter, condition, 2, CFG) == (curve, False)
    again.remeasure()  # on request: measured again and the cached curve overwritten
    remeasured, measured = again.cost_curve(adapter, condition, 2, CFG)
    saved = MeasurementCache("cost_curves", tmp_path).get(model_fingerprint(adapter),
                                                          device_fingerprint(torch.device("cpu")), "B=2 cfg")
    assert measured and saved == {str(W): seconds for W, seconds in remeasured.items()}
    assert again.cost_curve(adapter, condition, 2, CFG)[1] is False  # once per remeasure(), not on every call


def test_a_cost_curve_from_another_device_or_model_is_not_reused(tmp_path, adapter, pipe):
    condition = pipe.encode_prompt(["a red circle"])
    model_print, device_print = model_fingerprint(adapter), device_fingerprint(torch.device("cpu"))
    cache = MeasurementCache("cost_curves", tmp_path)
    fake = {W: 1e-9 for W in (1, *WINDOWS)}  # an impossible curve: reusing it would be visible
    saved_fake = {str(W): seconds for W, seconds in fake.items()}
    elsewhere = {**device_print, "name": "NVIDIA H100 80GB HBM3 (sm 9.0)", "type": "cuda"}
    cache.put(model_print, elsewhere, "B=1 cfg", saved_fake)
    curve, measured = DecodingPolicy(cache=cache, prior=PRIOR, tree_prior={}).cost_curve(adapter, condition, 1, CFG)
    assert measured and curve != fake
    # a file copied from another machine under this machine's name is recognised by its content and rewritten
    ours = cache.path(model_print, device_print)
    copied = json.loads(cache.path(model_print, elsewhere).read_text())
    ours.write_text(json.dumps(copied))
    curve, measured = DecodingPolicy(cache=cache, prior=PRIOR, tree_prior={}).cost_curve(adapter, condition, 1, CFG)
    assert measured and curve != fake and json.loads(ours.read_text())["device"] == device_print
    # another model (the same pipeline at another size, or another checkpoint) has its own curve
    deeper = type(pipe.transformer)(**{**pipe.transformer.config, "n_layer": 3}).eval()
    other = LlamaGenAdapter(deeper, pipe.vqvae)
    assert model_fingerprint(other) != model_print
    cache.put(model_print, device_print, "B=1 cfg", saved_fake)
    assert trusting(cache, tree_prior={}).cost_curve(adapter, condition, 1, CFG) == (fake, False)
    assert cache.get(model_fingerprint(other), device_print, "B=1 cfg") is None


def test_the_shipped_prior_covers_every_window_and_batch_size():
    prior = load_prior()
    assert sorted(prior) == [1, 2, 4, 8]
    for row in prior.values():
        assert sorted(row) == sorted(WINDOWS)
        assert all(1 < c <= W for W, c in row.items())


def test_the_iteration_overhead_is_part_of_the_prediction_and_measured_on_the_step(tmp_path, adapter, pipe):
    """An SJD iteration that spends one AR step outside its forward (AR none) halves every window's predicted
    speedup; an overhead is measured for AR, a window and a frontier tree, on their own steps."""
    condition = pipe.encode_prompt(["a red circle"])
    flat = {W: 1.0 for W in (1, *WINDOWS)}
    lean = policy_with_curve(tmp_path / "lean", adapter, flat).choose(adapter, condition, 1, CFG)
    cache = MeasurementCache("cost_curves", tmp_path / "heavy")
    put_curve(cache, adapter, flat, overhead=1.0)
    where = (model_fingerprint(adapter), device_fingerprint(torch.device("cpu")))
    cache.put(*where, "B=1 cfg overhead", {**cache.get(*where, "B=1 cfg overhead"), "1": 0.0})
    heavy = trusting(cache, windows=(2, 4, 8, 16, 32), tree_prior={}).choose(
        adapter, condition, 1, CFG)
    assert heavy.window == lean.window and heavy.predicted_speedup == pytest.approx(lean.predicted_speedup / 2)
    measured = measure_overheads(adapter, condition, CFG, (1, 4, (8, 2, 2)), repeats=2)
    assert set(measured) == {"prefill", "1", "4", "8x2x2"} and all(seconds >= 0 for seconds in measured.values())


def eagle_head(adapter, acceptance: dict | None, vocab_size: int | None = None) -> EagleHead:
    """An (untrained) EAGLE head for the adapter's model, recording `acceptance` as `train_heads` would."""
    c = adapter.transformer.config
    torch.manual_seed(0)
    return EagleHead(feature_size=c.dim, vocab_size=vocab_size or c.vocab_size, n_head=c.n_head, ffn_hidden=32,
                     positions="2d", grid_size=c.grid_size, acceptance=acceptance).eval()


def test_a_head_chain_compresses_by_its_acceptance_per_depth():
    assert head_compression([0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert head_compression([0.8, 0.5], 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)  # the last depth's past the list
    assert head_compression([0.9, 0.1], 1) == pytest.approx(1.9)


def test_auto_chooses_the_heads_chain_where_its_acceptance_pays_and_learns_from_its_runs(tmp_path, adapter, pipe):
    """On a flat cost curve SJD's best is window 16 (prior 3.0 tokens a forward in 16: 2.5x); a head whose guided
    drafts are accepted 90 % of the time reaches 1 + .9 + .81 + .73 + .66 = 4.1 in 5 (3.9x) and is chosen, through
    the pipeline too; one accepted 30 % of the time is not, nor one that records no acceptance, nor one of another
    vocabulary, nor any on a model with captured steps. A run of the chosen (untrained) head accepts far less than it
    recorded: its own record moves the next choice back to SJD, and leaves SJD's estimate alone."""
    condition = pipe.encode_prompt(["a red circle"])
    flat = {1: 1.0, 2: 1.0, 4: 1.05, 8: 1.1, 16: 1.2, 32: 1.5}
    strong = eagle_head(adapter, {"by_depth": [0.3], "guided_by_depth": [0.9], "guidance_scale": 3.0})
    cache = MeasurementCache("cost_curves", tmp_path)
    put_curve(cache, adapter, flat, head=strong)
    policy = trusting(cache, windows=(2, 4, 8, 16, 32), tree_prior={})
    choice = policy.choose(adapter, condition, 1, CFG, strong)
    assert choice.decoding.name == "heads" and choice.decoding.draft_length == 4, choice.reason
    assert choice.decoding.head is strong and choice.window == 5
    assert "eagle head, 4 drafts a round predicted 3.85x" in choice.reason
    assert policy.choose(adapter, condition, 1, CFG).decoding.name == "sjd"  # no head, another choice

    weak = eagle_head(adapter, {"by_depth": [0.3], "guided_by_depth": [0.3], "guidance_scale": 3.0})
    put_curve(cache, adapter, flat, head=weak)
    assert policy.choose(adapter, condition, 1, CFG, weak).decoding.name == "sjd"
    acceptance = lambda sampling: {c.acceptance for c in policy.head_chains(adapter, strong, sampling)}  # noqa: E731
    assert acceptance(CFG) == {(0.9,)} and acceptance(SamplingConfig()) == {(0.3,)}  # without CFG: "by_depth"
    assert policy.head_chains(adapter, eagle_head(adapter, None), CFG) == []
    assert policy.head_chains(adapter, eagle_head(adapter, {"by_depth": [0.9]}, vocab_size=7), CFG) == []
    from mmspec.models.llamagen.graphs import WindowGraphs

    graphed = LlamaGenAdapter(pipe.transformer, pipe.vqvae, WindowGraphs(pipe.transformer, capture=False))
    assert {c.length for c in policy.head_chains(graphed, strong, CFG)} == set(HEAD_LENGTHS)  # captured, offered

    headed = type(pipe)(**{**pipe.components, "eagle_head": strong})
    headed.set_progress_bar_config(disable=True)
    headed._decoding_policy = policy
    out = headed("a red circle", generator=torch.Generator().manual_seed(0), output_type="latent")
    # its iterations took a thousandth of the curve's made-up seconds: said, and (the cache trusted) not refreshed
    assert out.stats.chosen_by.startswith(f"{choice.reason}; its iterations took ") and out.stats.draft_forwards > 0
    assert len(policy.head_history) == 1 and not policy.history
    policy.reconsider()
    assert policy.choose(adapter, condition, 1, CFG, strong).decoding.name == "sjd"


@pytest.mark.parametrize("grid_size", [2, 3])
def test_auto_runs_on_a_model_of_a_few_image_tokens_with_an_empty_cache(tmp_path, monkeypatch, grid_size):
    """Its timings start a new image whenever the one they step through is full (they once ran more AR steps than
    a 2 x 2 image has and overflowed its cache)."""
    from mmspec.pipelines.llamagen import LlamaGenPipeline
    from tests.models.llamagen_tiny import tiny_text_encoder, tiny_tokenizer, tiny_transformer, tiny_vq

    pipe = LlamaGenPipeline(tiny_transformer(grid_size=grid_size, dtype=torch.float32), tiny_vq(dtype=torch.float32),
                            tiny_tokenizer(), tiny_text_encoder(dtype=torch.float32))
    monkeypatch.setenv("MMSPEC_CACHE_DIR", str(tmp_path))  # an empty cache: everything is measured
    pipe.set_progress_bar_config(disable=True)
    out = pipe(["a red circle", "a blue square"], output_type="latent", generator=[torch.Generator().manual_seed(s)
                                                                                  for s in (0, 1)])
    assert out.images.shape == (2, grid_size**2) and (out.images >= 0).all()
    assert out.stats.chosen_by.startswith("auto: ") and "measured now" in out.stats.chosen_by


def test_measuring_says_what_it_times_as_it_goes(tmp_path, adapter, pipe):
    """The first call of a batch size times for seconds to minutes: each measurement shows a bar that names it and
    advances to its end; a cached curve shows none."""
    import contextlib

    bars = []

    @contextlib.contextmanager
    def progress(description, total):
        bar = {"description": description, "total": total, "done": 0}
        bars.append(bar)
        yield type("Bar", (), {"update": lambda self, n=1: bar.update(done=bar["done"] + n)})()

    condition = pipe.encode_prompt(["a red circle"] * 2)
    policy = DecodingPolicy(cache=MeasurementCache("cost_curves", tmp_path), prior=PRIOR, tree_prior={},
                            progress=progress)
    policy.choose(adapter, condition, 2, CFG)
    # (a busy machine can time an impossible curve: it is timed again, its bar saying so)
    assert bars[0]["description"] == "timing window forwards 1, 2, 3, 4, 6, 8, 12, 16, 24, 32 for batch 2"
    assert re.fullmatch(r"timing the steps of \d+ decodings for batch 2", bars[-1]["description"])
    assert all(b["description"].startswith("timing window forwards") for b in bars[:-1])
    assert all(b["done"] == b["total"] > 0 for b in bars)  # each bar reached its end
    again = DecodingPolicy(cache=MeasurementCache("cost_curves", tmp_path), prior=PRIOR, tree_prior={},
                           progress=progress)
    shown = len(bars)
    again.choose(adapter, condition, 2, CFG)
    # read from the cache: only the probe that checks it shows (and, if the probe found it off, its measurements)
    assert bars[shown]["description"] == "checking the cached cost curve for batch 2"
    assert bars[shown]["done"] == bars[shown]["total"] == 4


def test_an_impossible_cached_curve_is_measured_again_and_a_measured_one_never_falls(tmp_path, adapter, pipe,
                                                                                    caplog):
    """A curve timed on a busy machine (window 2 at a tenth of window 1, as one was) is detected when read and
    measured again; what is measured is made non-decreasing in the window, so no wider window is predicted cheaper.
    Companion: a curve within the noise is read as it is."""
    import logging

    from mmspec.image.policy import consistent, monotone

    assert monotone({1: 1.0, 2: 0.5, 4: 1.5, 8: 1.2}) == {1: 1.0, 2: 1.0, 4: 1.5, 8: 1.5}
    assert consistent({1: 1.0, 2: 0.9, 4: 1.1}) and not consistent({1: 1.0, 2: 0.1, 4: 1.1})
    cache = MeasurementCache("cost_curves", tmp_path)
    poisoned = {1: 1.0, 2: 0.1, **{W: 1.0 + W / 10 for W in WINDOWS if W != 2}}
    put_curve(cache, adapter, poisoned, batch_size=2)
    policy = DecodingPolicy(cache=cache, prior=PRIOR, tree_prior={})
    condition = pipe.encode_prompt(["a red circle"] * 2)
    with caplog.at_level(logging.WARNING, logger="mmspec.image.policy"):
        curve, measured = policy.cost_curve(adapter, condition, 2, CFG)
    assert measured and "the cached cost curve for B=2 cfg is impossible" in caplog.text
    widths = sorted(curve)
    assert all(curve[a] <= curve[b] for a, b in zip(widths, widths[1:], strict=False))
    saved = MeasurementCache("cost_curves", tmp_path).get(model_fingerprint(adapter), device_fingerprint(
        torch.device("cpu")), "B=2 cfg")
    assert {int(W): s for W, s in saved.items()} == curve  # the remeasured curve replaced the poisoned one
    noisy = {1: 1.0, 2: 0.9, **{W: 1.0 + W / 10 for W in WINDOWS if W != 2}}  # 10 % cheaper: timing noise
    put_curve(cache, adapter, noisy, batch_size=2)
    assert trusting(cache, tree_prior={}).cost_curve(adapter, condition, 2, CFG) == (
        noisy, False)


def test_no_prediction_exceeds_the_candidate_s_tokens_per_forward(tmp_path, adapter, pipe):
    """Even from a curve whose wide windows time cheaper than AR's forward (the noise a busy machine makes, below
    the 20 % that marks a curve impossible), a candidate's iteration is priced at least as one AR step, so the
    predicted speedup stays at most its compression (the prior's tokens per forward at that window)."""
    cheap = {1: 1.0, **{W: 0.85 for W in WINDOWS}}  # every window 15 % cheaper than W = 1
    policy = policy_with_curve(tmp_path, adapter, cheap, batch_size=1)
    choice = policy.choose(adapter, pipe.encode_prompt(["a red circle"]), 1, CFG)
    assert choice.predicted_speedup <= max(PRIOR[1].values()) + 1e-9
