"""Planted bugs: does the test suite notice a wrong library?

Each mutant below is one line of the library changed into a plausible mistake (a wrong scale,
a top-left causal mask, RoPE turned the other way, ...). The changed function is compiled
from the library's own source with that one line replaced and put in place of the original
everywhere it is bound, for the length of one check, then restored. A mutant must still run
and give finite tensors of the right shape on an ordinary input (so that a crash cannot be
what catches it), and must then make a behavioural check fail: an equality test of the
suite (against Hugging Face, PyTorch or a formula written out) or an invariant. No check
reads the library's source. Each check also passes on the unchanged library, so that a kill
means something (a test of the suite does so in the suite's own run; a check written here is
run on the unchanged library first).

The count (planted, killed) is recorded in the equality ledger (``appendix/ledger.json``,
refreshed by ``make ledger``) and shown on the book's ledger page.
"""
from __future__ import annotations
import __future__

import inspect
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import test_attention
import test_convert
import test_decoder
import test_encoder_decoder
import test_ffn
import test_flash
import test_norms
import test_positional
import test_sampling
import test_variants_linear
import test_variants_mla
import test_variants_moe
import torch
import torch.nn.functional as F

from transformer_lib import attention, cache, ffn, flash, norms, positional, sampling
from transformer_lib import encoder_decoder as ed
from transformer_lib.decoder import Decoder, DecoderBlock, DecoderConfig
from transformer_lib.variants import linear, mla, moe

import ledger_plugin
from conftest import randomize_


class StrictLedger:
    """What a killer passes to an equality test for its ``ledger`` fixture: it checks the
    tolerance and records nothing."""

    hf = staticmethod(lambda name: name)
    torch = staticmethod(lambda name: name)

    def check(self, comparison, reference, got, expected, tol):
        self.record(comparison, reference, "", ledger_plugin.max_difference(got, expected), tol)

    def record(self, comparison, reference, dtype, diff, tol):
        assert diff <= tol, f"{comparison}: {diff:.3g} > {tol:.3g}"


def suite_test(fn: Callable, *args) -> Callable[[], None]:
    """A test of the suite as a killer, with its parameters (and a strict ledger if it has
    one), seeded as the suite's autouse fixture seeds it."""
    needs_ledger = "ledger" in inspect.signature(fn).parameters

    def run():
        torch.manual_seed(0)
        fn(*args, *([StrictLedger()] if needs_ledger else []))

    run.__name__ = f"{fn.__module__}.py::{fn.__name__}" + (f"{list(args)}" if args else "")
    run.in_the_suite = True  # the suite runs it on the unchanged library
    return run


# ---- behavioural checks written for a mutant no test of the suite catches ------------------

def rmsnorm_of_small_inputs():
    """RMSNorm where the epsilon matters: inputs of size 1e-3 (mean square ~1e-6, as large as
    eps), against torch.nn.RMSNorm."""
    torch.manual_seed(0)
    x = 1e-3 * torch.randn(4, 32, dtype=torch.float64)
    ref = torch.nn.RMSNorm(32, eps=1e-6, dtype=torch.float64)
    ours = norms.RMSNorm(32, eps=1e-6).double()
    assert ledger_plugin.max_difference(ours(x), ref(x)) <= 1e-12


def sdpa_rows_without_a_key_with_an_old_kernel(monkeypatch_target=attention):
    """sdpa_attention with a stand-in for PyTorch < 2.5's kernel, which returns NaN for a
    query whose keys are all blocked: the library's rule still gives that row 0."""
    real = F.scaled_dot_product_attention

    def old_kernel(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None:
            blind = ~attn_mask.any(dim=-1, keepdim=True)  # (..., T, 1)
            out = out.masked_fill(blind, float("nan"))
        return out

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    keep[1, 0, 3] = False  # query 3 of sequence 1 sees no key
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(monkeypatch_target.F, "scaled_dot_product_attention", old_kernel)
        out, _ = attention.sdpa_attention(q, k, v, keep)
    assert torch.equal(out[1, :, 3], torch.zeros_like(out[1, :, 3]))
    expected, _ = attention.eager_attention(q, k, v, keep)
    assert ledger_plugin.max_difference(out, expected) <= 1e-12


# ---- the mutants --------------------------------------------------------------------------

@dataclass
class Mutant:
    """One planted bug: in ``target``'s source the text ``old`` (once) becomes ``new``."""

    name: str
    target: Callable  # a library function, or a method (``Class.method``)
    old: str
    new: str
    smoke: Callable[[], torch.Tensor]  # an ordinary call through the changed code
    shape: tuple[int, ...]  # what the smoke call returns
    killers: list[Callable[[], None]]  # behavioural checks, the first that fails kills


def _decoder(**overrides) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(**{**dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4,
                                     n_kv_heads=2, d_ff=48, max_seq_len=32), **overrides})
    return randomize_(Decoder(config), std=0.1).eval()


def _decode(model: Decoder) -> torch.Tensor:
    tokens = torch.randint(0, 64, (2, 12))
    cache_ = model.new_cache(2)
    return torch.cat([model(tokens[:, :8], cache_), model(tokens[:, 8:], cache_)], dim=1)


def _qkv(H=4, H_kv=4, T=5, S=5, dtype=torch.float32):
    torch.manual_seed(0)
    return (torch.randn(2, H, T, 8, dtype=dtype), torch.randn(2, H_kv, S, 8, dtype=dtype),
            torch.randn(2, H_kv, S, 8, dtype=dtype))


def _moe():
    torch.manual_seed(0)
    return randomize_(moe.MoEFeedForward(16, 24, 4, 2), std=0.3)(torch.randn(2, 5, 16))[0]


def _mla(absorb: bool):
    return test_variants_mla.random_mla()(torch.randn(2, 7, 64), absorb=absorb)


def _delta(gated: bool):
    q, k, v, alpha, beta, state = test_variants_linear.inputs(T=9)
    if gated:
        return linear.gated_delta_rule_recurrent(q, k, v, alpha, beta, state)[0]
    return linear.delta_rule_recurrent(q, k, v, beta, state)[0]


def _encoder_decoder():
    torch.manual_seed(0)
    model = ed.EncoderDecoder(ed.EncoderDecoderConfig(
        src_vocab_size=12, tgt_vocab_size=12, d_model=32, n_heads=4, d_ff=48, n_layers=2,
        dropout=0.0)).eval()
    return model(torch.randint(0, 12, (2, 6)), torch.randint(0, 12, (2, 5)))


def _label_smoothing():
    torch.manual_seed(0)
    return ed.LabelSmoothingLoss(0.1)(torch.randn(4, 11), torch.randint(0, 11, (4,)))[None]


MUTANTS = [
    Mutant("attention scale 1/D instead of 1/√D", attention.scaled_dot_product_attention,
           "scale = q.shape[-1] ** -0.5 if scale", "scale = q.shape[-1] ** -1.0 if scale",
           lambda: attention.scaled_dot_product_attention(*_qkv())[0], (2, 4, 5, 8),
           [suite_test(test_attention.test_matches_torch_sdpa_with_and_without_mask)]),
    Mutant("softmax over the queries instead of the keys", attention.masked_softmax,
           "weights = torch.softmax(x, dim=-1)", "weights = torch.softmax(x, dim=-2)",
           lambda: attention.scaled_dot_product_attention(*_qkv())[0], (2, 4, 5, 8),
           [suite_test(test_attention.test_matches_torch_sdpa_with_and_without_mask)]),
    Mutant("causal mask aligned top-left after a cached prefix", attention.causal_mask,
           "[:, None] + (S - T)", "[:, None] + 0",
           lambda: attention.eager_attention(*_qkv(T=3, S=7), causal=True)[0], (2, 4, 3, 8),
           [suite_test(test_attention.test_every_entry_equals_the_reference,
                       "chunk after a cached prefix", 5, 12, None, True, (6, 3))]),
    Mutant("GQA heads tiled (kv0, kv1, kv0, ...) instead of repeated", attention.repeat_kv,
           "x[:, :, None, :, :].expand(B, H_kv, n_rep, S, D)",
           "x[:, None, :, :, :].expand(B, n_rep, H_kv, S, D)",
           lambda: attention.eager_attention(*_qkv(H=4, H_kv=2))[0], (2, 4, 5, 8),
           [suite_test(test_attention.test_gqa_matches_torch_sdpa_enable_gqa)]),
    Mutant("eager: a query that sees no key keeps its NaN row",
           attention.masked_softmax,
           "weights = zero_rows_without_keys(weights, mask, x.shape[-1])", "weights = weights",
           lambda: attention.scaled_dot_product_attention(*_qkv(), mask=attention.causal_mask(5))[0],
           (2, 4, 5, 8),
           [suite_test(test_attention.test_every_entry_equals_the_reference,
                       "a fully blocked query row", 4, 6, "blocked row", False, (6, 3))]),
    Mutant("sdpa: the no-key guard removed (NaN rows with PyTorch < 2.5's kernel)",
           attention.sdpa_attention,
           "return zero_rows_without_keys(out, mask, S, causal=causal), None", "return out, None",
           lambda: attention.sdpa_attention(*_qkv(H=4, H_kv=2), causal=True)[0], (2, 4, 5, 8),
           [sdpa_rows_without_a_key_with_an_old_kernel]),
    Mutant("tiled: a row with no key divides 0 by 0", flash._finish,
           "l_safe = l.masked_fill(l == 0, 1.0)", "l_safe = l",
           lambda: flash.flash_attention(*_qkv(), causal=True, block_size=2), (2, 4, 5, 8),
           [suite_test(test_flash.test_a_query_that_sees_no_key_gets_zeros_and_lse_minus_inf),
            suite_test(test_attention.test_rows_without_keys_have_the_references_gradients,
                       "tiled", "left")]),
    Mutant("online softmax: the accumulator is not rescaled by the new max", flash._forward,
           "acc = rescale * acc + p @ v_blk", "acc = acc + p @ v_blk",
           lambda: flash.flash_attention(*_qkv(T=9, S=9), block_size=4), (2, 4, 9, 8),
           [suite_test(test_flash.test_equals_sdpa_without_mask, (2, 3), 37, 37, 8, 8, 7,
                       torch.float64)]),
    Mutant("RoPE rotates the other way (sign of sin)", positional.apply_rope,
           "torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)",
           "torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)",
           lambda: _decode(_decoder()), (2, 12, 64),
           [suite_test(test_positional.test_apply_rope_half_matches_hf)]),
    Mutant("interleaved RoPE pairs channel i with i + D/2", positional.apply_rope,
           "x1, x2 = x[..., 0::2], x[..., 1::2]", "x1, x2 = x[..., : D // 2], x[..., D // 2 :]",
           lambda: _decode(_decoder(rope_pairing="interleaved")), (2, 12, 64),
           [suite_test(test_positional.test_apply_rope_interleaved_matches_complex_rotation)]),
    Mutant("sinusoids: cos on the even channels, sin on the odd", positional.sinusoidal_encoding,
           "return pe.float()", "return pe.view(T, d // 2, 2).flip(-1).reshape(T, d).float()",
           lambda: _encoder_decoder(), (2, 5, 12),
           [suite_test(test_positional.test_sinusoidal_matches_the_formula)]),
    Mutant("RMSNorm: epsilon added after the square root", norms.rms_norm,
           "(h * torch.rsqrt(mean_square + eps) * weight)",
           "(h / (torch.sqrt(mean_square) + eps) * weight)",
           lambda: _decode(_decoder()), (2, 12, 64),
           [suite_test(test_norms.test_rmsnorm_matches_torch_and_hf), rmsnorm_of_small_inputs]),
    Mutant("LayerNorm without subtracting the mean", norms.layer_norm,
           "h = (h - mean) * torch.rsqrt(var + eps)", "h = h * torch.rsqrt(var + eps)",
           lambda: _encoder_decoder(), (2, 5, 12),
           [suite_test(test_norms.test_layernorm_matches_torch)]),
    Mutant("SwiGLU: gate and up projections swapped", ffn.SwiGLU.forward,
           "F.silu(self.gate_proj(x)) * self.up_proj(x)",
           "F.silu(self.up_proj(x)) * self.gate_proj(x)",
           lambda: _decode(_decoder()), (2, 12, 64),
           [suite_test(test_ffn.test_swiglu_matches_hf_llama_mlp)]),
    Mutant("decoder block: the MLP's residual connection dropped", DecoderBlock.forward,
           "x = x + self.mlp(self.post_attention_layernorm(x))",
           "x = self.mlp(self.post_attention_layernorm(x))",
           lambda: _decode(_decoder()), (2, 12, 64),
           [suite_test(test_convert.test_decoder_matches_hf_llama, 4, 2, True, "eager")]),
    Mutant("decoder block: attention not causal", DecoderBlock.forward,
           "kv_cache=cache, causal=causal)", "kv_cache=cache, causal=False)",
           lambda: _decode(_decoder()), (2, 12, 64),
           [suite_test(test_decoder.test_changing_token_9_leaves_earlier_logits_exactly_equal)]),
    Mutant("KV cache: the position is not advanced", cache.PositionCache.advance,
           "self.pos += T", "self.pos += 0",
           lambda: _decode(_decoder()), (2, 12, 64),
           [suite_test(test_decoder.test_a_short_cache_decodes_like_the_full_forward)]),
    Mutant("sampling: logits multiplied by the temperature", sampling.next_token_probs,
           "scaled = logits.to(dtype) / temperature", "scaled = logits.to(dtype) * temperature",
           lambda: sampling.next_token_probs(torch.randn(3, 11), temperature=0.7), (3, 11),
           [suite_test(test_sampling.test_probs_are_the_softmax_of_logits_over_temperature)]),
    Mutant("top-p: the token that reaches p exactly keeps the next one", sampling.next_token_probs,
           "masked_fill(before >= top_p,", "masked_fill(before > top_p,",
           lambda: sampling.next_token_probs(torch.randn(3, 11), top_p=0.8), (3, 11),
           [suite_test(test_sampling.test_top_p_on_an_exact_boundary_stops_at_the_token_that_reaches_it)]),
    Mutant("MoE: the top-k gates not renormalised", moe.MoEFeedForward.route,
           "gates = top_probs / top_probs.sum(dim=-1, keepdim=True)", "gates = top_probs",
           _moe, (2, 5, 16),
           [suite_test(test_variants_moe.test_matches_hf_mixtral_sparse_moe_block, 4, 2)]),
    Mutant("MoE: the least probable experts chosen", moe.MoEFeedForward.route,
           "probs.topk(self.top_k, dim=-1)", "probs.topk(self.top_k, dim=-1, largest=False)",
           _moe, (2, 5, 16),
           [suite_test(test_variants_moe.test_matches_dense_reference, torch.float64, 1e-12,
                       4, 2)]),
    Mutant("MLA absorbed: scaled by the latent width, not the head's",
           mla.MultiHeadLatentAttention._attend_absorbed,
           "scale=c.qk_head_dim ** -0.5", "scale=(c.kv_lora_rank + c.qk_rope_head_dim) ** -0.5",
           lambda: _mla(absorb=True), (2, 7, 64),
           [suite_test(test_variants_mla.test_absorbed_equals_explicit, torch.float64, 1e-12,
                       None)]),
    Mutant("gated delta rule: the state kept by 1 − α instead of α", linear._delta_recurrent,
           "S = alpha[:, :, t, None, None] * S", "S = (1 - alpha[:, :, t, None, None]) * S",
           lambda: _delta(gated=True), (2, 3, 9, 6),
           [suite_test(test_variants_linear.test_delta_recurrent_equals_explicit_matrices,
                       torch.float64, 1e-12)]),
    Mutant("delta rule: the error written without β", linear._delta_recurrent,
           "S = S + beta[:, :, t, None, None] * write", "S = S + write",
           lambda: _delta(gated=False), (2, 3, 9, 6),
           [suite_test(test_variants_linear.test_delta_recurrent_is_online_regression_by_autograd)]),
    Mutant("label smoothing: the true token keeps all its mass", ed.LabelSmoothingLoss.forward,
           "loss = (1.0 - self.smoothing) * nll + self.smoothing * uniform",
           "loss = nll + self.smoothing * uniform",
           _label_smoothing, (1,),
           [suite_test(test_encoder_decoder.test_label_smoothing_matches_torch_cross_entropy)]),
    Mutant("2017 sublayer: the norm inside the residual (pre-norm) where post-norm is asked",
           ed._sublayer, "return norm(x + dropout(sublayer(x)))",
           "return x + dropout(sublayer(norm(x)))",
           _encoder_decoder, (2, 5, 12),
           [suite_test(test_convert.test_encoder_decoder_matches_nn_transformer, True, False)]),
    Mutant("2017 embeddings not scaled by √d_model", ed.EncoderDecoder._embed,
           "x = table(tokens) * math.sqrt(self.d_model)", "x = table(tokens)",
           _encoder_decoder, (2, 5, 12),
           [suite_test(test_encoder_decoder.test_embeddings_are_scaled_and_positions_added)]),
]


# ---- planting -----------------------------------------------------------------------------

_FUTURE = __future__.annotations.compiler_flag  # the library's modules use it
ROOT = Path(__file__).resolve().parent.parent
BINDERS = ("transformer_lib", "tests", "tools")  # where the library's functions are imported


def plant(mutant: Mutant, mp: pytest.MonkeyPatch) -> None:
    """Compile ``mutant.target`` with its one line changed and put it in place of the
    original: on its class for a method, else wherever a module (the library's, a test's)
    or one of the library's tables binds the original."""
    target = mutant.target
    source = textwrap.dedent(inspect.getsource(target))
    if source.count(mutant.old) != 1:
        raise AssertionError(f"mutant {mutant.name!r}: {mutant.old!r} occurs "
                             f"{source.count(mutant.old)} times in {target.__qualname__}; "
                             f"the library changed: update the mutant")
    module = sys.modules[target.__module__]
    code = compile(source.replace(mutant.old, mutant.new), f"<mutant of {target.__qualname__}>",
                   "exec", flags=_FUTURE, dont_inherit=True)
    made: dict = {}
    exec(code, module.__dict__, made)  # globals: the module's, so it sees what the original sees
    changed = made[target.__name__]
    owner_name, _, name = target.__qualname__.rpartition(".")
    if owner_name:  # a method: Class.method
        owner = getattr(module, owner_name)
        mp.setattr(owner, name, changed)
        return
    for other in list(sys.modules.values()):
        path = getattr(other, "__file__", None)
        if path is None or not any(Path(path).resolve().is_relative_to(ROOT / folder)
                                   for folder in BINDERS):
            continue
        for key, value in list(vars(other).items()):
            if value is target:
                mp.setattr(other, key, changed)
            elif type(value) is dict:  # a table such as ATTENTION_FUNCTIONS
                for k, v in list(value.items()):
                    if v is target:
                        mp.setitem(value, k, changed)


def run_mutant(mutant: Mutant) -> dict:
    """Plant ``mutant``, check that it still runs, then run its killers: the first that fails
    kills it. A killer the suite does not run itself is first run on the unchanged library,
    where it must pass."""
    for killer in mutant.killers:
        if not getattr(killer, "in_the_suite", False):
            killer()  # on the unchanged library: must pass
    with pytest.MonkeyPatch.context() as mp:
        plant(mutant, mp)
        with torch.no_grad():
            out = mutant.smoke()
        assert out.shape == mutant.shape, (mutant.name, tuple(out.shape))
        assert torch.isfinite(out).all(), f"{mutant.name}: the smoke call is not finite"
        for killer in mutant.killers:
            try:
                killer()
            except AssertionError:
                return {"name": mutant.name, "killed_by": killer.__name__, "killed": True}
    return {"name": mutant.name, "killed_by": None, "killed": False}


@pytest.mark.equality
def test_every_planted_bug_is_killed(ledger):
    start, cpu = time.perf_counter(), time.process_time()
    results = [run_mutant(m) for m in MUTANTS]
    print(f"{len(MUTANTS)} mutants in {time.perf_counter() - start:.1f} s "
          f"({time.process_time() - cpu:.1f} s of CPU)")
    survivors = [r["name"] for r in results if not r["killed"]]
    assert not survivors, f"no check fails with these bugs planted: {survivors}"
    assert len(MUTANTS) >= 20
    ledger.planted_bugs(results)


def test_a_planted_bug_is_restored_afterwards():
    """Planting is undone: the library computes what it computed before."""
    q, k, v = _qkv()
    before = attention.scaled_dot_product_attention(q, k, v)[0]
    with pytest.MonkeyPatch.context() as mp:
        plant(MUTANTS[0], mp)
        assert attention.scaled_dot_product_attention is not MUTANTS[0].target
        assert not torch.equal(attention.scaled_dot_product_attention(q, k, v)[0], before)
    assert attention.scaled_dot_product_attention is MUTANTS[0].target
    assert test_attention.scaled_dot_product_attention is MUTANTS[0].target
    assert torch.equal(attention.scaled_dot_product_attention(q, k, v)[0], before)


def test_a_mutant_whose_line_is_gone_is_reported():
    gone = Mutant("gone", attention.causal_mask, "no such line", "x", lambda: None, (), [])
    with pytest.MonkeyPatch.context() as mp, pytest.raises(AssertionError, match="update the"):
        plant(gone, mp)
