"""The fused primitives: softmax with scale, bias and causal mask (and its cached form).
"""
import numpy as np

from nanospa import GPT, GPTConfig, Tensor
from nanospa import functions as F
from nanospa.gradcheck import check_jacobian


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def tiny(**kw):
    base = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
    base.update(kw)
    return GPTConfig(**base)


def test_cached_bias_and_mask_is_softmax_with_bias_and_causal_mask():
    model = GPT(tiny(attention="espa"), seed=0)
    attn = model.blocks[1].attn
    x = normal(2, 2, 6, 6)
    bias, causal = attn.logit_bias(6)
    assert not causal and bias is attn.logit_bias(6)[0]  # computed once per length
    y = F.softmax(Tensor(x), bias, scale=0.3, causal=False).data
    reference = F.softmax(Tensor(x), Tensor(attn.B[:6, :6]), scale=0.3, causal=True).data
    np.testing.assert_allclose(y, reference, rtol=1e-13, atol=1e-300)
    model.load_state_dict(model.state_dict())  # a new B_l array: the cache must follow it
    assert attn.logit_bias(6)[0] is not bias


def test_softmax_gradient_with_trainable_bias_and_scale():
    x, b = Tensor(normal(2, 1, 5, 5), requires_grad=True), Tensor(normal(5, 5, seed=1), requires_grad=True)
    assert check_jacobian(lambda u, v: F.softmax(u, v, scale=0.7, causal=False), [x, b], rtol=1e-6) < 1e-6
