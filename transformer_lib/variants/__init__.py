"""Attention variants beyond the card, one module per family (import from the module):

- ``transformer_lib.variants.linear``: linear attention, DeltaNet and Gated DeltaNet, each in a
  recurrent form (a fixed-size state, one token at a time) and a parallel/chunked form.
- ``transformer_lib.variants.mla``: multi-head latent attention (a cache of compressed latents).
- ``transformer_lib.variants.moe``: a mixture-of-experts feed-forward layer (router, top-k,
  load balance).
"""
