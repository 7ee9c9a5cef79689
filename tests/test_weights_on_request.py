"""Attention weights and MoE routing are kept only when asked for: ``keep_weights=True`` on a
layer, or ``with record_weights(model):``. Otherwise a model holds no ``(B, H, T, S)`` tensor
after a forward pass. Also ``eval_mode``, the other switch of ``transformer_lib.recording``."""
import gc

import pytest
import torch
import torch.nn as nn

from transformer_lib import attention
from transformer_lib.attention import MultiHeadAttention
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_lib.recording import eval_mode, record_weights
from transformer_lib.variants.moe import MoEFeedForward

ASK = r"keep_weights=True.*with record_weights\(model\)"  # what the error says to do


def held_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor the modules of ``model`` refer to: attributes, and the members of dicts,
    lists and tuples among them (parameters and buffers included)."""
    found, stack = [], [value for m in model.modules() for value in vars(m).values()]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return found


def square(tensors, T: int) -> list[torch.Tensor]:
    """The tensors with a (T, T) pair of last dimensions: attention weights, scores, masks."""
    return [t for t in tensors if t.dim() >= 2 and tuple(t.shape[-2:]) == (T, T)]


def live_square_tensors(T: int) -> set[int]:
    """ids of every live tensor object whose last two dimensions are (T, T)."""
    gc.collect()
    return {id(o) for o in gc.get_objects()  # type(), not isinstance: no proxy objects asked
            if issubclass(type(o), torch.Tensor) and o.dim() >= 2
            and tuple(o.shape[-2:]) == (T, T)}


# ---- the multi-head layer -------------------------------------------------------------------

def test_by_default_a_layer_keeps_nothing_and_says_how_to_ask():
    attn = MultiHeadAttention(16, 4)
    assert attn.keep_weights is False
    attn(torch.randn(2, 5, 16))
    assert attn._last_weights is None
    with pytest.raises(RuntimeError, match=ASK):
        attn.last_weights


def test_keep_weights_keeps_the_last_weights_detached():
    attn = MultiHeadAttention(16, 4, keep_weights=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    attn(x, torch.randn(2, 7, 16))
    w = attn.last_weights
    assert w.shape == (2, 4, 5, 7) and not w.requires_grad
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 5), atol=1e-6)
    attn.keep_weights = False  # switched off: the next forward drops the old weights too
    attn(x)
    with pytest.raises(RuntimeError, match=ASK):
        attn.last_weights


def test_keep_weights_must_be_a_bool():
    with pytest.raises(ValueError, match="keep_weights must be True or False, got 1"):
        MultiHeadAttention(16, 4, keep_weights=1)


# ---- record_weights -------------------------------------------------------------------------

def test_record_weights_turns_every_layer_on_and_restores_it():
    model = EncoderDecoder(EncoderDecoderConfig(12, 12, d_model=16, n_heads=2, n_layers=2,
                                                d_ff=32, dropout=0.0)).eval()
    model.decoder.layers[1].cross_attn.keep_weights = True  # one layer was on already
    src, tgt = torch.randint(0, 12, (3, 6)), torch.randint(0, 12, (3, 4))
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    with record_weights(model) as recorded:
        assert recorded is model and all(m.keep_weights for m in layers)
        model(src, tgt)
    assert [m.keep_weights for m in layers] == [m is model.decoder.layers[1].cross_attn
                                                for m in layers]
    # Readable after the block, until each layer's next forward.
    assert model.decoder.layers[0].cross_attn.last_weights.shape == (3, 2, 4, 6)
    assert model.encoder.layers[1].self_attn.last_weights.shape == (3, 2, 6, 6)
    model(src, tgt)
    with pytest.raises(RuntimeError, match=ASK):
        model.decoder.layers[0].cross_attn.last_weights
    assert model.decoder.layers[1].cross_attn.last_weights.shape == (3, 2, 4, 6)


def test_record_weights_restores_after_an_error():
    model = Decoder(DecoderConfig())
    with pytest.raises(ValueError, match="ids in tokens"):
        with record_weights(model):
            model(torch.tensor([[0, 99]]))
    assert not any(layer.self_attn.keep_weights for layer in model.layers)


def test_record_weights_needs_a_layer_that_keeps_weights():
    with pytest.raises(ValueError, match="Linear has no layer that keeps weights"):
        with record_weights(nn.Linear(2, 2)):
            pass


def test_mixture_of_experts_keeps_its_routing_only_on_request():
    moe = MoEFeedForward(16, 24, 4, 2)
    x = torch.randn(2, 5, 16)
    moe(x)
    for name in ("last_router_probs", "last_expert_index"):
        with pytest.raises(RuntimeError, match=r"MoEFeedForward\(\.\.\., keep_weights=True\)"):
            getattr(moe, name)
    wrapper = nn.Sequential(nn.Identity(), moe)  # record_weights finds it inside a model
    with record_weights(wrapper):
        moe(x)
    assert moe.keep_weights is False
    assert moe.last_router_probs.shape == (2, 5, 4) and moe.last_expert_index.shape == (2, 5, 2)
    assert torch.equal(moe.last_expert_index, moe.last_router_probs.topk(2, dim=-1).indices)


# ---- a long sequence leaves nothing (T, T) behind -------------------------------------------

T_LONG = 1024


@pytest.fixture(scope="module")
def long_model() -> Decoder:
    return Decoder(DecoderConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                 max_seq_len=T_LONG)).eval()


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_a_long_forward_leaves_no_square_tensor(long_model, grad):
    """T = 1,024: the weights of one layer are (1, 4, 1024, 1024), 16 MiB; after the call (and
    the output deleted, which frees the autograd graph) none is referenced by the model, and
    no tensor ending in (1024, 1024) is alive anywhere that was not alive before."""
    tokens = torch.randint(0, 64, (1, T_LONG))
    before = live_square_tensors(T_LONG)
    with torch.set_grad_enabled(grad):
        logits = long_model(tokens)
    assert logits.shape == (1, T_LONG, 64)
    del logits
    assert square(held_tensors(long_model), T_LONG) == []
    assert live_square_tensors(T_LONG) - before == set()


def test_under_record_weights_the_long_weights_are_there(long_model):
    """The same forward inside record_weights: each layer holds its (1, 4, T, T) weights, so
    the test above would see them if they were kept."""
    tokens = torch.randint(0, 64, (1, T_LONG))
    with torch.no_grad(), record_weights(long_model):
        long_model(tokens)
    kept = square(held_tensors(long_model), T_LONG)
    assert [tuple(w.shape) for w in kept] == [(1, 4, T_LONG, T_LONG)] * 2
    assert {id(w) for w in kept} == {id(layer.self_attn.last_weights)
                                     for layer in long_model.layers}
    long_model(tokens[:, :8])  # the next forward, outside the block, lets them go
    assert square(held_tensors(long_model), T_LONG) == []


def test_eval_mode_restores_the_mode_it_found():
    model = torch.nn.Dropout(0.5)
    for training in (True, False):
        model.train(training)
        with eval_mode(model) as inside:
            assert inside is model and not model.training
        assert model.training is training
    model.train()
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError("an error inside the block")
    assert model.training


def test_record_weights_lives_in_recording_only():
    """Its old second address, ``transformer_lib.attention.record_weights``, is gone."""
    assert not hasattr(attention, "record_weights")
