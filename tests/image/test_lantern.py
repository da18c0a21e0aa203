"""Relaxed acceptance (LANTERN, GSD) in the image decodings: LANTERN's codebook neighbour table (invariants vs brute
force, chunking, int16, disk cache keyed by the codebook hash, official LlamaGen VQ layout), GSD's codebook geometry
in token space, the lossless limit of both decodings for both rules (bit-identical to exact acceptance), the
sequence-level distortion against the reported extra acceptance, and clear errors."""

import pytest
import torch

from mmspec.core.codebook import NeighbourTable, codebook_hash, nearest_codes, token_embeddings
from mmspec.core.probs import SamplingConfig
from mmspec.core.rules import GSD, Exact, Lantern, Typical
from mmspec.core.stats import SpecStats
from mmspec.image import SJD, DraftModel, get_decoding
from mmspec.models.llamagen.adapter import LlamaGenAdapter
from mmspec.models.llamagen.vq import LlamaGenVQModel
from tests.image.table_model import TableImageModel
from tests.image.test_jacobi_law import FORCED, GRID, GROUP, SAMPLING, N, V, encode
from tests.models.llamagen_tiny import tiny_transformer, tiny_vq
from tests.models.test_llamagen import save_official


def random_codebook(C, d=2, seed=0):
    return torch.randn(C, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("C,k_max,chunk", [(40, 39, 7), (300, 16, 64), (300, 16, 1024)])
def test_table_invariants_against_brute_force(C, k_max, chunk):
    codebook = random_codebook(C)
    table = nearest_codes(codebook, k_max, chunk_rows=chunk)
    assert table.dtype == torch.int16 and table.shape == (C, k_max)
    distance = torch.cdist(codebook, codebook)
    rows = torch.arange(C)[:, None]
    assert (table.long() != rows).all()  # self excluded
    assert all(len(set(row.tolist())) == k_max for row in table)  # no duplicates
    found = distance[rows, table.long()]
    assert (found[:, 1:] >= found[:, :-1]).all()  # nearest first
    expected = distance.masked_fill(torch.eye(C, dtype=torch.bool), torch.inf).sort(-1).values[:, :k_max]
    assert torch.allclose(found, expected)  # the k_max nearest distances (ties may pick other codes)


def test_large_codebook_is_chunked_and_int16():
    codebook = random_codebook(16384, d=8, seed=1)
    table = nearest_codes(codebook, 8)
    assert table.dtype == torch.int16 and table.shape == (16384, 8)
    rows = torch.tensor([0, 9000, 16383])
    brute = torch.cdist(codebook[rows], codebook)
    brute[torch.arange(3), rows] = torch.inf
    assert torch.allclose(brute.gather(1, table[rows].long()), brute.topk(8, largest=False).values)


def test_table_cache_is_keyed_by_the_codebook(tmp_path):
    codebook = random_codebook(64)
    built = NeighbourTable.build(codebook, 20, cache=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1 and built.codebook_hash == codebook_hash(codebook)
    narrower = NeighbourTable.build(codebook, 5, cache=tmp_path)  # served from the wider cached table
    assert torch.equal(narrower.indices, built.indices[:, :5])
    other = random_codebook(64, seed=2)
    assert not torch.equal(NeighbourTable.build(other, 5, cache=tmp_path).indices, narrower.indices)
    assert len(list(tmp_path.iterdir())) == 2
    with pytest.raises(ValueError, match="built for another codebook"):
        built.check(other)


def test_table_uses_the_quantizer_geometry(tmp_path):
    vq = tiny_vq(vocab_size=32, dtype=torch.float32)
    with torch.no_grad():
        vq.quantize.embedding.weight.mul_(torch.linspace(0.1, 10, 32)[:, None])  # norms differ: raw L2 != cosine
    adapter = LlamaGenAdapter(tiny_transformer(vocab_size=32, dtype=torch.float32), vq)
    normalised = torch.nn.functional.normalize(vq.quantize.embedding.weight, dim=-1)
    assert torch.equal(adapter.codebook(), normalised)
    table = NeighbourTable.build(adapter.codebook(), 8, cache=False)
    assert torch.equal(table.indices, nearest_codes(normalised, 8))
    assert not torch.equal(table.indices, nearest_codes(vq.quantize.embedding.weight, 8))


def test_official_llamagen_vq_checkpoint_gets_a_table(tmp_path):
    vq = tiny_vq(vocab_size=32, dtype=torch.float32)
    save_official(tmp_path / "vq.pt", vq.state_dict())
    loaded = LlamaGenVQModel.from_llamagen_checkpoint(tmp_path / "vq.pt", ch=32, ch_mult=(1, 1), num_res_blocks=1,
                                                      z_channels=32)
    adapter = LlamaGenAdapter(tiny_transformer(vocab_size=32, dtype=torch.float32), loaded)
    table = NeighbourTable.build(adapter.codebook(), 31, cache=False)
    table.check(LlamaGenAdapter(tiny_transformer(vocab_size=32, dtype=torch.float32), vq).codebook())


def test_token_space_marks_non_code_tokens():
    table = NeighbourTable.build(random_codebook(6), 3, cache=False)
    token_ids = torch.tensor([4, 5, 6, 7, 8, 9])  # codes live at ids 4..9; ids 0..3 are special tokens
    neighbours = table.in_token_space(10, token_ids)
    assert (neighbours[:4] == -1).all()
    assert torch.equal(neighbours[4:], table.indices.long() + 4)
    with pytest.raises(ValueError, match="codebook_token_ids"):
        table.in_token_space(10)


class CodebookTableModel(TableImageModel):
    """The law-test table model with a 2-D codebook over its V image tokens (LANTERN needs one)."""

    def codebook(self):
        return random_codebook(self.vocab_size, seed=3)


def run(decoding, rows=3000, seed=0, sampling=SAMPLING):
    model = CodebookTableModel(GRID, V, forced_tokens=FORCED)
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding.run(model, GROUP.repeat(rows // 3), sampling, torch.Generator().manual_seed(seed), stats)
    return last.tokens, stats, model


def drafter():
    return TableImageModel(GRID, V, forced_tokens=FORCED, seed=1, scale=1.0)


def decodings(acceptance=Exact()):
    return [SJD(3, "horizontal", "maximal", acceptance), SJD(N, "random", "none", acceptance),
            DraftModel(2, acceptance, drafter=drafter())]


@pytest.mark.parametrize("limit", [Lantern(k=0, delta=0.5), Lantern(k=3, delta=0.0), Lantern(k=3, lam=1.0),
                                   GSD(group_size=1, p_threshold=1.0, d_threshold=2.0)], ids=str)
def test_lossless_limit_is_bit_identical_to_exact_acceptance(limit):
    for exact, relaxed in zip(decodings(), decodings(limit), strict=True):
        tokens, stats, _ = run(relaxed)
        assert torch.equal(tokens, run(exact)[0])
        assert stats.excess_acceptance == 0 and not relaxed.lossless


def empirical_tv(tokens, law, prompt_rows):
    counts = torch.bincount(encode(tokens[prompt_rows]), minlength=V**N).double()
    return 0.5 * (counts / counts.sum() - law).abs().sum().item()


@pytest.mark.parametrize("index", [0, 2], ids=["sjd", "draft"])
@pytest.mark.parametrize("rule", [Lantern(k=3, delta=0.3), GSD(group_size=5, p_threshold=1.0, d_threshold=2.0)],
                         ids=["lantern", "gsd"])
def test_relaxed_decoding_distortion_is_what_it_reports(index, rule):
    rows = 60_000
    prompt_rows = GROUP.repeat(rows // 3) == 1
    law = CodebookTableModel(GRID, V, forced_tokens=FORCED).exact_law(1, SAMPLING)
    exact_tokens, exact_stats, _ = run(decodings()[index], rows)
    tokens, stats, _ = run(decodings(rule)[index], rows)
    noise = empirical_tv(exact_tokens, law, prompt_rows)  # what sampling noise alone gives at this size
    distortion = empirical_tv(tokens, law, prompt_rows)
    assert stats.acceptance_rate > exact_stats.acceptance_rate
    assert distortion > noise + 0.02  # visibly lossy ...
    assert 0 < stats.excess_acceptance < 1
    if isinstance(rule, Lantern):  # ... and, with LANTERN's G* residual, within the summed per-position TV it reports
        assert distortion <= stats.excess_per_sample + noise + 0.02


def test_gsd_geometry_in_token_space():
    codebook = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    vectors = token_embeddings(codebook, 5, torch.tensor([4, 1, 2]))  # codes sit at tokens 4, 1, 2
    assert vectors[0].abs().sum() == 0 and vectors[3].abs().sum() == 0  # tokens that are not codes
    assert torch.allclose(vectors[4], torch.tensor([1.0, 0.0])) and torch.allclose(vectors[1], torch.tensor([0.0, 1.0]))
    assert torch.allclose(vectors.norm(dim=-1)[[1, 2, 4]], torch.ones(3))
    with pytest.raises(ValueError, match="codebook_token_ids"):
        token_embeddings(codebook, 5)


def test_acceptance_setting_errors():
    with pytest.raises(ValueError, match="only apply to acceptance='lantern'"):
        get_decoding("sjd", acceptance="exact", lantern_delta=0.1)
    with pytest.raises(ValueError, match="acceptance must be one of"):
        DraftModel(drafter=drafter(), acceptance="relaxed")
    with pytest.raises(ValueError, match="does not apply to image decoding"):
        SJD(acceptance=Typical())
    with pytest.raises(ValueError, match="delta must be in"):
        SJD(acceptance=Lantern(delta=2.0))
    with pytest.raises(ValueError, match="lam must be >= 1"):
        get_decoding("sjd", acceptance="lantern", lantern_lam=0.5)
    with pytest.raises(ValueError, match="k must be >= 0"):
        Lantern(k=-1)
    assert Lantern().budget == (0.1, None)


def test_decoding_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"k must be in \[0, V - 1\] = \[0, 3\]"):
        run(SJD(3, acceptance=Lantern(k=4)), rows=3)
    with pytest.raises(TypeError, match="needs a model with a VQ codebook"):
        DraftModel(drafter=drafter(), acceptance="lantern").run(
            TableImageModel(GRID, V), GROUP, SAMPLING, None, SpecStats()).__next__()
    with pytest.raises(ValueError, match="temperature=0"):
        run(SJD(3, acceptance="lantern"), rows=3, sampling=SamplingConfig(temperature=0))
    for decoding in (SJD(3, acceptance=Lantern(k=4)), DraftModel(drafter=drafter(), acceptance=Lantern(k=4))):
        stats = SpecStats()  # a bad setting costs no forward: it is refused before the prefill
        with pytest.raises(ValueError, match="k must be in"):
            next(decoding.run(CodebookTableModel(GRID, V), GROUP, SAMPLING, None, stats))
        assert stats.target_forwards == stats.draft_forwards == 0
    with pytest.raises(ValueError, match="needs a draft model"):
        run(DraftModel(), rows=3)
    with pytest.raises(ValueError, match="share the target's image tokens"):
        run(DraftModel(drafter=TableImageModel((2, 2), V)), rows=3)
