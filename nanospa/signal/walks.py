"""The kernel walk of the joint budget (docs/kernel_budget.md): two sequences with no token
in common, through the blocks of a model at initialisation, and the statistics of the
result that the joint policy's targets are measured on; WalkMaps, the maps of one block
that this walk and the policies beyond the default share; and A_l of the schedule as a dense
matrix (spa_matrix: espa_attention, uspa_attention, from the closed forms of attn_bias.py),
which both multiply kernels by, with the target Sigma_l and the schedule of either kind
(spa_kernel, spa_schedule: cholesky.py's espa_/uspa_kernel, kernels.py's schedules, by name).

Not here: the policies and the solve for their targets (budget.py), the walk of one sequence
that the policies beyond the default run (beyond/policies.py), the sublayer maps (maps.py),
the closed forms of B_l and D_l (attn_bias.py). The model configuration is read by duck typing
(GPTConfig's fields).

Notation as in budget.py: K_l the predicted kernel after block l, X_l the kernel between
two sequences with no token in common, F / C the MLP's kernel map and C-map.
"""
import numpy as np

from .attn_bias import _uspa_block, bias_block, espa_bias, uspa_bias
from .cholesky import espa_kernel, uspa_kernel
from .kernels import check_T, espa_gammas, flush, normalised_kernel, uspa_rhos
from .maps import MLPMap, attention_map, norm_kernel, residual_kernel
from .plan import residual_weights

COLLAPSED_RTOL = 1e-12            # an input-dependent q below this share of max q: collapsed
JOINT_SOLVE_T = 64                # the joint solve runs at min(T, this); beyond it the per-position
                                  # statistics are stationary and extrapolated


# ------------------------------------------------------------------ A_l of the schedule, dense

def espa_attention(T, gamma, gamma_prev):
    """A_l of E-SPA, dense (T, T) float64: exp of log A from espa_bias (its parts with a zero
    row normaliser), entries below kernels.TINY flushed to 0."""
    p = dict(espa_bias(T, gamma, gamma_prev), lse=np.zeros(check_T(T)))
    with np.errstate(under="ignore"):
        return flush(np.exp(bias_block(p, 0, T, 0, T)))


def uspa_attention(T, rho, rho_prev):
    """A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 for U-SPA in closed form (uspa_bias), dense
    (T, T) float64. The difference phi - psi makes tiny entries accurate to about 1e-16
    absolute, not relative: entries rounding made negative are set to 0, those below
    kernels.TINY flushed to 0."""
    return flush(np.maximum(_uspa_block(uspa_bias(T, rho, rho_prev), 0, T, 0, T), 0.0))


def spa_matrix(kind, T, value, value_prev):
    """The attention-only SPA A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 of kind "espa" (value =
    gamma_l) or "uspa" (rho_l) in closed form, (T, T) float64."""
    if kind == "espa":
        return espa_attention(T, value, value_prev)
    if kind == "uspa":
        return uspa_attention(T, value, value_prev)
    raise ValueError(f"kind must be 'espa' or 'uspa', got {kind!r}")


SPA_KINDS = ("espa", "uspa")


def _check_kind(kind):
    if kind not in SPA_KINDS:
        raise ValueError(f"kind must be one of {list(SPA_KINDS)}, got {kind!r}")


def spa_kernel(kind, T, value):
    """The SPA target Sigma_l of kind "espa" (value = gamma_l) or "uspa" (value = rho_l)."""
    _check_kind(kind)
    return espa_kernel(T, value) if kind == "espa" else uspa_kernel(T, value)


def spa_schedule(kind, n_layer, final):
    """[v_0, v_1, ..., v_L]: the E-SPA gammas (v_0 = inf) or U-SPA rhos (v_0 = 0) ending at
    `final` (espa_gammas / uspa_rhos)."""
    _check_kind(kind)
    return espa_gammas(n_layer, final) if kind == "espa" else uspa_rhos(n_layer, final)



# ------------------------------------------------------------------ one block

class WalkMaps:
    """The kernel budget's maps of one block at init (this walk and beyond/policies.py's):
    sublayer(Sigma, f) -> (branch kernel, combined kernel), f(N(Sigma)) joined by the
    residual (pre) or N(residual) (post); scale_attention and mlp give a branch's gain (DeepNorm).
    The predictions' maps of a block (nanospa/predict.py BlockMaps) read the model's variants
    instead, which signal/ may not import; both call maps.norm_kernel and plan.residual_weights. batch: None for kernels of one sequence, or B
    for kernels of a whole batch (BatchNorm's training-mode statistics)."""

    def __init__(self, cfg, activation, batch=None):
        self.cfg, self.batch = cfg, batch
        self.mlp_map = MLPMap(activation)
        self.a, self.b, self.gain2 = residual_weights(cfg)

    def norm(self, Sigma):
        return norm_kernel(self.cfg, Sigma, self.batch)

    def branch_input(self, Sigma):
        return self.norm(Sigma) if self.cfg.norm_position == "pre" else Sigma

    def scale_attention(self, h):
        """A branch's weights times beta (DeepNorm): its attention kernel times beta^4."""
        return h if self.gain2 == 1.0 else self.gain2 ** 2 * h

    def mlp(self, Sigma_in):
        """The MLP branch's kernel: F(Sigma) (MLPMap); with gain beta, beta^2 F(beta^2 Sigma)."""
        if self.gain2 == 1.0:
            return self.mlp_map(Sigma_in)
        return self.gain2 * self.mlp_map(self.gain2 * Sigma_in)

    def combine(self, Sigma_x, Sigma_h):
        out = residual_kernel(self.a, self.b, Sigma_x, Sigma_h)
        return self.norm(out) if self.cfg.norm != "none" and self.cfg.norm_position == "post" else out

    def sublayer(self, Sigma, f):
        h = f(self.branch_input(Sigma))
        return h, self.combine(Sigma, h)

    def final(self, Sigma):
        return self.norm(Sigma) if self.cfg.uses_final_norm else Sigma


# ------------------------------------------------------------------ two sequences

def pair_walk(cfg, activation, values, d_rule="spa", T=None):
    """The walk of two sequences a, b of T distinct tokens with no token in common (input
    kernel I_2T): returns (K, X), K = K_aa the kernel of one sequence after the last block
    and X = K_ab the kernel between the sequences, both (T, T). X is the part of K common to
    all inputs (for a TAT leaky ReLU mostly its mean, which attention rescales by D_l), so
    K - X is the input-dependent part. Attention acts on each sequence (block-diagonal),
    the MLP and norms entrywise on the 2T x 2T kernel."""
    T = min(cfg.block_size, JOINT_SOLVE_T) if T is None else T
    maps = WalkMaps(cfg, activation)
    S = np.eye(2 * T)
    a, b = slice(0, T), slice(T, 2 * T)
    for l in range(1, cfg.n_layer + 1):
        A = spa_matrix(cfg.attention, T, values[l], values[l - 1])
        S_in = maps.branch_input(S)
        if d_rule == "qpreserve":
            A = A / A.sum(axis=1, keepdims=True)
            A = A / np.sqrt(np.diagonal(attention_map(S_in[a, a], A)))[:, None]
        H = np.empty_like(S)
        H[a, a] = H[b, b] = attention_map(S_in[a, a], A)
        H[a, b] = H[b, a] = attention_map(S_in[a, b], A)
        S = maps.combine(S, maps.scale_attention(H))
        S = maps.combine(S, maps.mlp(maps.branch_input(S)))
    return S[a, a], S[a, b]


def _position_mean(v, T_full):
    """Mean of a per-position statistic over T_full positions, the positions beyond the
    computed ones taking the last computed value (stationarity)."""
    if T_full <= v.size:
        return float(v.mean())
    return float((v.sum() + (T_full - v.size) * v[-1]) / T_full)


def network_stats(K, X, T_full=None):
    """(c_f0, rho): c_f0 = mean_i X_ii / K_ii, the whole network's C_f(0) (the correlation
    of the outputs of two inputs with no token in common, at the same position), and rho =
    the mean adjacent correlation of the normalised input-dependent kernel K - X."""
    T_full = K.shape[0] if T_full is None else T_full
    c_f0 = _position_mean(np.diagonal(X) / np.diagonal(K), T_full)
    R = K - X
    if np.min(np.diagonal(R)) <= COLLAPSED_RTOL * np.max(np.diagonal(K)):
        # No input-dependent part left at some position (e.g. a plain sigmoid MLP at depth):
        # the network is collapsed there, which counts as adjacent correlation 1.
        return c_f0, 1.0
    c = np.diagonal(normalised_kernel(R), 1)
    rho = _position_mean(c, T_full - 1) if c.size else float("nan")
    return c_f0, rho


def adjacent_mean(K, T_full=None):
    """Mean of C[i, i+1] over the adjacent pairs of the normalised kernel of K (extrapolated
    to T_full positions as in _position_mean)."""
    c = np.diagonal(normalised_kernel(K), 1)
    return _position_mean(c, (T_full or K.shape[0]) - 1)
