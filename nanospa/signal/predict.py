"""Predicted kernels of a whole model at initialisation, sublayer by sublayer (wide limit).

Implements docs/method.md §3.2 (attention maps Sigma -> A Sigma A^T), §4 (Value-SkipInit
at init: identity), §10 (MLP kernel map, the combined kernel of E-SPA with shaped MLPs),
§11 (the input kernel Sigma_0 of a token sequence) and the diagnostics of §13; the
kernel-budget policies that use these maps are in budget.py and docs/kernel_budget.md.

``predict_kernels(config)`` walks the same block structure as nanospa.model.GPT:

    embedding        Sigma_0 (input_kernel: repeated tokens, positional encodings)
    attention        Sigma -> A Sigma A^T, A = D_l softmax(B_l) (SPA, exact at init), I
                     (Value-SkipInit, exact), the uniform causal matrix (softmax with
                     zero_query, exact), or for softmax with random W^Q, W^K a mean-field
                     estimate (see softmax_samples below)
    MLP              Sigma'_ij = E[phi_hat(u_i) phi_hat(u_j)], u ~ N(0, Sigma): the C-map on
                     correlations with the Q-map on the diagonal (act_transform.LocalMaps)
    residual         Sigma_x + Sigma_h (standard), a^2 Sigma_x + b^2 Sigma_h (normalised):
                     the cross terms vanish because W^O and W_2 are random orthogonal
                     matrices independent of X
    norm             LayerNorm / RMSNorm: Sigma -> C (q = 1; the feature mean is O(d^-1/2));
                     DyT: the kernel map of tanh(alpha x) with its initial alpha

Everything is float64 NumPy. "Wide limit" means n_embd -> inf with the model's own
initialisation (docs/method.md §2.4): the predictions hold exactly there, and at finite
width up to O(d^-1/2) fluctuations (tests/test_signal_predict.py compares with width 1024).

Notation (docs/method.md §1, §10)

    T            sequence length (config.block_size unless sigma_0 says otherwise)
    L            number of blocks
    Sigma        (T, T) kernel X X^T / d; its diagonal holds the q-values
    C            normalised kernel diag(Sigma)^-1/2 Sigma diag(Sigma)^-1/2
    A_l          effective attention matrix of block l (T, T), lower triangular
    B_l, D_l     SPA bias and row rescaling: A_l = diag(D_l) softmax(B_l)
    sigma_e^2    token-embedding variance per coordinate, sigma_p^2 that of positions
"""
import math
from dataclasses import dataclass, field

import numpy as np

from .act_transform import ActivationTransform, LocalMaps
from .kernels import check_T, kernel_stats, normalised_kernel, uniform_causal_attention

POS_VARIANCE = 0.5          # share of q = 1 given to positions when pos != "none" (init.py)
DYT_ALPHA = 0.5             # DyT's initial alpha (nn.DyT)
SUBLAYERS = ("attn_branch", "attn", "mlp_branch", "mlp")


# ------------------------------------------------------------------ input kernel (§11)

def sinusoidal_encoding(T, n_embd, pos_variance=POS_VARIANCE):
    """The model's sinusoidal positions (T, n_embd), mean square pos_variance per coordinate."""
    T = check_T(T)
    pos = np.arange(T)[:, None]
    freq = np.exp(-math.log(10000.0) * (np.arange(0, n_embd, 2) / n_embd))
    pe = np.zeros((T, n_embd))
    pe[:, 0::2] = np.sin(pos * freq)
    pe[:, 1::2] = np.cos(pos * freq)[:, : n_embd // 2]
    return pe * math.sqrt(2.0 * pos_variance)


def input_kernel(tokens=None, T=None, pos="none", n_embd=None, pos_variance=POS_VARIANCE):
    """Sigma_0 of the embedding output in the wide limit (method §11), (T, T).

        Sigma_0[i, j] = sigma_e^2 1[t_i = t_j] + sigma_p^2 1[i = j]      pos = "learned"
        Sigma_0[i, j] = sigma_e^2 1[t_i = t_j] + (P P^T / d)[i, j]       pos = "sinusoidal"
        Sigma_0[i, j] = 1[t_i = t_j]                                     pos = "none"

    with sigma_p^2 = pos_variance and sigma_e^2 = 1 - sigma_p^2 (init.py; sigma_e^2 = 1
    without positions). tokens: a (T,) sequence of ids, or None for T distinct tokens
    (then Sigma_0 = I for pos "none" / "learned"). The sinusoidal term is the exact
    P P^T / d of the model's encoding, so it needs n_embd.
    """
    if tokens is None:
        if T is None:
            raise ValueError("input_kernel needs tokens or T")
        T = check_T(T)
        same = np.eye(T)
    else:
        t = np.asarray(tokens)
        if t.ndim != 1 or t.size == 0:
            raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {t.shape}")
        if T is not None and check_T(T) != t.size:
            raise ValueError(f"T={T} does not match len(tokens)={t.size}")
        T = t.size
        same = (t[:, None] == t[None, :]).astype(np.float64)
    if pos == "none":
        return same
    if not 0.0 < pos_variance < 1.0:
        raise ValueError(f"pos_variance must be in (0, 1), got {pos_variance}")
    if pos == "learned":
        return (1.0 - pos_variance) * same + pos_variance * np.eye(T)
    if pos == "sinusoidal":
        if not n_embd:
            raise ValueError("input_kernel with pos='sinusoidal' needs n_embd")
        P = sinusoidal_encoding(T, n_embd, pos_variance)
        return (1.0 - pos_variance) * same + P @ P.T / n_embd
    raise ValueError(f"pos={pos!r} is not one of ['none', 'learned', 'sinusoidal']")


sigma0_from_tokens = input_kernel


# ------------------------------------------------------------------ sublayer kernel maps

TINY = 1e-250               # entries below this are flushed to 0: subnormals slow matmuls ~10x


def flush(M):
    """M with |entries| < TINY set to 0 (exp underflow of SPA biases gives subnormals)."""
    return np.where(np.abs(M) < TINY, 0.0, M)


def attention_map(Sigma, A):
    """A Sigma A^T: the kernel after an attention sublayer whose heads share A and whose
    W^V W^O is orthogonal (method §3.2). Sigma, A: (T, T)."""
    return flush(A @ Sigma @ A.T)


def softmax_attention_map(Sigma, n_samples=32, seed=0):
    """Mean-field kernel map of causal softmax attention with random W^Q, W^K ~ N(0, 1/d)
    at init, estimated by Monte Carlo: in the wide limit the logits of one head are a
    Gaussian matrix with Cov(l_ij, l_i'j') = Sigma_ii' Sigma_jj' (queries and keys are
    independent Gaussian projections of the same tokens), so

        Sigma' = E[P Sigma P^T],  P = softmax_causal(G),  G = chol(Sigma) Z chol(Sigma)^T

    with Z a (T, T) standard normal matrix; averaging over the H heads of a wide layer
    gives the expectation. n_samples = 0 returns the uniform-attention approximation
    P = E[P] (exact with zero queries, and the mean of P when all q-values are equal).
    The estimate is seeded (deterministic); its Monte Carlo error is O(n_samples^-1/2)
    relative to the off-uniform part."""
    T = Sigma.shape[0]
    P0 = uniform_causal_attention(T)
    if n_samples <= 0:
        return attention_map(Sigma, P0)
    rng = np.random.default_rng(seed)
    w, V = np.linalg.eigh(Sigma)
    root = V * np.sqrt(np.clip(w, 0.0, None))                  # root root^T = Sigma
    mask = np.tril(np.ones((T, T), dtype=bool))
    out = np.zeros_like(Sigma)
    for _ in range(n_samples):
        G = root @ rng.standard_normal((T, T)) @ root.T
        G = np.where(mask, G, -np.inf)
        G -= G.max(axis=1, keepdims=True)
        P = np.exp(G)
        P /= P.sum(axis=1, keepdims=True)
        out += P @ Sigma @ P.T
    return out / n_samples


def normalise(Sigma):
    """LayerNorm / RMSNorm in the wide limit: every token rescaled to q = 1 (Sigma -> C)."""
    return normalised_kernel(Sigma)


def _phi_hat(activation):
    """A float64 phi_hat for LocalMaps from a plan's activation dict(base, method, params),
    or None for the identity ("linear")."""
    base, params = activation["base"], dict(activation.get("params") or {})
    if base in ("linear", "identity"):
        return None
    if base == "leaky_relu" and "negative_slope" not in params:
        params["negative_slope"] = 0.01                       # init.Activation.PLAIN_SLOPE
    return ActivationTransform(base, activation.get("method") or "none", None, params)


class MLPMap:
    """The wide-limit kernel map of MLP(X) = phi_hat(X W_1) W_2 with the model's init
    (W_1 W_1^T = m I, W_2 with orthonormal columns): Sigma' = E[phi_hat(u) phi_hat(u)^T],
    u ~ N(0, Sigma), for any diagonal (method §10). activation: dict(base, method, params)
    as in budget.Plan.activation. Also gives C(c) and its inverse on unit-q kernels."""

    def __init__(self, activation):
        self.activation = dict(activation)
        self.phi = _phi_hat(self.activation)
        self.maps = None if self.phi is None else LocalMaps(self.phi)

    @property
    def is_identity(self):
        return self.phi is None

    def __call__(self, Sigma):
        if self.maps is None:
            return np.array(Sigma, dtype=np.float64, copy=True)
        return self.maps.kernel(Sigma)

    def Q1(self):
        """Q(1), the q-value an MLP gives a q = 1 token (1 for shaped activations)."""
        return 1.0 if self.maps is None else float(self.maps.Q(1.0))

    def C(self, c):
        return np.asarray(c, dtype=np.float64) if self.maps is None else self.maps.C(c)

    def C_inverse(self, c):
        """C^-1(c) elementwise for c in [C(-1), 1] by bisection (C is increasing);
        entries below C(-1) raise ValueError."""
        c = np.asarray(c, dtype=np.float64)
        if self.maps is None:
            return c.copy()
        lo_val = float(self.C(-1.0))
        if np.any(c < lo_val - 1e-12) or np.any(c > 1.0 + 1e-12):
            raise ValueError(f"C^-1 needs c in [{lo_val:.4g}, 1], got [{c.min():.4g}, {c.max():.4g}]")
        lo, hi = np.full(c.shape, -1.0), np.ones(c.shape)
        for _ in range(60):                                   # 2^-60 * 2: below float64 rounding
            mid = 0.5 * (lo + hi)
            below = self.C(mid) < c
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return 0.5 * (lo + hi)


def dyt_map(Sigma, alpha=DYT_ALPHA):
    """Kernel of DyT(x) = tanh(alpha x) (weight 1, bias 0 at init), u ~ N(0, Sigma)."""
    maps = LocalMaps(lambda x: np.tanh(alpha * x))
    return maps.kernel(Sigma)


class BlockMaps:
    """The wide-limit maps of one model configuration's sublayers (method §2.2):

        residual none        X' = f(N(X))
        residual standard    X' = X + f(N(X))          (pre)   N(X + f(X)) (post)
        residual normalised  X' = a X + b f(N(X)),  a^2 + b^2 = 1

    applied to kernels: sublayer(Sigma, f) -> (branch kernel, combined kernel)."""

    def __init__(self, cfg, activation):
        self.cfg = cfg
        self.mlp_map = MLPMap(activation)
        self.a2 = 1.0 - cfg.residual_beta ** 2
        self.b2 = cfg.residual_beta ** 2

    def norm(self, Sigma):
        if self.cfg.norm in ("layernorm", "rmsnorm"):
            return normalise(Sigma)
        if self.cfg.norm == "dyt":
            return dyt_map(Sigma)
        return Sigma

    def branch_input(self, Sigma):
        return self.norm(Sigma) if self.cfg.norm_position == "pre" else Sigma

    def combine(self, Sigma_x, Sigma_h):
        r = self.cfg.residual
        if r == "standard":
            out = Sigma_x + Sigma_h
        elif r == "normalised":
            out = self.a2 * Sigma_x + self.b2 * Sigma_h
        else:
            out = Sigma_h
        if self.cfg.norm != "none" and self.cfg.norm_position == "post":
            out = self.norm(out)
        return out

    def sublayer(self, Sigma, f):
        h = f(self.branch_input(Sigma))
        return h, self.combine(Sigma, h)

    def final(self, Sigma):
        return self.norm(Sigma) if self.cfg.uses_final_norm else Sigma


# ------------------------------------------------------------------ the whole model

def effective_attention(cfg, plan, layer, T):
    """A_l of block `layer` (1-based) at init, (T, T), or None for softmax with random
    queries (then the kernel map is softmax_attention_map)."""
    if cfg.attention in ("uspa", "espa"):
        spec = plan.layers[layer - 1]
        with np.errstate(under="ignore"):
            return flush(np.tril(np.exp(spec["B"][:T, :T])) * spec["D"][:T, None])
    if cfg.attention == "value_skipinit":
        return np.eye(T)                                      # alpha I + beta P, beta = 0
    if cfg.zero_query:
        return uniform_causal_attention(T)
    return None


@dataclass
class KernelPrediction:
    """predict_kernels' result. sigma_0: (T, T) input kernel; layers: one dict per block
    l = 1..L with the kernels (T, T) after each sublayer:

        attn_branch   the attention sublayer's output before any residual (model.trace's attn_out)
        attn          after the attention sublayer (residual, post-norm included)
        mlp_branch    the MLP's output before any residual
        mlp           the block output (model.trace's hidden[l])
        target        the attention-only SPA target Sigma_l (unit diagonal), or None
        A             the effective attention matrix used (None: softmax mean field)

    final: the kernel the head sees (after the final norm, if any)."""
    config: object
    sigma_0: np.ndarray
    layers: list = field(default_factory=list)
    final: np.ndarray = None
    notes: list = field(default_factory=list)

    @property
    def T(self):
        return self.sigma_0.shape[0]

    def kernel(self, layer, sublayer="mlp"):
        """The predicted kernel after `sublayer` of block `layer` (1-based; 0 = input)."""
        if layer == 0:
            return self.sigma_0
        if sublayer not in SUBLAYERS + ("target",):
            raise ValueError(f"sublayer={sublayer!r} is not one of {list(SUBLAYERS) + ['target']}")
        return self.layers[layer - 1][sublayer]

    def q(self, layer, sublayer="mlp"):
        """q-value of every position, (T,)."""
        return np.diagonal(self.kernel(layer, sublayer)).copy()

    def stats(self, layer, sublayer="mlp"):
        """kernels.kernel_stats of one predicted kernel."""
        return kernel_stats(self.kernel(layer, sublayer))

    def rows(self, sublayers=("attn", "mlp")):
        """One dict per (layer, sublayer): layer, sublayer, the kernel statistics and, for
        SPA models, the attention-only target's mean off-diagonal and adjacent mean."""
        out = [dict(layer=0, sublayer="input", **kernel_stats(self.sigma_0))]
        for l, rec in enumerate(self.layers, start=1):
            for s in sublayers:
                row = dict(layer=l, sublayer=s, **kernel_stats(rec[s]))
                if rec["target"] is not None:
                    t = kernel_stats(rec["target"])
                    row.update(target_mean_offdiag=t["mean_offdiag"], target_adjacent=t["adjacent_mean"])
                out.append(row)
        return out

    def table(self, sublayers=("attn", "mlp"), every=1):
        """A plain-text table of rows(), every `every`-th layer (and the last)."""
        L = len(self.layers)
        head = (f"{'layer':>5} {'sub':>5} {'q_min':>8} {'q_mean':>8} {'q_max':>8} "
                f"{'C_mean':>7} {'C_min':>7} {'C_adj':>7} {'first-last':>10} {'target':>7}")
        lines = [head]
        for row in self.rows(sublayers):
            l = row["layer"]
            if l not in (0, L) and (l % every):
                continue
            tgt = row.get("target_mean_offdiag")
            lines.append(f"{l:>5} {row['sublayer'][:5]:>5} {row['q_min']:8.3f} {row['q_mean']:8.3f} "
                         f"{row['q_max']:8.3f} {row['mean_offdiag']:7.4f} {row['min_entry']:7.4f} "
                         f"{row['adjacent_mean']:7.4f} {row['first_to_last']:10.4f} "
                         + (f"{tgt:7.4f}" if tgt is not None else f"{'-':>7}"))
        return "\n".join(lines)


def predict_kernels(config, sigma_0=None, plan=None, softmax_samples=32):
    """Predicted (wide-limit) kernels of GPT(config) at initialisation after every sublayer.

    config: a GPTConfig. sigma_0: the input kernel (T, T), T <= block_size; default the
    distinct-token kernel input_kernel(T=block_size, pos=config.pos, ...), which is I for
    pos "none"/"learned". plan: budget.make_plan(config) unless given (pass it to avoid
    rebuilding). softmax_samples: Monte Carlo samples for softmax attention with random
    queries (softmax_attention_map; 0 = uniform causal attention, the zero-query map).
    Returns a KernelPrediction. Exact at init for SPA (W^Q = 0), Value-SkipInit and
    zero-query softmax in the wide limit; softmax with random queries is a mean-field
    estimate (its notes say so)."""
    from .budget import make_plan                                # budget imports this module
    if plan is None:
        plan = make_plan(config)
    if sigma_0 is None:
        sigma_0 = input_kernel(T=config.block_size, pos=config.pos, n_embd=config.n_embd)
    sigma_0 = np.asarray(sigma_0, dtype=np.float64)
    T = sigma_0.shape[0]
    if sigma_0.shape != (T, T) or T > config.block_size:
        raise ValueError(f"sigma_0 must be (T, T) with T <= block_size={config.block_size}, "
                         f"got shape {sigma_0.shape}")
    maps = BlockMaps(config, plan.activation_spec if hasattr(plan, "activation_spec") else plan.activation)
    pred = KernelPrediction(config=config, sigma_0=sigma_0)
    if config.attention == "softmax" and not config.zero_query:
        pred.notes.append("softmax attention with random W^Q, W^K: mean-field estimate "
                          f"E[P Sigma P^T] from {softmax_samples} Gaussian-logit samples"
                          if softmax_samples > 0 else
                          "softmax attention with random W^Q, W^K: approximated by uniform "
                          "causal attention")
    targets = plan_targets(config, plan, T)
    S = sigma_0
    for l in range(1, config.n_layer + 1):
        A = effective_attention(config, plan, l, T)
        if A is None:
            f_att = lambda X: softmax_attention_map(X, softmax_samples, seed=l)
        else:
            f_att = lambda X, A=A: attention_map(X, A)
        h_att, S = maps.sublayer(S, f_att)
        h_mlp, S_out = maps.sublayer(S, maps.mlp_map)
        pred.layers.append(dict(attn_branch=h_att, attn=S, mlp_branch=h_mlp, mlp=S_out,
                                target=targets[l - 1], A=A))
        S = S_out
    pred.final = maps.final(S)
    return pred


def plan_targets(cfg, plan, T):
    """The attention-only SPA targets Sigma_1..Sigma_L the plan's schedule aims at (None
    entries for non-SPA attention)."""
    from .kernels import espa_kernel, uspa_kernel
    L = cfg.n_layer
    if cfg.attention == "espa" and plan.layers:
        return [espa_kernel(T, plan.layers[l]["gamma"]) for l in range(L)]
    if cfg.attention == "uspa" and plan.layers:
        return [uspa_kernel(T, plan.layers[l]["rho"]) for l in range(L)]
    return [None] * L


def measured_kernels(model, idx):
    """Empirical kernels of a model on a batch idx (B, T), averaged over the batch, in the
    same layout as KernelPrediction.layers (attn_branch and mlp only: what model.trace
    records), plus the input kernel. Returns dict(sigma_0, attn_branch=[...], mlp=[...])."""
    from .kernels import kernel_matrix
    tr = model.trace(idx)
    return dict(sigma_0=kernel_matrix(tr.hidden[0], mean=True),
                attn_branch=[kernel_matrix(h, mean=True) for h in tr.attn_out],
                mlp=[kernel_matrix(h, mean=True) for h in tr.hidden[1:]])


def main(argv=None):
    """Command-line entry (argv: --key=value ...): print the per-sublayer prediction table of
    one configuration; every GPTConfig field is a setting, --every=N prints every N-th layer.
    For a command-line tool to dispatch to (nanospa.signal's __main__). Returns the exit status."""
    import sys
    from dataclasses import fields
    from nanospa.settings import SettingsError, help_text, parse_settings, wants_help
    from nanospa.model import GPTConfig
    argv = sys.argv[1:] if argv is None else list(argv)
    defaults = {f.name: getattr(GPTConfig(), f.name) for f in fields(GPTConfig)}
    defaults.update(every=1, softmax_samples=32)
    if wants_help(argv):
        print(help_text("python -m nanospa.signal.predict [--key=value ...]: predicted kernels at init",
                        defaults, dict(every="print every N-th layer (and the last)",
                                       softmax_samples="Monte Carlo samples for softmax attention")))
        return 0
    try:
        s = parse_settings(argv, defaults)
        cfg = GPTConfig(**{k: s[k] for k in defaults if k not in ("every", "softmax_samples")})
        pred = predict_kernels(cfg, softmax_samples=s["softmax_samples"])
    except (SettingsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from .budget import make_plan
    info = make_plan(cfg).info
    print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()
                    if not isinstance(v, list)))
    print(pred.table(every=s["every"]))
    for note in pred.notes:
        print(f"note: {note}")
    return 0
