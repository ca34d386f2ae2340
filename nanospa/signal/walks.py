"""Kernel walks through the blocks of a model at initialisation, for the kernel-budget
policies (docs/kernel_budget.md): the walk of one sequence that builds each layer's A_l
as a policy says (qpreserve's D_l, mlp_aware's pre-image), the walk of two sequences with
no token in common that the joint policy's targets are measured on, and the statistics
of its result.

Not here: the policies and the solve for their targets (budget.py), the sublayer maps
(maps.py), the closed forms of A_l (attn_bias.py). The model configuration is read by
duck typing (GPTConfig's fields).

Notation as in budget.py: K_l the predicted kernel after block l, X_l the kernel between
two sequences with no token in common, F / C the MLP's kernel map and C-map.
"""
import numpy as np

from .attn_bias import bias_and_rescale, log_attention_from, spa_matrix
from .kernels import flush, normalised_kernel, spa_kernel
from .maps import BlockMaps, attention_map

MLP_AWARE_NEG_TOL = 1e-10         # A entries above -tol * max A count as rounding zeros
Q1_TOL = 1e-8                     # mlp_aware needs Q(1) = 1 to this tolerance (shaped: ~1e-14)
COLLAPSED_RTOL = 1e-12            # an input-dependent q below this share of max q: collapsed
JOINT_SOLVE_T = 64                # the joint solve runs at min(T, this); beyond it the per-position
                                  # statistics are stationary and extrapolated
STATIONARY_DECAYS = 10.0          # qpreserve_walk_T: E-SPA's D_l is stationary after this many decay
WALK_MIN_T = 64                   # lengths 1 / gamma_L (at least WALK_MIN_T positions); see there


def split_bias(A):
    """(B, D) with A = diag(D) softmax(B) for a non-negative lower-triangular A."""
    return bias_and_rescale(log_attention_from(A))


def walk(cfg, activation, values, d_rule="spa", T=None, sigma_0=None, mlp_aware=False):
    """Walk the L blocks along the schedule `values` ([v_0..v_L]) while predicting the
    kernels (maps.BlockMaps), and return (overrides, K_L, report): per layer None where
    A_l is the schedule's closed form, else the (B_l, D_l) this walk chose.

    d_rule "spa": D_l = row sums of the SPA A_l (attention-only targets met exactly).
    d_rule "qpreserve": D_l[i] = 1 / sqrt((P_l S P_l^T)_ii), P_l = softmax(B_l), S the
        predicted kernel entering the attention: q = 1 after every attention sublayer.
    mlp_aware: A_l = chol(F^-1(Sigma_l)) chol(K_{l-1})^-1 where realisable (see module doc).
    K_L is the predicted kernel after the last block (before any final norm)."""
    T = cfg.block_size if T is None else T
    kind = cfg.attention
    maps = BlockMaps(cfg, activation)
    if mlp_aware:
        if cfg.residual != "none":
            raise ValueError(f"kernel_budget='mlp_aware' needs residual='none' (the pre-image is "
                             f"that of the skipless block), got residual={cfg.residual!r}")
        if abs(maps.mlp_map.Q1() - 1.0) > Q1_TOL:
            raise ValueError(f"kernel_budget='mlp_aware' needs an activation with Q(1) = 1 (a "
                             f"DKS/TAT-shaped one or 'linear'), got activation={cfg.activation!r}")
    S = np.eye(T) if sigma_0 is None else np.asarray(sigma_0, dtype=np.float64)
    overrides, report = [], []
    for l in range(1, cfg.n_layer + 1):
        A = spa_matrix(kind, T, values[l], values[l - 1])
        entry = {}
        if mlp_aware:
            A, entry = _mlp_aware_step(cfg, maps, S, spa_kernel(kind, T, values[l]), A)
            entry["layer"] = l
            report.append(entry)
        S_in = maps.branch_input(S)
        if d_rule == "qpreserve":
            P = A / A.sum(axis=1, keepdims=True)
            h = attention_map(S_in, P)
            D = 1.0 / np.sqrt(np.diagonal(h))
            A = P * D[:, None]
            h = h * D[:, None] * D[None, :]
        else:
            h = attention_map(S_in, A)
        S = maps.combine(S, maps.scale_attention(h))           # DeepNorm: the branch's beta^4
        S = maps.combine(S, maps.mlp(maps.branch_input(S)))
        if entry.get("realised"):
            overrides.append(split_bias(A))          # exact zeros of A become -inf in B
        elif d_rule == "qpreserve":                  # B_l stays the closed form (O(T) parts)
            overrides.append((None, D))
        else:
            overrides.append(None)
    return overrides, S, report


def qpreserve_walk_T(kind, T, gamma_final):
    """Positions the q-preserving walk needs for a model of T positions. E-SPA's rows become
    stationary as the first column's weight e^{-gamma_l i} dies out, slowest in the last
    layer, so D_l is found on T_w = min(T, max(WALK_MIN_T, STATIONARY_DECAYS / gamma_L))
    positions and extended by its last value (extend_overrides). Measured against the walk
    at the full T (L = 16 and 36, gamma_L = 0.05, T = 768), the largest relative error of
    D_l falls like e^{-gamma_L T_w}: 7e-4 / 4e-4 at 4 decay lengths, 2e-5 / 9e-6 at 8,
    3e-7 / 2e-7 at 12; the joint budget's gamma_L ~ 0.6 needs only WALK_MIN_T (rounding).
    U-SPA's uniform target is not stationary (D_l keeps growing with i: 12% off at
    T_w = 512 of T = 1024): it walks at the full T, O(T^3) time and O(T^2) memory."""
    if kind != "espa":
        return T
    return min(T, max(WALK_MIN_T, int(np.ceil(STATIONARY_DECAYS / gamma_final))))


def extend_overrides(overrides, T):
    """Overrides of a walk at T_w < T positions, for T: a (None, D_l) entry (qpreserve's D_l)
    extended with its last value, the stationary limit along the positions."""
    out = []
    for entry in overrides:
        if entry is not None and entry[0] is None and entry[1].size < T:
            D = entry[1]
            entry = (None, np.concatenate([D, np.full(T - D.size, D[-1])]))
        elif entry is not None and entry[1].size < T:
            raise ValueError("extend_overrides: a dense (B_l, D_l) override cannot be extended")
        out.append(entry)
    return out


def _mlp_aware_step(cfg, maps, S, Sigma_l, A_spa):
    """A_l = chol(Pi) chol(S)^-1 with Pi = F^-1(Sigma_l) (entrywise C^-1 on a unit-diagonal
    target, for MLPs with Q(1) = 1), when Pi is positive definite and A_l >= 0; otherwise
    the attention-only A_spa. Returns (A, report entry)."""
    mlp = maps.mlp_map
    entry = dict(realised=False)
    # entrywise C^-1 by bisection, on the distinct values only (T for E-SPA's Toeplitz
    # target, 2 for U-SPA's): the same numbers as on all T^2 entries, T times faster
    values, where = np.unique(Sigma_l, return_inverse=True)
    Pi = mlp.C_inverse(values)[where].reshape(Sigma_l.shape)
    lam = float(np.linalg.eigvalsh(Pi).min())
    entry["min_eig_preimage"] = lam
    if lam <= 0:
        entry["reason"] = "pre-image not positive definite"
        return A_spa, entry
    S_in = maps.branch_input(S)
    try:
        L_in, L_pi = np.linalg.cholesky(S_in), np.linalg.cholesky(Pi)
    except np.linalg.LinAlgError:
        entry["reason"] = "incoming kernel not positive definite"
        return A_spa, entry
    A = np.tril(np.linalg.solve(L_in.T, L_pi.T).T)                # A L_in = L_pi
    entry["min_A"] = float(A.min())
    if A.min() < -MLP_AWARE_NEG_TOL * np.abs(A).max():
        entry["reason"] = "negative entries in A_l"
        return A_spa, entry
    entry["realised"] = True
    return flush(np.maximum(A, 0.0)), entry


# ------------------------------------------------------------------ two sequences

def pair_walk(cfg, activation, values, d_rule="spa", T=None):
    """The walk of two sequences a, b of T distinct tokens with no token in common (input
    kernel I_2T): returns (K, X), K = K_aa the kernel of one sequence after the last block
    and X = K_ab the kernel between the sequences, both (T, T). X is the part of K common to
    all inputs (for a TAT leaky ReLU mostly its mean, which attention rescales by D_l), so
    K - X is the input-dependent part. Attention acts on each sequence (block-diagonal),
    the MLP and norms entrywise on the 2T x 2T kernel."""
    T = min(cfg.block_size, JOINT_SOLVE_T) if T is None else T
    maps = BlockMaps(cfg, activation)
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
