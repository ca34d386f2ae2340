"""The wide-limit maps of the normalised transformer (nGPT, residual="ngpt"; docs/residuals.md
§3) at init, as functions of kernels. Every hidden state is a unit vector, so its kernel
X X^T / d is C / d with C unit-diagonal, and

    embedding    Sigma_0 -> C_0 / d                          (rows normalised)
    attention    h_A = E[P Sigma P^T], P = softmax_causal(G),  Cov(G_ij, G_i'j') = s^4 C_ii' C_jj'
                 (q, k normalised per head, logits sqrt(d_k) s_qk^2 q.k: the softmax mean field
                 of the correlation C, logit_kernel; values W^V, output W^O with unit columns / rows)
    MLP          h_M = m Sigma o F(s_v^2 d Sigma),  F(K) = E[phi(u) phi(u)^T], u ~ N(0, K)
                 (u = h W_u: kernel Sigma; nu = s_v sqrt(d) h W_nu: kernel s_v^2 d Sigma = C;
                 m = mlp_ratio; u and nu independent, so the gated product multiplies)
    update       h <- Norm((1 - alpha) h + alpha Norm(h_B)):
                 Sigma' = normalise((1 - alpha)^2 C + alpha^2 C_B) / d

(cross terms vanish: W^O and the MLP's output matrix are random and independent of h).
alpha: alpha_A = alpha_M (both NGPT_ALPHA_INIT at init). Not here: nGPT's constants
(residuals.py), the model and its walk (nanospa/beyond/ngpt.py).
"""
from ..maps import normalise
from .residuals import ngpt_value


def embedding(Sigma_0, d):
    return normalise(Sigma_0) / d


def logit_kernel(Sigma):
    return ngpt_value("s_qk") ** 2 * normalise(Sigma)


def mlp(Sigma, mlp_map, d, m):
    return m * Sigma * mlp_map(ngpt_value("s_v") ** 2 * d * Sigma)


def update(Sigma_x, Sigma_h, alpha, d):
    return normalise((1.0 - alpha) ** 2 * normalise(Sigma_x) + alpha ** 2 * normalise(Sigma_h)) / d
