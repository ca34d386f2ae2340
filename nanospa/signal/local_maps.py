"""The MLP's kernel map of a whole (T, T) kernel, vectorised (docs/method.md §10): LocalMaps
of one phi_hat, which maps.MLPMap wraps for the predictions and the kernel budget's walk (the
plan and the model do not run it; read second).

Notation as in qc_maps.py, and

    h_n(q)       Hermite coefficient E[phi_hat(sqrt(q) z) He_n(z)] / sqrt(n!)

Not here: the quadrature, the Q/C maps and the leaky-ReLU closed forms it reads (qc_maps.py).
"""
import math

import numpy as np

from .qc_maps import _as_hat, _gh, _lrelu_bivariate, bivariate, c_map, q_map

_SERIES_NODES = (160, 320)   # Gauss-Hermite sizes tried for the Hermite series; hermegauss
                             # overflows beyond ~350 nodes
_SERIES_TAIL = 1e-13     # Parseval tail accepted for the series, relative to max(Q(q), 1)


def _norm_hermite(Z, N):
    """He_n(Z)/sqrt(n!) for n = 0..N, shape (N+1, len(Z)), by the stable recurrence."""
    H = np.empty((N + 1, Z.size))
    H[0] = 1.0
    if N >= 1:
        H[1] = Z
    for k in range(1, N):
        H[k + 1] = (Z * H[k] - math.sqrt(k) * H[k - 1]) / math.sqrt(k + 1)
    return H


class LocalMaps:
    """Vectorised kernel maps of one phi_hat (docs/method.md §10).

        C(c)          C-map for q = 1 inputs, any array of c in [-1, 1]
        Q(q)          Q-map, any array of q >= 0
        kernel(Sigma) Sigma'_ij = E[phi_hat(u_i) phi_hat(u_j)], u ~ N(0, Sigma): the exact
                      wide-limit kernel after an MLP nonlinearity, for any input kernel
                      (..., T, T), diagonal q-values not necessarily 1
        __call__      = C

    Smooth phi_hat: Hermite series Sigma'_ij = sum_n h_n(q_i) h_n(q_j) rho_ij^n, its
    truncation error (Parseval tail) checked below 1e-13 Q(q); entries whose q is too
    large for the series (steep phi_hat, q >~ 100) fall back to 2-D quadrature. Leaky
    ReLU: closed form. Other kinked (elu): split quadrature per entry (about 1 ms an
    entry: slow for large T).
    """

    def __init__(self, phi):
        self.phi = phi
        self._h = _as_hat(phi)
        self.mode = "closed form" if self._h.homogeneous else (
            "quadrature" if self._h.kink is not None else "hermite")
        self._c_coef = None

    def _coeffs(self, q):
        """h_n(q) for each q (shape (M,)) -> (A (M, N+1), ok (M,)): N grows until the
        Parseval tail Q(q) - sum_n h_n(q)^2 is below 1e-13 Q(q); ok marks converged rows."""
        for n_nodes in _SERIES_NODES:
            Z, W = _gh(n_nodes)
            N = n_nodes // 2                      # keep N well below n_nodes: honest tail
            F = self._h(np.sqrt(q)[:, None] * Z[None, :])                  # (M, n_nodes)
            A = (F * W) @ _norm_hermite(Z, N).T                            # (M, N+1)
            Q = (F * F) @ W
            ok = Q - np.sum(A * A, axis=1) <= _SERIES_TAIL * np.maximum(Q, 1.0)
            if np.all(ok):
                break
        return A, ok

    def C(self, c):
        c = np.asarray(c, dtype=np.float64)
        if np.any(np.abs(c) > 1.0):
            raise ValueError(f"c must lie in [-1, 1], got [{c.min()}, {c.max()}]")
        if self.mode != "hermite":
            return c_map(self.phi, c)
        if self._c_coef is None:
            A, ok = self._coeffs(np.array([1.0]))
            self._c_coef = A[0] * A[0] / np.sum(A[0] * A[0]) if ok[0] else False
        if self._c_coef is False:                # series too slow: quadrature per c
            return c_map(self.phi, c)
        return np.polynomial.polynomial.polyval(c, self._c_coef)[()]

    __call__ = C

    def Q(self, q):
        return q_map(self.phi, q)

    def kernel(self, Sigma):
        S = np.asarray(Sigma, dtype=np.float64)
        if S.ndim < 2 or S.shape[-1] != S.shape[-2]:
            raise ValueError(f"Sigma must have shape (..., T, T), got {S.shape}")
        q = np.diagonal(S, axis1=-2, axis2=-1)
        if np.any(q < 0):
            raise ValueError("Sigma has a negative diagonal entry")
        if self.mode == "closed form":
            return _lrelu_bivariate(self._h, q[..., :, None], q[..., None, :], S)
        den = np.sqrt(q[..., :, None] * q[..., None, :])
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = np.clip(np.where(den > 0, S / den, 0.0), -1.0, 1.0)
        out = np.zeros_like(S)
        todo = np.ones(S.shape, dtype=bool)      # entries left for per-entry quadrature
        if self.mode == "hermite":
            uq, inv = np.unique(q.ravel(), return_inverse=True)
            A, ok = self._coeffs(uq)
            A, ok = A[inv].reshape(q.shape + (-1,)), ok[inv].reshape(q.shape)   # (..., T, N+1)
            for k in range(A.shape[-1] - 1, -1, -1):                       # Horner in rho
                out = out * rho + A[..., :, None, k] * A[..., None, :, k]
            todo = ~(ok[..., :, None] & ok[..., None, :])
        for idx in zip(*np.nonzero(todo)):       # kinked phi_hat, or q beyond the series
            i, j = idx[-2], idx[-1]
            if j <= i:                           # symmetric: fill (i, j) and (j, i)
                qi, qj = q[idx[:-1]], q[idx[:-2] + (j,)]
                out[idx] = out[idx[:-2] + (j, i)] = bivariate(self._h, qi, qj, rho[idx])
        return out
