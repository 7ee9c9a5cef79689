"""The caches (claim C33): what a layer writes, where, what it reads back, and the one contract
(``PositionCache``) that the KV cache and the MLA cache share."""
import pytest
import torch

from transformer_lib.attention import MultiHeadAttention, causal_mask
from transformer_lib.cache import KVCache, PositionCache, cache_length
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.variants.mla import MLACache, MLAConfig, MultiHeadLatentAttention

from conftest import randomize_


def test_update_writes_at_pos_and_returns_everything_cached():
    cache = KVCache(n_layers=2, batch_size=1, n_kv_heads=2, max_seq_len=8, head_dim=3)
    k1, v1 = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)  # (B, H_kv, T, D)
    k, v = cache.update(1, k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1)
    assert cache.pos == 0, "update does not advance: the model does, once per forward"
    assert (cache.k[0] == 0).all(), "layer 0's slot is untouched"
    cache.advance(5)
    k2, v2 = torch.randn(1, 2, 2, 3), torch.randn(1, 2, 2, 3)
    k, v = cache.update(1, k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], dim=2))
    cache.reset()
    assert cache.pos == 0


@pytest.mark.equality
def test_layer_writes_into_the_slot_of_its_layer_idx(ledger):
    """A layer knows its place from construction: with a cache it attends to every cached
    position, exactly as a full forward over the whole sequence does."""
    torch.manual_seed(0)
    attn = randomize_(MultiHeadAttention(16, 4, n_kv_heads=2, layer_idx=2)).eval()
    x = torch.randn(1, 7, 16)  # (B, T, C)
    full = attn(x, mask=causal_mask(7))  # (B, T, C)
    cache = KVCache(n_layers=3, batch_size=1, n_kv_heads=2, max_seq_len=10, head_dim=4)
    first = attn(x[:, :4], causal=True, kv_cache=cache)
    cache.advance(4)
    rest = attn(x[:, 4:], causal=True, kv_cache=cache)
    ledger.check("attention output, prefill + chunk through the cache",
                 "one causal pass over the whole sequence", torch.cat([first, rest], dim=1), full,
                 tol=1e-6)
    assert (cache.k[:2] == 0).all() and (cache.k[2, :, :, :7] != 0).all()


def test_the_cache_is_exported_by_cache_only():
    from transformer_lib import decoder

    assert "KVCache" not in decoder.__all__


# ---- one contract for both caches ---------------------------------------------------------

def both_caches() -> list[PositionCache]:
    """A KV cache and an MLA cache of 6 positions for a batch of 2."""
    return [KVCache(n_layers=2, batch_size=2, n_kv_heads=3, max_seq_len=6, head_dim=4),
            MLACache(batch_size=2, max_seq_len=6, kv_lora_rank=5, qk_rope_head_dim=4)]


def write(cache: PositionCache, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Write T random positions through the cache's own ``update``."""
    if isinstance(cache, KVCache):
        return cache.update(0, torch.randn(2, 3, T, 4), torch.randn(2, 3, T, 4))
    return cache.update(torch.randn(2, T, 5), torch.randn(2, T, 4))


@pytest.mark.parametrize("index", [0, 1], ids=["KVCache", "MLACache"])
def test_both_caches_keep_one_contract(index):
    cache = both_caches()[index]
    assert isinstance(cache, PositionCache)
    first, _ = write(cache, 4)
    assert cache.pos == 0, "update never advances"
    cache.advance(4)
    second, _ = write(cache, 2)
    assert second.shape[-2 if index == 0 else 1] == 6  # every cached position comes back
    assert cache.pos == 4
    cache.advance(2)
    with pytest.raises(ValueError, match=rf"{type(cache).__name__} overflow: 6 cached \+ 1 new "
                                         r"positions > the cache's max_seq_len \(6\)"):
        write(cache, 1)
    with pytest.raises(ValueError, match=r"6 cached \+ 1 new"):
        cache.advance(1)
    assert cache.pos == 6  # a refused call changes nothing
    cache.reset()
    assert cache.pos == 0
    # nbytes is the sum over the cache's tensors, all positions, filled or not.
    assert cache.nbytes == sum(t.numel() * 4 for t in cache.tensors())
    # k and v · L · B · H_kv · S · D, or B · S · (d_c + D_r); 4 bytes each
    assert cache.nbytes == (2 * 2 * 2 * 3 * 6 * 4 if index == 0 else 2 * 6 * (5 + 4)) * 4


def test_a_cache_for_other_heads_names_expected_and_got_shapes():
    """A cache made for 2 key/value heads, written with 4: a ValueError naming both shapes,
    not a raw broadcasting error from torch."""
    cache = KVCache(n_layers=1, batch_size=1, n_kv_heads=2, max_seq_len=8, head_dim=16)
    message = (r"k must have shape \(B, H_kv, T, D\) = \(1, 2, T, 16\) for this cache, "
               r"got \(1, 4, 3, 16\)")
    with pytest.raises(ValueError, match=message):
        cache.update(0, torch.zeros(1, 4, 3, 16), torch.zeros(1, 4, 3, 16))
    with pytest.raises(ValueError, match=r"v must have shape .* = \(1, 2, 3, 16\) .* \(1, 2, 3, 8\)"):
        cache.update(0, torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 8))
    # Through a model: a cache from a model with other sizes is refused the same way.
    small = Decoder(DecoderConfig(n_heads=4, n_kv_heads=2))
    other = Decoder(DecoderConfig(n_heads=4, n_kv_heads=4)).new_cache(1)
    with pytest.raises(ValueError, match=r"= \(1, 4, T, 16\) for this cache, got \(1, 2, 3, 16\)"):
        small(torch.zeros(1, 3, dtype=torch.long), other)
    assert other.pos == 0


def test_cache_length_is_checked_in_one_place():
    assert cache_length(None, 16) == 16 and cache_length(5, 16) == 5
    for bad in (0, 17):
        with pytest.raises(ValueError, match=rf"max_seq_len must be in \[1, 16\] \(the config's\), "
                                             rf"got {bad}"):
            cache_length(bad, 16)
    # The decoder and the MLA layer both use it: the same message from either.
    mla = MultiHeadLatentAttention(MLAConfig(max_seq_len=16))
    for make in (Decoder(DecoderConfig(max_seq_len=16)).new_cache, mla.new_cache):
        with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 16\].*got 17"):
            make(1, max_seq_len=17)


def test_bad_cache_use_is_rejected():
    with pytest.raises(ValueError, match="batch_size must be positive, got 0; "
                                         "head_dim must be positive, got 0"):
        KVCache(n_layers=1, batch_size=0, n_kv_heads=1, max_seq_len=4, head_dim=0)
    cache = KVCache(n_layers=2, batch_size=1, n_kv_heads=1, max_seq_len=4, head_dim=2)
    with pytest.raises(ValueError, match=r"layer_idx must be in \[0, 1\], got 2"):
        cache.update(2, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match=r"0 cached \+ 5 new positions > the cache's "
                                         r"max_seq_len \(4\)"):
        cache.update(0, torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
    with pytest.raises(ValueError, match=r"layer_idx must be >= 0, got -1"):
        MultiHeadAttention(8, 2, layer_idx=-1)


def test_update_returns_views_of_the_preallocated_memory():
    """Preallocation: the keys and values handed back are views of the cache's own tensors
    (nothing is copied to grow it), and the tensors are never replaced."""
    cache = KVCache(n_layers=2, batch_size=1, n_kv_heads=2, max_seq_len=8, head_dim=3)
    k_memory, v_memory = cache.k, cache.v
    for T in (3, 1, 1):
        k, v = cache.update(1, torch.randn(1, 2, T, 3), torch.randn(1, 2, T, 3))
        cache.advance(T)
        assert k._base is k_memory and v._base is v_memory
        assert k.data_ptr() == cache.k[1].data_ptr() and v.data_ptr() == cache.v[1].data_ptr()
    assert cache.k is k_memory and cache.v is v_memory


@pytest.mark.equality
def test_a_left_padded_batch_shares_one_pos_and_decodes_each_sequence_as_alone(ledger):
    """Prompts of 3 and 7 tokens, left-padded to 7, prefilled and decoded for 3 steps with one
    cache and a mask over the padded keys in every forward: each sequence's logits equal its
    own decoding, in float64 to 1e-12 (RoPE sees only differences of positions)."""
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2,
                           d_ff=24, max_seq_len=16)
    model = randomize_(Decoder(config)).double().eval()
    prompts = [torch.randint(0, 11, (n,)) for n in (3, 7)]
    steps = torch.randint(0, 11, (2, 3))  # the tokens fed at the 3 decode steps
    L = 7
    tokens = torch.stack([torch.cat([torch.zeros(L - len(p), dtype=torch.long), p])
                          for p in prompts])  # (2, L)
    real = torch.ones(2, L + 3, dtype=torch.bool)  # (B, S_max): slots holding a token
    real[0, :L - 3] = False
    cache, batched = model.new_cache(2), []
    with torch.no_grad():
        for chunk in (tokens, *steps.split(1, dim=1)):
            T, start = chunk.shape[1], cache.pos
            rope = (model.rope_cos[start:start + T], model.rope_sin[start:start + T])
            x = model.embed_tokens(chunk)  # (B, T, C)
            for layer in model.layers:
                x = layer(x, rope, cache, mask=real[:, None, None, :start + T])
            cache.advance(T)
            batched.append(model.lm_head(model.norm(x)))  # (B, T, V)
        batched = torch.cat(batched, dim=1)  # (B, L + 3, V)
        for b, p in enumerate(prompts):
            alone = model(torch.cat([p, steps[b]])[None])[0]  # (len + 3, V)
            ledger.check(f"logits of the {len(p)}-token prompt in a left-padded batch",
                         "the prompt decoded alone", batched[b, L - len(p):], alone, tol=1e-12)
        unmasked = model(tokens)[0, L - 3:]  # the padding attended
        assert (unmasked - model(prompts[0][None])[0]).abs().max() > 1e-3
