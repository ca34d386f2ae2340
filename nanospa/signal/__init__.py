"""nanospa.signal: the signal-propagation maths of the paper in float64 NumPy (docs/method.md
§3-§11, §14; docs/activations.md; docs/kernel_budget.md).

A self-contained library: no module here imports anything from nanospa outside signal/
except the command line (__main__.py). Functions take the paper's quantities (T, L,
gamma_l, rho_l, activation targets); a model configuration is read by duck typing, never
imported. Reading order:

kernels.py        kernels, rank-collapse measures, SPA targets and schedules (§3, §4, §6, §7)
cholesky.py       checked Cholesky, the general transfer matrix, non-causal variant (§5, §9)
attn_bias.py      E-SPA / U-SPA closed forms in log space, B_l and D_l, A = diag(D) softmax(B) (§6-§8)
activations.py    the base activations, their derivatives, and phi_hat itself (PhiHat)
qc_maps.py        quadrature and the Q/C maps of an activation (docs/activations.md §2, §8)
depth_targets.py  per-layer targets from network-level ones (docs/activations.md §6)
act_transform.py  the DKS and TAT solvers (docs/activations.md §3-§5, §7)
inputs.py         the input kernel Sigma_0 and positional encodings (§11)
positions.py      positions in the attention logits: ALiBi, RoPE, E-SPA's prior (docs/positions.md)
maps.py           the wide-limit kernel map of each sublayer (§3.2, §10; DeepNorm, nGPT)
norm_maps.py      BatchNorm (batch kernels), causal BatchNorm, PRepBN at init, GroupNorm (docs/norms.md)
residuals.py      the constants of DeepNorm and nGPT (docs/residuals.md)
predict.py        predicted kernels of a whole model at init (§2.2, §13)
walks.py, budget.py  the kernel-budget policies and make_plan (docs/kernel_budget.md)
table.py          the per-layer derivation that `python -m nanospa.signal` prints
"""
from .kernels import (kernel_matrix, q_values, normalised_kernel, mean_offdiag, min_offdiag,
                      min_entry, effective_rank, kernel_stats, espa_kernel, uspa_kernel,
                      spa_kernel, espa_gammas, uspa_rhos, spa_schedule, uniform_causal_attention,
                      value_skipinit_attention)
from .cholesky import (checked_cholesky, transfer_matrix, sym_sqrt, noncausal_attention,
                       check_attention)
from .attn_bias import (espa_bias, uspa_bias, bias_block, layer_bias, dense_layer_bias,
                        espa_attention,
                        espa_attention_reference, uspa_attention, spa_matrix, rescale, realise,
                        log_attention_from, bias_and_rescale)
from .activations import LEAKY_RELU_SLOPE
from .qc_maps import q_map, c_map
from .act_transform import activation_transform, shaped_activation_names
from .inputs import POS_VARIANCE, POSITIONS, input_kernel, sinusoidal_encoding, token_variance
from .beyond.positions import alibi_slopes, rope_frequencies, spa_prior_config
from .maps import MLPMap
from .beyond.norm_maps import DYT_ALPHA
from .beyond.norm_maps import BATCH_NORM_EPS, batchnorm_map, causal_batchnorm_map
from .predict import predict_kernels, KernelPrediction
from .budget import make_plan, split_activation, BUDGETS, DEFAULT_BUDGET, Plan
