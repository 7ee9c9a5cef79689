"""The three model configs check every field for type and range, and name fields alike.

Each field gets a value of the wrong type and a value out of its range; both must raise a
ValueError whose message starts with the field's name. A table that misses a field fails
too, so a field added later cannot go unchecked.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_lib.validation import check_overrides
from transformer_lib.variants.mla import MLAConfig

NAN, INF = math.nan, math.inf
SIZE = ([2.0, "64", True, None], [0, -3])  # (wrong types, out of range) of a size
THETA = (["none", None, True], [1.0, 0.5, 0, -10.0, NAN, INF])  # RoPE base: > 1
EPS = (["1e-6", None, False], [0, -1e-6, NAN, INF])  # a norm's epsilon: > 0
BOOL = ([1, 0, "yes", None], [])  # True or False only: nothing is out of range
PAIRING = ([1, None], ["adjacent", "HALF"])
OPTIONAL_SIZE = ([2.5, "8", True], [0, -1])  # None is allowed

FIELDS = {
    DecoderConfig: {
        "vocab_size": SIZE, "d_model": SIZE, "n_layers": SIZE, "n_heads": SIZE,
        "n_kv_heads": SIZE, "d_ff": SIZE, "max_seq_len": SIZE, "rope_theta": THETA,
        "norm_eps": EPS, "tie_embeddings": BOOL, "rope_pairing": PAIRING,
        "attn_implementation": ([None, 0], ["flash-attn", "Eager"]),
        "positions": ([None, 1], ["alibi", "RoPE"]),
    },
    EncoderDecoderConfig: {
        "src_vocab_size": SIZE, "tgt_vocab_size": SIZE, "d_model": SIZE, "n_heads": SIZE,
        "n_layers": SIZE, "n_decoder_layers": OPTIONAL_SIZE, "d_ff": SIZE,
        "dropout": (["0.1", None, True], [1.0, -0.1, 1.5, NAN]), "max_seq_len": SIZE,
        "norm_eps": EPS, "final_norm": BOOL, "norm_first": BOOL,
    },
    MLAConfig: {
        "d_model": SIZE, "n_heads": SIZE, "kv_lora_rank": SIZE, "qk_nope_head_dim": SIZE,
        "qk_rope_head_dim": SIZE, "v_head_dim": SIZE, "q_lora_rank": OPTIONAL_SIZE,
        "max_seq_len": SIZE, "rope_theta": THETA, "rope_pairing": PAIRING, "norm_eps": EPS,
    },
}
REQUIRED = {EncoderDecoderConfig: dict(src_vocab_size=10, tgt_vocab_size=10)}


def make(cls, **fields):
    return cls(**{**REQUIRED.get(cls, {}), **fields})


CASES = [(cls, name, value, kind)
         for cls, table in FIELDS.items()
         for name, (wrong_types, out_of_range) in table.items()
         for kind, values in (("type", wrong_types), ("range", out_of_range))
         for value in values]


@pytest.mark.parametrize("cls", FIELDS, ids=lambda c: c.__name__)
def test_every_field_is_in_the_table(cls):
    assert set(FIELDS[cls]) == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls, name, value, kind", CASES,
                         ids=[f"{c.__name__}-{n}-{k}-{v!r}" for c, n, v, k in CASES])
def test_a_bad_field_is_named_with_its_value(cls, name, value, kind):
    with pytest.raises(ValueError) as error:
        make(cls, **{name: value})
    message = str(error.value)
    assert message.startswith(f"{name} must be"), message
    assert (repr(value) if isinstance(value, str) else str(value)) in message, message


@pytest.mark.parametrize("cls", FIELDS, ids=lambda c: c.__name__)
def test_the_defaults_and_ints_for_floats_are_accepted(cls):
    config = make(cls)
    again = make(cls, **{k: v for k, v in dataclasses.asdict(config).items()})
    assert again == config
    widened = make(cls, norm_eps=1, **({"dropout": 0} if cls is EncoderDecoderConfig else {}))
    assert widened.norm_eps == 1


def test_the_messages_read_as_sentences():
    cases = [
        (dict(rope_theta="none"), "rope_theta must be a number > 1, got 'none' (str)"),
        (dict(d_model=64.0), "d_model must be a positive integer, got 64.0 (float)"),
        (dict(n_heads=0), "n_heads must be positive, got 0"),
        (dict(norm_eps=NAN), "norm_eps must be a finite positive number, got nan"),
        (dict(tie_embeddings=1), "tie_embeddings must be True or False, got 1 (int)"),
        (dict(rope_pairing="adjacent"),
         "rope_pairing must be one of ('half', 'interleaved'), got 'adjacent'"),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError) as error:
            DecoderConfig(**fields)
        assert str(error.value) == message


def test_the_sizes_agree_with_each_other_after_their_types():
    with pytest.raises(ValueError, match=r"d_model \(60\) must be divisible by n_heads \(8\)"):
        DecoderConfig(d_model=60, n_heads=8)
    with pytest.raises(ValueError, match=r"even qk_rope_head_dim, got 7"):
        MLAConfig(qk_rope_head_dim=7)


# One vocabulary: norm_eps and max_seq_len in every config; the old names are gone.


def test_the_configs_share_their_field_names():
    names = [{f.name for f in dataclasses.fields(cls)} for cls in FIELDS]
    for shared in ("norm_eps", "max_seq_len", "d_model", "n_heads"):
        assert all(shared in n for n in names), shared
    for old in ("eps", "max_len", "rms_norm_eps"):
        assert not any(old in n for n in names), old


def test_the_old_names_are_gone():
    """``max_len``, ``eps`` (EncoderDecoderConfig) and ``rms_norm_eps`` (MLAConfig) were
    renamed in 0.5.0; the old names are unknown keywords and attributes now."""
    for cls, old in ((EncoderDecoderConfig, "max_len"), (EncoderDecoderConfig, "eps"),
                     (MLAConfig, "rms_norm_eps")):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            make(cls, **{old: 20})
        assert not hasattr(make(cls), old)
    assert not hasattr(EncoderDecoder(make(EncoderDecoderConfig, max_seq_len=20)), "max_len")


def test_check_overrides_names_every_unknown_field_of_any_config():
    check_overrides(EncoderDecoderConfig, {"n_layers": 1, "norm_first": True})  # all known
    check_overrides(DecoderConfig, {})
    with pytest.raises(ValueError, match=r"unknown DecoderConfig fields: \['heads', 'layers'\]"):
        check_overrides(DecoderConfig, {"layers": 2, "heads": 4, "d_model": 8})
    with pytest.raises(ValueError, match=r"unknown EncoderDecoderConfig fields: \['n_kv_heads'\]"):
        check_overrides(EncoderDecoderConfig, {"n_kv_heads": 1})



def test_a_config_round_trips_through_asdict():
    for cls in FIELDS:
        config = make(cls, max_seq_len=48)
        assert make(cls, **dataclasses.asdict(config)) == config
    model = Decoder(DecoderConfig(max_seq_len=32))
    copy = Decoder(DecoderConfig(**dataclasses.asdict(model.config)))
    copy.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 64, (2, 5))
    assert torch.equal(copy(tokens), model(tokens))
