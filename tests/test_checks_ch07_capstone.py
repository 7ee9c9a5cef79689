"""The capstone's checkers (``transformer_lib/checks/ch07_capstone.py``) name the usual
mistakes in words a student can act on, and their reference is the library's decoder. The
contract every checker keeps is in ``test_checks_contract.py``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.checks import ch07_capstone, check_capstone_lm, check_train_lm
from transformer_lib.decoder import Decoder, DecoderConfig

from chapter_solutions import chapter_namespace, references
from conftest import mistake_tests

CapstoneLM, train_lm = references("07d_capstone", "CapstoneLM", "train_lm")
decoder_logits = chapter_namespace("07d_capstone")["decoder_logits"]

CONFIGS = [
    dict(n_layers=2, n_kv_heads=2, rope_theta=500.0, norm_eps=1e-2),
    dict(n_layers=1, n_kv_heads=1, tie_embeddings=True),
    dict(n_layers=3, n_kv_heads=4, d_ff=24),
]


@pytest.mark.parametrize("sizes", CONFIGS)
def test_the_reference_is_the_library_decoder(sizes):
    """The checker's names and shapes are the library's ``state_dict``, and its float64
    logits are the library's ``Decoder`` with the same random weights."""
    config = DecoderConfig(vocab_size=29, d_model=32, n_heads=4, max_seq_len=16,
                           **{"d_ff": 40, **sizes})
    library = Decoder(config).double()
    assert {k: tuple(v.shape) for k, v in library.state_dict().items()} == \
        ch07_capstone._shapes(config)
    weights = ch07_capstone._random_weights(config, torch.Generator().manual_seed(1))
    library.load_state_dict(weights)
    tokens = torch.randint(0, 29, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = library(tokens)
    assert torch.allclose(ch07_capstone._logits(tokens, weights, config), expected,
                          atol=1e-12, rtol=0)


class Detached(CapstoneLM):
    """Reads its weights through state_dict(): detached copies, which do not train."""

    def forward(self, tokens):
        return decoder_logits(tokens, self.state_dict(), self.config)


class WideKeys(CapstoneLM):
    """A key projection with d_model outputs, as if every head had its own keys."""

    def __init__(self, config):
        super().__init__(config)
        for block in self.layers:
            block.self_attn.k_proj = nn.Linear(config.d_model, config.d_model, bias=False)


class Biased(CapstoneLM):
    """Output layer with a bias, which the library's has not."""

    def __init__(self, config):
        super().__init__(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)


def train_wrong(*, shift=True, seeded=True, floats=True, step=True):
    """train_lm with one of the usual mistakes."""

    def train(model, ids, steps, batch_size, seq_len, lr, seed=0):
        generator = torch.Generator().manual_seed(seed) if seeded else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - seq_len, (batch_size, 1), generator=generator)
            windows = ids[starts + torch.arange(seq_len + 1)]  # (B, T + 1)
            inputs = windows[:, :-1]
            targets = windows[:, 1:] if shift else inputs
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            if step:
                optimizer.step()
            losses.append(loss.item() if floats else loss.detach())
        return losses

    return train


WRONG = [
    (check_capstone_lm, Detached, ["no gradient reaches", "named_parameters(remove_duplicate"]),
    (check_capstone_lm, WideKeys, ["self_attn.k_proj.weight` has shape", "n_kv_heads"]),
    (check_capstone_lm, Biased, ["lm_head.bias", "names of the library's Decoder"]),
    (check_train_lm, train_wrong(shift=False), ["predicts each token itself", "w[1:]"]),
    (check_train_lm, train_wrong(seeded=False), ["same seed gave different losses"]),
    (check_train_lm, train_wrong(floats=False), ["not all finite Python numbers", ".item()"]),
    (check_train_lm, train_wrong(step=False), ["weights did not change", "optimizer.step()"]),
]

test_wrong_solution_is_rejected, test_every_checker_knows_two_mistakes = mistake_tests(
    WRONG, ch07_capstone)
