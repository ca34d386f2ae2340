"""nanospa.beyond: schemes and optimisers beyond the paper. Nothing here is needed to read
the paper's model; model.py dispatches here with a plain ``if`` for the values of GPTConfig
that name them, and each module says which field selects it.

    blockwise.py   causal attention by blocks in O(B H T D) memory (attention_impl, long T)
    positions.py   ALiBi, RoPE and E-SPA's prior in the logits (pos=alibi|rope|spa_prior)
    norms.py       DyT, BatchNorm, PRepBN, GroupNorm (norm=...)
    schemes.py     DeepNorm's and RealFormer's rules (residual=deepnorm, residual_attention)
    ngpt.py        the normalised transformer (residual=ngpt)
    kfac.py        K-FAC, the optimiser of the DKS line (--optimizer=kfac)
    optimizers.py  which optimiser a run trains with, and the settings both share
"""
