"""nanospa/nn.py: modules (deterministic parameter order, state dicts that check every key,
shape and dtype), the layers by directional float64 gradient check, DyT's required alpha,
and the orthogonal initialiser."""
import numpy as np
import pytest

from nanospa import nn
from nanospa.beyond import norms
from nanospa.gradcheck import check_directions


class Tiny(nn.Module):
    def __init__(self, dtype="float64"):
        super().__init__()
        rng = np.random.default_rng(0)
        self.emb = nn.Embedding(7, 6, rng=rng, dtype=dtype)
        self.ln = nn.LayerNorm(6, dtype=dtype)
        self.rms = nn.RMSNorm(6, dtype=dtype)
        self.dyt = norms.DyT(6, alpha=0.5, dtype=dtype)
        self.fc = nn.Linear(6, 5, bias=True, rng=rng, dtype=dtype)
        self.register_buffer("scale", np.full(5, 0.5, dtype=dtype))

    def forward(self, idx):
        return self.fc(self.dyt(self.rms(self.ln(self.emb(idx))))) * self.scale


def test_parameter_order_is_deterministic():
    names = [n for n, _ in Tiny().named_parameters()]
    assert names == ["emb.weight", "ln.weight", "ln.bias", "rms.weight", "dyt.alpha", "dyt.weight",
                     "dyt.bias", "fc.weight", "fc.bias"]


def test_layers_directional_gradcheck():
    m = Tiny()
    rng = np.random.default_rng(1)
    for p in m.parameters():  # move away from the init so that no gradient is trivially 0
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    idx = np.array([[1, 2, 2, 6], [0, 1, 5, 5]])
    assert check_directions(lambda: m(idx), m.parameters(), n_directions=4) < 1e-6


def test_state_dict_roundtrip_and_errors():
    a, b = Tiny(), Tiny()
    for p in b.parameters():
        p.data = p.data + 1.0
    sd = a.state_dict()
    assert "scale" in sd and all(isinstance(v, np.ndarray) for v in sd.values())
    b.load_state_dict(sd)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    bad = dict(sd, **{"fc.weight": np.zeros((5, 6))})
    with pytest.raises(ValueError, match=r"'fc.weight': shape \(5, 6\)"):
        b.load_state_dict(bad)
    bad = dict(sd, **{"fc.weight": sd["fc.weight"].astype(np.float32)})
    with pytest.raises(ValueError, match=r"'fc.weight': dtype float32"):
        b.load_state_dict(bad)
    with pytest.raises(ValueError, match="missing keys \\['fc.bias'\\]"):
        b.load_state_dict({k: v for k, v in sd.items() if k != "fc.bias"})


def test_dyt_alpha_is_required():
    """DyT's initial alpha is a model choice (nanospa.signal's DYT_ALPHA): no default."""
    with pytest.raises(TypeError, match="alpha"):
        norms.DyT(6)
    np.testing.assert_array_equal(norms.DyT(6, alpha=0.25, dtype="float64").alpha.data, [0.25])


@pytest.mark.parametrize("n_in,n_out", [(6, 4), (4, 6), (5, 5)])
def test_orthogonal_is_orthogonal_and_c_ordered(n_in, n_out):
    W = nn.orthogonal(np.random.default_rng(0), n_in, n_out, scale=2.0)
    assert W.shape == (n_in, n_out) and W.flags["C_CONTIGUOUS"]
    gram = W.T @ W if n_in >= n_out else W @ W.T  # the smaller side: 4 I (scale 2)
    np.testing.assert_allclose(gram, 4.0 * np.eye(min(n_in, n_out)), atol=1e-12)
