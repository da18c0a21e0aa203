import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# what mmspec measures once per machine (cost curves, method timings, LANTERN tables) starts empty, as on a fresh
# machine, and never lands in the user's cache; subprocesses of the tests inherit it
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # under pytest-xdist (tests/run.sh): this process's name, "gw0", ...
if "MMSPEC_CACHE_DIR" not in os.environ or WORKER:  # a worker gets its own, not the controller's
    os.environ["MMSPEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="mmspec-test-cache-")
    atexit.register(shutil.rmtree, os.environ["MMSPEC_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402  (imported once the cache folder is set)
import torch  # noqa: E402

MEASURED = "measured"  # the user property that carries a figure a test measured, printed at the end of the run

if WORKER:  # the workers share the cores: one torch thread per core each, not every core each
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def tiny_llama(vocab_size: int = 48, hidden_size: int = 32, num_layers: int = 2, seed: int = 0, dtype=torch.float64,
               num_heads: int = 4):
    """A random tiny `LlamaForCausalLM` built in code (no hub), float64 by default so greedy ties cannot flip."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def embedded_text_pipeline():
    """The embedded text pair as a `SpeculativeTextPipeline`, progress bars off."""
    from mmspec.pipelines.text import SpeculativeTextPipeline
    from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET

    pipe = SpeculativeTextPipeline.from_pretrained(TEXT_TARGET, draft=TEXT_DRAFT)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def tiny_target():
    return tiny_llama(num_layers=3, seed=0)


@pytest.fixture
def tiny_draft():
    return tiny_llama(num_layers=1, hidden_size=16, seed=1)


@pytest.fixture(scope="session")
def small_image_model(tmp_path_factory) -> str:
    """A saved text-to-image pipeline folder: the embedded `shapes` pipeline with its trained 2-layer draft transformer
    as the target (and the draft). Same tokenizer, text encoder, VQ codebook and 16 x 16 grid, a third of the compute:
    for tests of the product around a model (the demo, the eval scripts), not of the model's quality."""
    from mmspec.pipelines.auto import AutoARImagePipeline

    pipe = AutoARImagePipeline.from_pretrained("shapes", dtype=torch.float32)
    # the embedded draft heads read the 256-wide transformer's features: this pipeline has none
    small = type(pipe)(**{**pipe.components, "transformer": pipe.draft_transformer, "eagle_head": None,
                          "hydra_head": None})
    folder = tmp_path_factory.mktemp("small_image_model")
    small.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def report(request):
    """`report(line)`: a figure this test measured (timings, memory, acceptance); the run prints them all at its end,
    also from pytest-xdist workers, whose own output is not shown."""
    return lambda line: request.node.user_properties.append((MEASURED, line))


def pytest_terminal_summary(terminalreporter):
    calls = [r for reports in terminalreporter.stats.values() for r in reports if getattr(r, "when", None) == "call"]
    lines = [value for r in calls for name, value in getattr(r, "user_properties", ()) if name == MEASURED]
    if lines:
        terminalreporter.section("measured in this run")
        for line in lines:
            terminalreporter.write_line(line)
