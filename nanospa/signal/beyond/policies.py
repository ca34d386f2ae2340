"""The kernel-budget policies beyond the default (docs/kernel_budget.md), which move A_l off
the schedule's closed form: the walk of one sequence through the blocks that builds each
layer's A_l as the policy says.

    qpreserve        independent targets; D_l[i] = 1 / sqrt((P_l S_{l-1} P_l^T)_ii) with
                     P_l = softmax(B_l) and S_{l-1} the predicted kernel entering the
                     attention, so every position leaves every attention sublayer with q = 1
    mlp_aware        A_l = chol(Pi_l) chol(K_{l-1})^-1 with Pi_l = F^-1(Sigma_l) the
                     pre-image of the target under the MLP's kernel map F (entrywise C^-1)
                     and K_{l-1} the predicted kernel entering block l; layers where Pi_l
                     is not positive definite or A_l has negative entries fall back to the
                     independent A_l and are listed in plan.info["mlp_aware"]
    joint_qpreserve  the joint targets with the q-preserving D_l

    overrides(cfg, activation, values, policy, final)   -> (overrides, info) for make_plan

Not here: the default policies and make_plan (budget.py), the two-sequence walk the joint
targets are solved on (walks.py). Notation as in budget.py.
"""
import numpy as np

from ..cholesky import bias_and_rescale, log_attention_from
from ..kernels import flush
from ..maps import attention_map
from ..walks import WalkMaps, spa_kernel, spa_matrix

MLP_AWARE_NEG_TOL = 1e-10         # A entries above -tol * max A count as rounding zeros
Q1_TOL = 1e-8                     # mlp_aware needs Q(1) = 1 to this tolerance (shaped: ~1e-14)
STATIONARY_DECAYS = 10.0          # qpreserve_walk_T: E-SPA's D_l is stationary after this many decay
WALK_MIN_T = 64                   # lengths 1 / gamma_L (at least WALK_MIN_T positions); see there
C_RANGE_TOL = 1e-12               # c_inverse: c outside [C(-1), 1] by more than this is refused
BISECTION_STEPS = 60              # c_inverse: steps of bisection on [-1, 1] (2^-60: far below rounding)


def overrides(cfg, activation, values, policy, final):
    """(overrides, info) of a policy that moves A_l off the closed form along `values`:
    qpreserve's D_l is found on a window of positions and extended (qpreserve_walk_T);
    mlp_aware's A_l has no closed form to extend: it walks at the full T (O(T^2) per layer)."""
    d_rule = "qpreserve" if policy in ("qpreserve", "joint_qpreserve") else "spa"
    info = {}
    T_walk = cfg.block_size if policy == "mlp_aware" else qpreserve_walk_T(cfg.attention, cfg.block_size, final)
    out, _, report = walk(cfg, activation, values, d_rule, T=T_walk, mlp_aware=(policy == "mlp_aware"))
    if T_walk < cfg.block_size:
        out = extend_overrides(out, cfg.block_size)
        info["walk_T"] = T_walk
    if policy == "mlp_aware":
        info["mlp_aware"] = report
        info["mlp_aware_realised"] = [e["layer"] for e in report if e["realised"]]
    return out, info


def split_bias(A):
    """(B, D) with A = diag(D) softmax(B) for a non-negative lower-triangular A."""
    return bias_and_rescale(log_attention_from(A))


def walk(cfg, activation, values, d_rule="spa", T=None, sigma_0=None, mlp_aware=False):
    """Walk the L blocks along the schedule `values` ([v_0..v_L]) while predicting the
    kernels (walks.WalkMaps), and return (overrides, K_L, report): per layer None where
    A_l is the schedule's closed form, else the (B_l, D_l) this walk chose.

    d_rule "spa": D_l = row sums of the SPA A_l (attention-only targets met exactly).
    d_rule "qpreserve": D_l[i] = 1 / sqrt((P_l S P_l^T)_ii), P_l = softmax(B_l), S the
        predicted kernel entering the attention: q = 1 after every attention sublayer.
    mlp_aware: A_l = chol(F^-1(Sigma_l)) chol(K_{l-1})^-1 where realisable (see module doc).
    K_L is the predicted kernel after the last block (before any final norm)."""
    T = cfg.block_size if T is None else T
    kind = cfg.attention
    maps = WalkMaps(cfg, activation)
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
    Pi = c_inverse(mlp, values)[where].reshape(Sigma_l.shape)
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


def c_inverse(mlp, c):
    """C^-1(c) elementwise for c in [C(-1), 1] by bisection (C is increasing);
    entries below C(-1) raise ValueError."""
    c = np.asarray(c, dtype=np.float64)
    if mlp.maps is None:
        return c.copy()
    lo_val = float(mlp.C(-1.0))
    if np.any(c < lo_val - C_RANGE_TOL) or np.any(c > 1.0 + C_RANGE_TOL):
        raise ValueError(f"C^-1 needs c in [{lo_val:.4g}, 1], got [{c.min():.4g}, {c.max():.4g}]")
    lo, hi = np.full(c.shape, -1.0), np.ones(c.shape)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        below = mlp.C(mid) < c
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)
