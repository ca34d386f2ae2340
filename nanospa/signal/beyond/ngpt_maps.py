"""The wide-limit maps of the normalised transformer (nGPT, residual="ngpt"; docs/residuals.md),
the BlockMaps of signal/maps.py with nGPT's embedding, logits, gated MLP and update.

Not here: nGPT's constants (residuals.py), the model (nanospa/beyond/ngpt.py).
"""
from ..maps import BlockMaps, normalise
from .residuals import NGPT_ALPHA_INIT, ngpt_value


class NGPTMaps(BlockMaps):
    """nGPT's sublayers in the wide limit at init (docs/residuals.md §3). Every hidden state
    is a unit vector, so its kernel X X^T / d is C / d with C unit-diagonal, and

        embedding    Sigma_0 -> C_0 / d                          (rows normalised)
        attention    h_A = E[P Sigma P^T], P = softmax_causal(G),  Cov(G_ij, G_i'j') = s^4 C_ii' C_jj'
                     (q, k normalised per head, logits sqrt(d_k) s_qk^2 q.k: the softmax mean
                     field of the correlation C; values W^V, output W^O with unit columns / rows)
        MLP          h_M = m Sigma o F(s_v^2 d Sigma),  F(K) = E[phi(u) phi(u)^T], u ~ N(0, K)
                     (u = h W_u: kernel Sigma; nu = s_v sqrt(d) h W_nu: kernel s_v^2 d Sigma = C;
                     m = mlp_ratio; u and nu independent, so the gated product multiplies)
        update       h <- Norm((1 - alpha) h + alpha Norm(h_B)):
                     Sigma' = normalise((1 - alpha)^2 C + alpha^2 C_B) / d

    (cross terms vanish: W^O and the MLP's output matrix are random and independent of h).
    alpha: alpha_A = alpha_M (both NGPT_ALPHA_INIT at init; a test may pass another)."""

    def __init__(self, cfg, activation, alpha=NGPT_ALPHA_INIT):
        super().__init__(cfg, activation)
        self.d, self.m, self.alpha = cfg.n_embd, cfg.mlp_ratio, float(alpha)
        self.s_qk2, self.s_v2 = ngpt_value("s_qk") ** 2, ngpt_value("s_v") ** 2

    def embedding(self, Sigma_0):
        return normalise(Sigma_0) / self.d

    def branch_input(self, Sigma):
        return Sigma

    def logit_kernel(self, Sigma_in):
        return self.s_qk2 * normalise(Sigma_in)

    def mlp(self, Sigma_in):
        return self.m * Sigma_in * self.mlp_map(self.s_v2 * self.d * Sigma_in)

    def combine(self, Sigma_x, Sigma_h):
        a = self.alpha
        return normalise((1.0 - a) ** 2 * normalise(Sigma_x) + a ** 2 * normalise(Sigma_h)) / self.d

    def final(self, Sigma):
        return Sigma
