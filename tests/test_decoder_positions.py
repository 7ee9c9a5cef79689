"""``DecoderConfig.positions``: RoPE, the 2017 sinusoidal table, a learned table or nothing,
each surviving ``.to()`` and cached decoding, each visible in what the model computes."""
from __future__ import annotations

import pytest
import torch

from transformer_lib.decoder import POSITIONS, Decoder, DecoderConfig
from transformer_lib.positional import sinusoidal_encoding

from conftest import randomize_


def model_with(positions: str, n_layers: int = 2, dtype=torch.float64) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=32, d_model=32, n_layers=n_layers, n_heads=4,
                           n_kv_heads=2, d_ff=48, max_seq_len=24, positions=positions)
    return randomize_(Decoder(config), std=0.3).to(dtype).eval()


@pytest.mark.equality
@pytest.mark.parametrize("positions", POSITIONS)
def test_cached_decoding_matches_the_full_forward(positions, ledger):
    """The position of a cached token is cache.pos + i, for every kind of position."""
    model = model_with(positions)
    tokens = torch.randint(0, 32, (2, 20))
    full = model(tokens)  # (B, 20, V)
    cache = model.new_cache(2)
    pieces = [model(tokens[:, :7], cache), model(tokens[:, 7:11], cache)]
    pieces += [model(tokens[:, i:i + 1], cache) for i in range(11, 20)]
    ledger.check(f"logits decoded with the cache, {positions} positions", "the full forward pass",
                 torch.cat(pieces, dim=1), full, tol=1e-12)


@pytest.mark.parametrize("positions, order_matters", [
    ("rope", True), ("sinusoidal", True), ("learned", True), ("none", False)])
def test_only_a_model_without_positions_ignores_the_order_of_the_prefix(positions,
                                                                         order_matters):
    """One causal layer with no positions sees the prefix as a set: the last position's
    logits do not change when the earlier tokens are shuffled."""
    model = model_with(positions, n_layers=1)
    tokens = torch.randint(0, 32, (1, 12))
    shuffled = torch.cat([tokens[:, :11].flip(1), tokens[:, 11:]], dim=1)
    change = (model(tokens)[:, -1] - model(shuffled)[:, -1]).abs().max().item()
    assert (change > 1e-3) if order_matters else (change < 1e-12)


@pytest.mark.equality
def test_sinusoidal_model_adds_the_2017_table_to_the_embeddings(ledger):
    with_table, without = model_with("sinusoidal"), model_with("none")
    without.load_state_dict(with_table.state_dict())
    table = sinusoidal_encoding(24, 32).double()  # (max_seq_len, C)
    tokens = torch.randint(0, 32, (2, 10))
    without.embed_tokens.register_forward_hook(
        lambda module, args, out: out + table[: out.shape[1]])  # (B, T, C) + (T, C)
    ledger.check("logits with sinusoidal positions",
                 "a model without positions, the 2017 table added to its embeddings",
                 with_table(tokens), without(tokens), tol=1e-12)


@pytest.mark.parametrize("convert", [lambda m: m.float(), lambda m: m.to(torch.float64),
                                     lambda m: m.half().float()])
def test_fixed_tables_survive_dtype_moves(convert):
    """A table written over by hand would come back on .to(); a config choice stays."""
    sin_model = convert(model_with("sinusoidal"))
    assert sin_model.position_table.dtype == sin_model.embed_tokens.weight.dtype
    assert torch.allclose(sin_model.position_table.double(),
                          sinusoidal_encoding(24, 32).double(), atol=1e-6)
    for positions in ("sinusoidal", "learned", "none"):
        model = convert(model_with(positions))
        assert not hasattr(model, "rope_cos") and not hasattr(model, "rope_sin")


def test_learned_table_is_a_parameter_and_fixed_tables_are_not_saved():
    assert "embed_positions.weight" in model_with("learned").state_dict()
    assert model_with("learned").embed_positions.weight.shape == (24, 32)
    for positions in ("rope", "sinusoidal", "none"):
        names = model_with(positions).state_dict()
        assert not any("position" in name or "rope" in name for name in names)


def test_learned_table_has_no_row_past_max_seq_len():
    model = model_with("learned")
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 25, dtype=torch.long))


def test_unknown_positions_and_odd_width_are_rejected():
    with pytest.raises(ValueError, match="alibi"):
        DecoderConfig(positions="alibi")
    with pytest.raises(ValueError, match="even d_model"):
        DecoderConfig(d_model=15, n_heads=5, n_kv_heads=5, positions="sinusoidal")
    DecoderConfig(d_model=30, n_heads=10, n_kv_heads=5, positions="none")  # odd D: fine
