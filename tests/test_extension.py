"""Extending mmspec from one file. A new decoding method (a component and its step) and a new acceptance rule are
defined in this file only, registered by a fixture (and unregistered after it), and then reached through every front
end without touching the library: a pipeline call by object and by name, `save_pretrained` / `from_pretrained`, the
CLI (flags generated from the fields; a bad value exits 2 with one line before any model loads) and the stats table.
The method is lossless, so it passes the sequence-law test of SJD (`tests.image.test_jacobi_law`) and its mutation
companion is rejected by the same test; the rule is lossy, and its output law is enumerated in float64.

The method: SJD whose positions no window has reached yet are drafted by a fixed alternating rule, `period`
iterations copying the token to the left, then `period` iterations copying the token above. Any draft rule that
depends only on the past keeps SJD exact, because every draft is verified against the law it was drawn from.
The rule: accept a draft x ~ q with probability min(1, p(x)/q(x)) ** power (power < 1 accepts more), and draw the
exact residual at the first rejection; its distortion is its excess acceptance, which the stats report.

A text drafter is defined here too: `StickyDrafts`, whose drafts repeat the row's last token with probability
`stickiness` and are otherwise uniform over the vocabulary, reporting that law with each token. It reaches
`SpeculativeTextPipeline` (by object, by name, save / load), `mmspec text --method sticky --stickiness X`, the demo's
method list and `decoding="auto"`'s candidates; it passes the text sequence-law test (`tests.text.test_generate_law`),
and a companion that draws from one law but reports another is rejected by it.

And a model family: `PalettePipeline`, a tiny Llama whose last 16 vocabulary ids are the colours of a 4 x 4 grid,
with its adapter on `CausalLMImageAdapter`, registered with `register_image_pipeline`: `AutoARImagePipeline` and
`mmspec generate --model` load a saved one; it passes the family checks (greedy SJD equal to AR, the cache equal to a
fresh prefill after every iteration, with a skipped rollback as the companion that must be caught) and SJD's samples
follow the exact law of the first two tokens (a law without guidance rejected).

Outside a test, such code lives in a package of its own: an `mmspec.plugins` entry point (or the MMSPEC_PLUGINS
variable) makes the registry import it, which a new `mmspec` process is shown to do.
"""

import json
import shlex
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from mmspec import SJD, AcceptanceRule, Exact, setting
from mmspec.cli import main
from mmspec.core.drafts import Draft
from mmspec.core.registry import decodings, register_decoding, register_rule, rules, unregister
from mmspec.core.rng import sample
from mmspec.core.rules.exact import accept_probability, at_drafts, residual_law
from mmspec.core.verify import chain_outcome
from mmspec.image.jacobi import JacobiStep
from mmspec.image.methods.base import ImageDecoding
from mmspec.models.hf_image import CausalLMImageAdapter, PromptCondition
from mmspec.pipelines.ar_image import ARImagePipeline, left_padded
from mmspec.pipelines.auto import AutoARImagePipeline, register_image_pipeline, unregister_image_pipeline
from mmspec.pipelines.llamagen import LlamaGenPipeline
from mmspec.pipelines.text import SpeculativeTextPipeline
from mmspec.text.drafters import ChainDrafter
from mmspec.text.methods import TextDrafting
from mmspec.zoo import TEXT_TARGET, resolve_model
from tests.conftest import embedded_text_pipeline
from tests.image.test_jacobi_law import N, V, decode_rows, law_checks
from tests.models.family_checks import (
    check_cache_and_its_mutation,
    check_first_two_tokens_follow,
    check_greedy_sjd_equals_ar,
    exact_law_of_the_first_two_tokens,
)
from tests.models.family_checks import run as run_family
from tests.models.llamagen_tiny import tiny_pipeline
from tests.text import test_generate_law as text_law
from tests.text.table_lm import TableLM, random_table

PROMPTS = ["a red circle", "a blue square on the left"]
ALPHA = 1e-7  # the law test's threshold per check, as in tests.image.test_jacobi_law


@dataclass(frozen=True)
class AlternatingSJD(ImageDecoding):
    """SJD whose new drafts copy the token to the left for `period` iterations, then the token above for `period`
    iterations, and so on (exact with `Exact()`)."""

    name: ClassVar[str] = "alternating_sjd"
    window: int = setting(8, "tokens scored per target forward", low=2)
    period: int = setting(1, "iterations before the draft rule switches between left and above", low=1)
    acceptance: AcceptanceRule = Exact()

    @property
    def forward_width(self) -> int:
        return self.window

    def step(self, model, opening, sampling, generator, stats):
        return AlternatingStep(self, model, opening, sampling, generator, stats)


class AlternatingStep(JacobiStep):
    """SJD's step with the draft rule chosen before each iteration."""

    def __init__(self, decoding: AlternatingSJD, model, opening, sampling, generator, stats):
        super().__init__(SJD(window=decoding.window, acceptance=decoding.acceptance), model, opening, sampling,
                         generator, stats)
        self.period = decoding.period

    def rule(self) -> str:
        return ("horizontal", "vertical")[self.rows.step // self.period % 2]

    def __call__(self) -> None:
        self.init = self.rule()
        super().__call__()


@dataclass(frozen=True)
class Tempered(AcceptanceRule):
    """Accept x ~ q with min(1, p(x)/q(x)) ** power, else draw the exact residual (lossy for power < 1)."""

    name: ClassVar[str] = "tempered"
    modalities: ClassVar[tuple[str, ...]] = ("image",)
    lossless: ClassVar[bool] = False
    power: float = setting(0.5, "exponent on the exact acceptance probability (1 = the exact rule)", low=0, high=1,
                           low_open=True)

    def acceptance(self, p, q, drafts):
        return accept_probability(at_drafts(p, drafts), at_drafts(q, drafts)) ** self.power

    def residual(self, p, q):
        return residual_law(p, q)


class StickyDrafter(ChainDrafter):
    """Each draft token is the row's previous token with probability `stickiness`, else uniform; its law is reported
    with it (so `Exact()` keeps the target's law)."""

    def __init__(self, stickiness: float):
        self.stickiness = stickiness

    def start(self, rows, vocab_size, capacity):
        self.vocab_size = vocab_size

    def law(self, previous: torch.Tensor, dtype: torch.dtype, stickiness: float) -> torch.Tensor:
        """[B, V]: the law of a draft token after `previous` [B]."""
        uniform = torch.full((len(previous), self.vocab_size), (1 - stickiness) / self.vocab_size, dtype=dtype,
                             device=previous.device)
        return uniform.scatter_add_(1, previous[:, None], torch.full_like(uniform[:, :1], stickiness))

    def reported(self, previous: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.law(previous, dtype, self.stickiness)

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator):
        previous = rows.tokens.gather(1, (rows.lengths - 1)[:, None]).squeeze(1)
        tokens, laws = [], []
        for _ in range(width):  # a draft position at a time (the width is the draft length)
            laws.append(self.reported(previous, torch.float64))
            previous = sample(self.law(previous, torch.float64, self.stickiness), generator)
            tokens.append(previous)
        return Draft(tokens=torch.stack(tokens, 1), lengths=budget.clamp(max=width), q=torch.stack(laws, 1))


@dataclass(frozen=True)
class StickyDrafts(TextDrafting):
    """Drafts that repeat the last token with probability stickiness, else a uniform token (exact with Exact())."""

    name: ClassVar[str] = "sticky"
    stickiness: float = setting(0.5, "probability that a draft token repeats the one before it", low=0, high=1,
                                high_open=True)

    def make_drafter(self, target, draft=None):
        return StickyDrafter(self.stickiness)


CODES, CELL = 16, 4  # the palette family: 16 colours, each code a 4 x 4 pixel cell


class PaletteAdapter(CausalLMImageAdapter):
    """A Llama writing a grid of codes as its last CODES vocabulary ids; code c is the colour PALETTE[c]."""

    def __init__(self, model, height: int, width: int):
        self.model, self.language_model = model, model.model
        self.grid, self.vocab_size = (height, width), CODES
        self.offset = model.config.vocab_size - CODES

    def embed_image(self, tokens):
        return self.model.get_input_embeddings()(tokens + self.offset)

    def image_logits(self, hidden):
        return self.model.lm_head(hidden)[..., self.offset:].float()

    def unconditional(self, input_ids, mask):
        return input_ids[:, -1:], mask[:, -1:]

    def decode(self, tokens):
        cells = self.codebook()[tokens].view(-1, *self.grid, 3).permute(0, 3, 1, 2)
        return cells.repeat_interleave(CELL, 2).repeat_interleave(CELL, 3)

    def codebook(self):
        return torch.linspace(-1, 1, CODES * 3, dtype=torch.float64).view(3, CODES).T.contiguous()


class PalettePipeline(ARImagePipeline):
    """Text-to-image with a tiny Llama that writes a 4 x 4 grid of colours."""

    model_cpu_offload_seq = "model"

    def __init__(self, model, tokenizer, decoding="auto"):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__()
        self.register_modules(model=model, tokenizer=tokenizer)
        self.decoding = decoding
        self.image_processor = VaeImageProcessor(do_normalize=True)

    def image_adapter(self, height=None, width=None):
        height, width = height or 4 * CELL, width or 4 * CELL
        if height % CELL or width % CELL:
            raise ValueError(f"height and width must be multiples of {CELL} pixels, got {height} x {width}")
        return PaletteAdapter(self.model, height // CELL, width // CELL)

    def encode_prompt(self, prompts, negative_prompt, adapter):
        rows = [self.tokenizer(prompt)["input_ids"] for prompt in prompts]
        return PromptCondition(*left_padded(rows, self.tokenizer.pad_token_id, self._execution_device))


def palette_pipeline() -> PalettePipeline:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(TEXT_TARGET))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer) + CODES, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    pipe = PalettePipeline(LlamaForCausalLM(config).double().eval(), tokenizer, decoding="ar")
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_decoding(AlternatingSJD)
    register_rule(Tempered)
    register_decoding(StickyDrafts)
    register_image_pipeline(PalettePipeline)
    yield
    unregister(AlternatingSJD)
    unregister(Tempered)
    unregister(StickyDrafts)
    unregister_image_pipeline(PalettePipeline)


@pytest.fixture(scope="module")
def pipe():
    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def seeded(*seeds):
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def test_registered_beside_the_built_in_ones():
    assert decodings("image")["alternating_sjd"] is AlternatingSJD and rules("image")["tempered"] is Tempered
    assert "tempered" not in rules("text")  # a rule is offered to the modalities it names only


def test_a_pipeline_runs_them_by_object_and_by_name(pipe):
    decoding = AlternatingSJD(window=4, period=2)
    out = pipe(PROMPTS, decoding=decoding, generator=seeded(0, 1), output_type="latent")
    named = pipe(PROMPTS, decoding="alternating_sjd", window=4, period=2, generator=seeded(0, 1), output_type="latent")
    assert torch.equal(out.images, named.images) and out.stats.method == named.stats.method == decoding.describe()
    assert out.stats.target_forwards < 16 and out.stats.law == "lossless"
    greedy = pipe(PROMPTS, decoding=decoding, temperature=0, output_type="latent").images
    assert torch.equal(greedy, pipe(PROMPTS, decoding="ar", temperature=0, output_type="latent").images)

    tempered = pipe(PROMPTS, decoding="alternating_sjd", acceptance="tempered", tempered_power=0.3,
                    generator=seeded(0, 1), output_type="latent")
    assert tempered.stats.method == AlternatingSJD(acceptance=Tempered(power=0.3)).describe()
    assert tempered.stats.law == "lossy" and tempered.stats.excess_acceptance > 0
    by_sjd = pipe(PROMPTS, decoding="sjd", acceptance=Tempered(power=0.3), generator=seeded(0, 1), output_type="latent")
    assert by_sjd.stats.law == "lossy" and "Tempered(power=0.3)" in by_sjd.stats.method
    for row in ("excess_acceptance", "acceptance_rate", "target_forwards"):
        assert row in tempered.stats.table()
    with pytest.raises(ValueError, match="period must be >= 1, got 0"):
        pipe(PROMPTS, decoding="alternating_sjd", period=0)
    with pytest.raises(ValueError, match=r"power must be in \(0, 1\], got 2"):
        pipe(PROMPTS, decoding="alternating_sjd", acceptance="tempered", tempered_power=2)


def save_with(pipe, decoding, folder) -> None:
    """`pipe.save_pretrained(folder)` with `decoding` as its saved decoding (the pipeline's own is kept)."""
    before = pipe.decoding
    pipe.decoding = decoding
    try:
        pipe.save_pretrained(folder)
    finally:
        pipe.decoding = before


def test_save_and_load_keep_them(pipe, tmp_path):
    decoding = AlternatingSJD(window=4, period=3, acceptance=Tempered(power=0.7))
    save_with(pipe, decoding, tmp_path)
    saved = json.loads((tmp_path / "model_index.json").read_text())["decoding"]
    assert saved == {"name": "alternating_sjd", "window": 4, "period": 3,
                     "acceptance": {"name": "tempered", "power": 0.7}}
    loaded = LlamaGenPipeline.from_pretrained(tmp_path, dtype=torch.float64)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.decoding == decoding
    expected = pipe(PROMPTS, decoding=decoding, generator=seeded(4, 5), output_type="latent").images
    assert torch.equal(loaded(PROMPTS, generator=seeded(4, 5), output_type="latent").images, expected)


@pytest.fixture(scope="module")
def saved_model(pipe, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny_llamagen")
    pipe.save_pretrained(folder)
    return str(folder)


def test_the_cli_generates_their_flags_and_prints_the_stats_table(saved_model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    helped = capsys.readouterr().out
    assert "alternating_sjd" in helped and "--period" in helped and "--tempered-power" in helped
    out = tmp_path / "x.png"
    command = (f"generate 'a red circle' --model {saved_model} --decoding alternating_sjd --window 4 --period 2 "
               f"--acceptance tempered --tempered-power 0.5 --out {out} --no-compare")
    assert main(shlex.split(command)) == 0
    printed = capsys.readouterr().out
    assert "AlternatingSJD(window=4, period=2, acceptance=Tempered(power=0.5))" in printed
    assert "excess_acceptance" in printed and "acceptance_rate" in printed and out.is_file()


@pytest.mark.parametrize(("flags", "message"), [
    ("--decoding alternating_sjd --period 0", "--period must be >= 1, got 0"),
    ("--decoding alternating_sjd --window 1", "--window must be >= 2, got 1"),
    ("--decoding alternating_sjd --acceptance tempered --tempered-power 1.5",
     "--tempered-power must be in (0, 1], got 1.5"),
    ("--decoding sjd --period 2", "--period applies to --decoding alternating_sjd only"),
    ("--decoding alternating_sjd --tempered-power 0.5", "--tempered-power applies to --acceptance tempered only"),
])
def test_a_bad_value_exits_2_in_one_line_before_any_model_loads(flags, message, tmp_path, capsys, monkeypatch):
    import mmspec.pipelines.auto

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(mmspec.pipelines.auto, "image_pipeline_from_arguments", load)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "--out", str(tmp_path / "x.png"), *shlex.split(flags)])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    assert captured.err == f"mmspec generate: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


# --- the text drafter -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_pipe():
    return embedded_text_pipeline()


TEXT_PROMPTS = ["def f(x):\n", "import os\n"]


def test_a_text_pipeline_runs_the_drafter_by_object_and_by_name(text_pipe):
    decoding = StickyDrafts(stickiness=0.9, draft_length=3)
    assert "sticky" in text_pipe.methods and decodings("text")["sticky"] is StickyDrafts
    out = text_pipe(TEXT_PROMPTS, decoding=decoding, max_new_tokens=12, temperature=1.0,
                    generator=torch.Generator().manual_seed(0))
    named = text_pipe(TEXT_PROMPTS, decoding="sticky", stickiness=0.9, draft_length=3, max_new_tokens=12,
                      temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert out.texts == named.texts and out.stats.method == named.stats.method == decoding.describe()
    assert out.stats.drafted > 0 and out.stats.law == "lossless"
    greedy = text_pipe(TEXT_PROMPTS, decoding=decoding, max_new_tokens=12)
    assert greedy.texts == text_pipe(TEXT_PROMPTS, decoding="ar", max_new_tokens=12).texts
    with pytest.raises(ValueError, match=r"stickiness must be in \[0, 1\), got 1"):
        text_pipe(TEXT_PROMPTS, decoding="sticky", stickiness=1.0)


def test_auto_and_the_demo_offer_the_drafter(text_pipe):
    from mmspec.apps.tabs.text import TextTab

    candidates = text_pipe.auto_candidates({})
    assert candidates["sticky"] == StickyDrafts() and "model" in candidates
    assert text_pipe.auto_candidates({"draft_length": 2})["sticky"] == StickyDrafts(draft_length=2)
    assert "sticky" not in text_pipe.auto_candidates({"max_ngram": 2})  # a setting it does not read
    labels = dict((value, label) for label, value in TextTab(text_pipe).methods)
    assert labels["sticky"] == f"sticky: {StickyDrafts.__doc__.split('. ')[0]}"


def test_a_text_pipeline_saves_and_loads_the_drafter(text_pipe, tmp_path):
    decoding = StickyDrafts(stickiness=0.25, draft_length=2)
    save_with(text_pipe, decoding, tmp_path)
    loaded = SpeculativeTextPipeline.from_pretrained(tmp_path)
    assert loaded.decoding == decoding


def test_mmspec_text_takes_the_drafter_and_its_flag(capsys):
    with pytest.raises(SystemExit):
        main(["text", "--help"])
    helped = capsys.readouterr().out
    assert "sticky" in helped and "--stickiness" in helped
    assert main(["text", "def f(x):\n", "--method", "sticky", "--stickiness", "0.8", "--max-new-tokens", "8",
                 "--no-compare"]) == 0
    described = "StickyDrafts(draft_length=4, schedule='constant', acceptance=Exact(), stickiness=0.8)"
    assert described in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["text", "x", "--method", "ngram", "--stickiness", "0.5"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "mmspec text: error: --stickiness applies to --method sticky (or auto) only\n"


def test_bench_text_times_the_drafter(text_pipe):
    from mmspec.eval.bench_text import load_heads, make_methods

    heads = load_heads(TEXT_TARGET, text_pipe.target)
    methods = make_methods(text_pipe.target, text_pipe.draft, text_pipe.tokenizer, 8, {}, heads, {})
    encoded = text_pipe.tokenizer(["def f(x):\n"], return_tensors="pt")
    sequences, stats = methods["ours_sticky"](encoded, 1.0, 0)
    assert sequences.shape[1] == encoded["input_ids"].shape[1] + 8 and stats.drafted > 0


class MislabelledStickyDrafter(StickyDrafter):
    """Mutation companion: draws sticky tokens but reports the uniform law."""

    def reported(self, previous, dtype):
        return self.law(previous, dtype, 0.0)


@pytest.mark.parametrize(("drafter", "draft_length", "temperature", "top_k"), [
    (StickyDrafter(0.5), 3, 1.0, 0), (StickyDrafter(0.8), 2, 0.7, 3)])
def test_the_text_drafter_keeps_the_target_s_law(drafter, draft_length, temperature, top_k):
    p_value, stats = text_law.law_test(TableLM(random_table(text_law.V, 0)), drafter, temperature, top_k,
                              draft_length=draft_length)
    assert p_value > text_law.ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted


def test_the_text_drafter_s_mutation_companion_is_rejected():
    target = TableLM(random_table(text_law.V, 0))
    p_value, _ = text_law.law_test(target, MislabelledStickyDrafter(0.8), 1.0, 0, rows=text_law.MUTATION_ROWS,
                                   draft_length=3)
    assert p_value < text_law.ALPHA, f"a drafter reporting the wrong law was not detected (p = {p_value:.2e})"


# --- a plugin ---------------------------------------------------------------------------------------------------------
PLUGIN = '''"""A text drafter from outside mmspec: it drafts the row's last token again."""
from dataclasses import dataclass
from typing import ClassVar

from mmspec import register_decoding
from mmspec.core.drafts import Draft
from mmspec.text.drafters import ChainDrafter
from mmspec.text.methods import TextDrafting


class EchoDrafter(ChainDrafter):
    def propose(self, rows, budget, width, sampling, generator):
        last = rows.tokens.gather(1, (rows.lengths - 1)[:, None])
        return Draft(tokens=last.expand(-1, width), lengths=budget.clamp(max=width))


@register_decoding
@dataclass(frozen=True)
class Echo(TextDrafting):
    """Drafts that repeat the last token."""

    name: ClassVar[str] = "echo"

    def make_drafter(self, target, draft=None):
        return EchoDrafter()
'''


@pytest.mark.slow  # three new processes: the slow tier
def test_an_installed_plugin_reaches_the_command_line(tmp_path):
    """A package declaring an `mmspec.plugins` entry point (here a module and its dist-info on PYTHONPATH, as pip
    would install them) is imported by the registry: `mmspec text --method echo` runs its drafter in a new process.
    The same module named in MMSPEC_PLUGINS is listed by --help; a plugin that cannot be imported is one line,
    exit 2."""
    import os
    import subprocess
    import sys

    (tmp_path / "echo_plugin.py").write_text(PLUGIN)
    info = tmp_path / "echo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mmspec.plugins]\necho = echo_plugin\n")

    def mmspec(*args, path=tmp_path, plugins=""):
        env = {**os.environ, "PYTHONPATH": str(path), "MMSPEC_PLUGINS": plugins}
        return subprocess.run([sys.executable, "-m", "mmspec.cli", *args], capture_output=True, text=True, env=env,
                              timeout=300)

    run = mmspec("text", "def f(x):\n", "--method", "echo", "--max-new-tokens", "6", "--no-compare")
    assert run.returncode == 0, run.stderr
    assert "Echo(draft_length=4, schedule='constant', acceptance=Exact())" in run.stdout
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "echo_by_name.py").write_text(PLUGIN)
    helped = mmspec("text", "--help", path=bare, plugins="echo_by_name")
    assert helped.returncode == 0 and "'echo': Drafts that repeat the last token" in " ".join(helped.stdout.split())
    assert "'echo'" not in mmspec("text", "--help", path=bare).stdout  # not installed, not named: not there
    broken = mmspec("text", "--help", path=bare, plugins="no_such_plugin")
    assert broken.returncode == 2 and broken.stdout == ""
    assert broken.stderr == ("mmspec: error: mmspec plugin 'no_such_plugin' (MMSPEC_PLUGINS) failed to import: No "
                             "module named 'no_such_plugin'\n")
    # a plugin's image family: AutoARImagePipeline finds it in a new process
    (bare / "family_plugin.py").write_text("from mmspec import register_image_pipeline\n"
                                           "from mmspec.pipelines.ar_image import ARImagePipeline\n\n\n"
                                           "@register_image_pipeline\nclass PluggedPipeline(ARImagePipeline):\n"
                                           "    pass\n")
    (bare / "saved").mkdir()
    (bare / "saved" / "model_index.json").write_text('{"_class_name": "PluggedPipeline"}')
    env = {**os.environ, "PYTHONPATH": str(bare), "MMSPEC_PLUGINS": "family_plugin"}
    found = subprocess.run([sys.executable, "-c", "from mmspec.pipelines.auto import pipeline_class_for; "
                            f"print(pipeline_class_for({str(bare / 'saved')!r}).__name__)"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert found.returncode == 0 and found.stdout == "PluggedPipeline\n", found.stderr


# --- the model family -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def palette_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("palette")
    palette_pipeline().save_pretrained(folder)
    return str(folder)


def test_auto_and_the_cli_load_the_family(palette_folder, tmp_path, capsys):
    pipe = AutoARImagePipeline.from_pretrained(palette_folder, dtype=torch.float64)
    assert type(pipe) is PalettePipeline
    out = pipe(["a red circle", "a blue square"], decoding="sjd", window=3, guidance_scale=2.0,
               generator=seeded(0, 1))
    assert out.images[0].size == (16, 16) and out.stats.target_forwards < 16
    greedy = pipe("a red circle", decoding="sjd", window=3, temperature=0, output_type="latent").images
    assert torch.equal(greedy, pipe("a red circle", decoding="ar", temperature=0, output_type="latent").images)
    image = tmp_path / "palette.png"
    assert main(["generate", "a red circle", "--model", palette_folder, "--decoding", "sjd", "--window", "3",
                 "--out", str(image), "--no-compare"]) == 0
    assert image.is_file() and "SJD(window=3" in capsys.readouterr().out


@pytest.fixture(scope="module")
def palette():
    pipe = palette_pipeline()
    ids = [pipe.tokenizer(text)["input_ids"] for text in ("a red circle", "two small blue squares", "x")]
    adapter = pipe.image_adapter()
    return adapter, PromptCondition(*left_padded(ids, pipe.tokenizer.pad_token_id, torch.device("cpu")))


def test_the_family_passes_the_family_checks(palette):
    adapter, condition = palette
    check_greedy_sjd_equals_ar(adapter, condition, 3.0)
    check_cache_and_its_mutation(adapter, condition)  # its companion: a skipped rollback must be caught


def test_sjd_on_the_family_samples_the_exact_law_of_the_first_tokens(palette):
    from mmspec.core.probs import SamplingConfig

    adapter, condition = palette
    one = PromptCondition(condition.input_ids[:1], condition.attention_mask[:1])
    sampling = SamplingConfig(1.0, top_k=6, guidance_scale=2.0)
    law = exact_law_of_the_first_two_tokens(adapter, one, sampling)
    unguided = exact_law_of_the_first_two_tokens(adapter, one, SamplingConfig(1.0, top_k=6))
    rows = 2000
    many = PromptCondition(one.input_ids.expand(rows, -1), one.attention_mask.expand(rows, -1))
    tokens, _ = run_family(SJD(window=3), adapter, many, sampling, torch.Generator().manual_seed(0))
    check_first_two_tokens_follow(law, tokens, CODES, wrong_law=unguided)


# --- exactness ------------------------------------------------------------------------------------------------------
class SkipsVerification(AlternatingSJD):
    """Mutation companion: on the iterations that copy the token above, every draft is accepted unverified."""

    def step(self, model, opening, sampling, generator, stats):
        return UnverifiedStep(self, model, opening, sampling, generator, stats)


class AcceptEverything:
    distorts = False

    def acceptance(self, p, q, drafts):
        return torch.ones(drafts.shape, dtype=p.dtype)

    def residual(self, p, q):
        return p


class UnverifiedStep(AlternatingStep):
    def __call__(self) -> None:
        self.test = AcceptEverything() if self.rule() == "vertical" else None
        super().__call__()


@pytest.mark.parametrize(("window", "period"), [(2, 1), (3, 2), (N + 1, 1)])
def test_the_new_method_keeps_the_model_s_law(window, period):
    tokens, stats, model = decode_rows(AlternatingSJD(window=window, period=period), groups=12_000)
    failed = {name: p for name, p in law_checks(tokens, model).items() if p < ALPHA}
    assert not failed, f"output law differs from AR sampling's: {failed}"
    assert stats.accepted > 0  # it speculated


def test_its_mutation_companion_is_rejected():
    tokens, _, model = decode_rows(SkipsVerification(window=3, period=1), groups=12_000)
    assert min(law_checks(tokens, model).values()) < ALPHA


@pytest.mark.parametrize("power", [1.0, 0.6, 0.25])
def test_the_new_rule_s_output_law_enumerated(power):
    """One draft position, float64: the output law of `chain_outcome` under the rule, enumerated over the draft token
    and the accept / reject branch, is p at power 1 and otherwise off p by a total variation equal to the rule's
    excess acceptance over the exact rule (sum over x of q(x) (a(x) - min(1, p(x)/q(x))))."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, 2, V, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(1, 1, V, generator=g, dtype=torch.float64) * 2, -1)
    rule = Tempered(power=power)
    law = torch.zeros(V, dtype=torch.float64)
    excess = 0.0
    for x in range(V):
        draft = Draft(torch.tensor([[x]]), torch.tensor([1]), q)
        accept = float(rule.acceptance(p[:, :1], q, draft.tokens))
        rejected = chain_outcome(p, draft, torch.ones(1, 1), rule)  # u = 1: the rejection branch
        assert bool(rejected.rejected) and float(rejected.excess_acceptance) == pytest.approx(accept - float(
            accept_probability(p[0, 0, x], q[0, 0, x])))
        law[x] += q[0, 0, x] * accept
        law += q[0, 0, x] * (1 - accept) * rejected.next_law[0]
        excess += float(q[0, 0, x]) * float(rejected.excess_acceptance)
    total_variation = float((law - p[0, 0]).abs().sum()) / 2
    assert law.sum() == pytest.approx(1, abs=1e-12)
    assert total_variation == pytest.approx(excess, abs=1e-12)
    assert (total_variation < 1e-12) == (power == 1.0)


def test_nothing_else_in_the_repository_names_them():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    here = Path(__file__).resolve()
    named = [path for folder in ("mmspec", "pipelines", "apps", "eval", "tests", "docs")
             for path in (root / folder).rglob("*") if path.suffix in (".py", ".md") and path.resolve() != here
             and any(word in path.read_text() for word in ("AlternatingSJD", "alternating_sjd", "Tempered(",
                                                       "StickyDrafts", "--stickiness", "PalettePipeline"))]
    assert named == []
