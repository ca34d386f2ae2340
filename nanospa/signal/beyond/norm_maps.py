"""Wide-limit kernel maps of the norms whose statistics are not one token's own (docs/norms.md):
BatchNorm over a batch (plain and causal), its running-statistics form, PRepBN at init and
GroupNorm.

The kernel of a batch. BatchNorm couples the sequences of a batch, so its map acts on the
kernel K of all N = B T tokens at once, K[(b, t), (b', t')] = x_bt . x_b't' / d (tokens in
sequence-major order, index b T + t; batch_attention and batch_input_kernel build
the other parts of such a walk). In the wide limit (d -> inf, N fixed) with the model's
random initialisation the d channels are independent draws of one Gaussian column
x ~ N(0, K) over the N tokens. BatchNorm normalises each column by its own statistics, so

    BN:  K -> E[ y y^T ],  y = P x / sqrt(x^T P x / N + eps),  P = I - 1 1^T / N,

where P centres over the batch and x^T P x / N is the column's variance. The statistics of
one column are random (N is finite), so this is not P K P / (tr(P K P) / N + eps), which it
becomes only when x^T P x / N concentrates (N large, P K P of high effective rank:
batchnorm_map(concentrated=True)). With M = P K P = U diag(lambda) U^T and 1/a =
int_0^inf exp(-a s) ds the expectation is the one-dimensional integral

    E[y y^T] = U diag(e) U^T,
    e_i = N lambda_i int_0^inf exp(-N eps u) (1 + 2 u lambda_i)^-1 prod_k (1 + 2 u lambda_k)^-1/2 du,

computed by the trapezoidal rule in log u (its integrand is smooth and decays exponentially
at both ends there, so the rule converges geometrically). It needs the input column to be
Gaussian, which holds where the norm reads a sum of many random projections: pre-norm with
any residual, no residual, the final norm. In the post-norm position the residual stream
itself is a BatchNorm output (not Gaussian), so there it is an approximation.

Causal BatchNorm (statistics over the batch and positions <= t) has one normaliser per
position and no closed form here: causal_batchnorm_map estimates E[y y^T] by Monte Carlo
over seeded Gaussian columns (error O(n_samples^-1/2) per entry), exactly as a wide model
with n_samples channels would.

Evaluation mode at init uses the running statistics (mean 0, variance 1): y = x / sqrt(1 + eps),
K -> K / (1 + eps), per sequence; PRepBN at lambda = 0 in evaluation mode at init is
RepBN(x) = x / sqrt(1 + eps) + eta x, K -> (eta + (1 + eps)^-1/2)^2 K: not a normalisation,
so a Pre-LN residual stream through it grows geometrically with depth (docs/norms.md §3).
PRepBN at init with prepbn_steps > 0 is LayerNorm
(lambda = 1): Sigma -> C. GroupNorm normalises each token within G groups of m = C / G
channels; as m -> inf every group's mean tends to 0 and its variance to the token's q, so its
map is LayerNorm's, Sigma -> C, for any fixed G (fluctuations O(m^-1/2)). Not known here:
PRepBN mid-schedule or with prepbn_steps = 0 under batch statistics (the cross term
E[x y^T] of RepBN = BN(x) + eta x); init_norm_map raises NotImplementedError for it.

Everything is float64 NumPy; a configuration is read by duck typing (norm, norm_causal,
prepbn_steps, prepbn_eta). Not here: the layers themselves (nanospa/beyond/norms.py).
"""
import numpy as np

from .. import inputs
from ..kernels import normalised_kernel
from ..maps import input_kernel
from ..local_maps import LocalMaps

DYT_ALPHA = 0.5             # DyT's initial alpha: DyT(x) = tanh(alpha x) at init (the model uses it)

BATCH_NORM_EPS = 1e-5        # added to BatchNorm's variance (PyTorch's default); the model uses it
LOG_U_STEP = 0.05            # trapezoidal step in log u for batchnorm_map's integral
LOG_U_SPAN = (-60.0, 90.0)   # log u range beyond log(1 / (N lambda_max)): integrand below 1e-19 outside
EIGEN_FLOOR = 1e-13          # eigenvalues of P K P below this (relative to the largest) count as 0
CAUSAL_SAMPLES = 20000       # causal_batchnorm_map's default number of Monte Carlo columns


def batch_attention(A, B):
    """The attention matrix of B sequences at once, kron(I_B, A): (B T, B T)."""
    return np.kron(np.eye(B), np.asarray(A, dtype=np.float64))


def _centred(K):
    N = K.shape[0]
    P = np.eye(N) - 1.0 / N
    return P @ K @ P


def batchnorm_map(K, eps=BATCH_NORM_EPS, concentrated=False):
    """BatchNorm's wide-limit map on the kernel K (N, N) of all tokens of a batch: E[y y^T]
    with y = P x / sqrt(x^T P x / N + eps), x ~ N(0, K) (module docstring). concentrated=True:
    the large-N approximation P K P / (tr(P K P) / N + eps)."""
    K = np.asarray(K, dtype=np.float64)
    N = K.shape[0]
    M = _centred(K)
    if concentrated:
        return M / (np.trace(M) / N + eps)
    lam, U = np.linalg.eigh((M + M.T) / 2)
    lam = np.where(lam > EIGEN_FLOOR * max(lam.max(), 0.0), lam, 0.0)
    if not lam.any():
        return np.zeros_like(K)
    v = np.arange(*LOG_U_SPAN, LOG_U_STEP) - np.log(N * lam.max())
    u = np.exp(v)[:, None]                                         # (n, 1)
    log_prod = -0.5 * np.log1p(2.0 * u * lam).sum(axis=1, keepdims=True)
    f = u * N * lam * np.exp(log_prod - N * eps * u) / (1.0 + 2.0 * u * lam)   # (n, N): du = u dv
    e = LOG_U_STEP * (f.sum(axis=0) - 0.5 * (f[0] + f[-1]))        # the trapezoidal rule
    return (U * e) @ U.T


def causal_batchnorm_map(K, B, eps=BATCH_NORM_EPS, n_samples=CAUSAL_SAMPLES, seed=0):
    """Causal BatchNorm's map on the kernel K (B T, B T) of B sequences, by Monte Carlo:
    columns x ~ N(0, K) as (B, T), each position t normalised by the mean and variance over
    the batch and positions <= t, E[y y^T] averaged over n_samples seeded columns."""
    K = np.asarray(K, dtype=np.float64)
    N = K.shape[0]
    T = N // B
    w, V = np.linalg.eigh((K + K.T) / 2)
    root = V * np.sqrt(np.clip(w, 0.0, None))                    # root root^T = K
    X = (np.random.default_rng(seed).standard_normal((n_samples, N)) @ root.T).reshape(n_samples, B, T)
    n = B * np.arange(1, T + 1)                                    # tokens in each window
    mean = X.sum(axis=1).cumsum(axis=1) / n                        # (n_samples, T)
    var = (X * X).sum(axis=1).cumsum(axis=1) / n - mean ** 2
    Y = ((X - mean[:, None]) / np.sqrt(var[:, None] + eps)).reshape(n_samples, N)
    return Y.T @ Y / n_samples


def running_batchnorm_map(Sigma, mean=0.0, var=1.0, eps=BATCH_NORM_EPS):
    """BatchNorm in evaluation mode with running statistics mean 0 (the only mean a zero-mean
    wide limit allows) and variance var: y = x / sqrt(var + eps), Sigma -> Sigma / (var + eps)."""
    if mean != 0.0:
        raise ValueError("running_batchnorm_map: only a zero running mean has a kernel map here")
    return np.asarray(Sigma, dtype=np.float64) / (var + eps)


def init_norm_map(Sigma, cfg, batch=None):
    """The map at init of cfg's BatchNorm or PRepBN (cfg.norm in batchnorm, prepbn) or
    GroupNorm. batch None: evaluation mode (running statistics at their initial values),
    Sigma per sequence; batch=B: training mode, Sigma the (B T, B T) kernel of the batch."""
    if cfg.norm == "groupnorm" or (cfg.norm == "prepbn" and cfg.prepbn_steps > 0):
        return normalised_kernel(Sigma)                            # GroupNorm; PRepBN at lambda = 1
    if cfg.norm == "prepbn":                                       # lambda = 0: RepBN(x) = BN(x) + eta x
        if batch is None:
            return np.asarray(Sigma, dtype=np.float64) * (cfg.prepbn_eta + 1.0 / np.sqrt(1.0 + BATCH_NORM_EPS)) ** 2
        raise NotImplementedError("PRepBN with prepbn_steps=0 under batch statistics: no kernel map "
                                  "(the cross term of BN(x) + eta x is not implemented)")
    if batch is None:
        return running_batchnorm_map(Sigma)
    if cfg.norm_causal:
        return causal_batchnorm_map(Sigma, batch)
    return batchnorm_map(Sigma)


def dyt_map(Sigma, alpha=DYT_ALPHA):
    """Kernel of DyT(x) = tanh(alpha x) (weight 1, bias 0 at init), u ~ N(0, Sigma)."""
    maps = LocalMaps(lambda x: np.tanh(alpha * x))
    return maps.kernel(Sigma)


def norm_kernel(cfg, Sigma, batch=None):
    """maps.norm_kernel for the norms beyond LayerNorm and RMSNorm: DyT, BatchNorm, PRepBN,
    GroupNorm (ValueError naming any other)."""
    if cfg.norm == "dyt":
        return dyt_map(Sigma)
    if cfg.norm in ("batchnorm", "prepbn", "groupnorm"):
        return init_norm_map(Sigma, cfg, batch)
    raise ValueError(f"no kernel map for norm {cfg.norm!r}")


def batch_input_kernel(tokens, pos="none", n_embd=None, pos_variance=inputs.POS_VARIANCE):
    """Sigma_0 of all B T tokens of a batch (B, T) at once, (B T, B T) in sequence-major order
    (index b T + t), for norms whose statistics couple the sequences:
    sigma_e^2 1[same token id] between any two tokens, plus the positional kernel of
    input_kernel between positions t and t' of any two sequences (the same table row)."""
    t = np.asarray(tokens)
    if t.ndim != 2 or t.size == 0:
        raise ValueError(f"tokens must be a non-empty (B, T) array, got shape {t.shape}")
    B, T = t.shape
    flat = t.reshape(-1)
    var_e = 1.0 if pos not in inputs.ADDITIVE_POSITIONS else 1.0 - pos_variance
    positions = input_kernel(T=T, pos=pos, n_embd=n_embd, pos_variance=pos_variance) - var_e * np.eye(T)
    return var_e * (flat[:, None] == flat[None, :]) + np.tile(positions, (B, B))
