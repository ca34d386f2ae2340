"""nanospa.signal: the signal-propagation maths of the paper in float64 NumPy (docs/method.md
§3-§11, §14; docs/activations.md; docs/kernel_budget.md).

A self-contained library: no module here imports anything from nanospa outside signal/
except the command line (__main__.py). Functions take the paper's quantities (T, L,
gamma_l, rho_l, activation targets); a model configuration is read by duck typing, never
imported. Reading order:

kernels.py        kernels and the SPA schedules (§3.1, §6, §7.3)
attn_bias.py      E-SPA / U-SPA closed forms in log space, B_l and D_l, A = diag(D) softmax(B) (§6-§8)
activations.py    the base activations, their derivatives, and phi_hat itself (PhiHat)
gaussian_means.py quadrature and TAT's leaky-ReLU closed forms (docs/activations.md §2, §5, §8)
depth_targets.py  per-layer targets from network-level ones (docs/activations.md §6)
act_transform.py  the DKS and TAT solvers (docs/activations.md §3-§5, §7)
inputs.py         the embedding's variances and positional encodings (§11)
plan.py           the plan: the schedule and the activation's targets, one plain value

Read second:

budget.py         the kernel budget that chooses the plan by default (nanospa's own idea;
walks.py          docs/kernel_budget.md) and the walk it is solved on, with A_l as a dense matrix
                  and the targets and schedules of either kind (spa_kernel, spa_schedule)
maps.py           the wide-limit kernel maps at init: the input kernel Sigma_0 and each
                  sublayer's map (§3.2, §10, §11), which the predictions and the budget's walk run
local_maps.py     the MLP's: the Q-map, the C-map and the map of a whole kernel (Hermite
                  series; docs/activations.md §2, §8; §10), through maps.MLPMap
collapse.py       rank collapse at init: the measures of a kernel, standard attention at init,
                  the mean field of softmax attention (§3.4, §4), which the predictions, the
                  table and the measurements read
cholesky.py       SPA in general, the dense references the tests hold the closed forms to:
                  the targets Sigma_l, checked Cholesky, the general transfer matrix and its
                  B_l and D_l, E-SPA's A_l entry by entry, the non-causal variant, a plan's
                  B_l and A_l = diag(D_l) softmax(B_l) as matrices (§5-§9)

table.py formats what `python -m nanospa.signal` prints. The maths of the schemes beyond the paper is in beyond/ (positions in the logits, the
norm family, DeepNorm's and nGPT's constants, the budget's other policies); nothing here
imports it until a configuration names one. The walk through a whole model (the kernels it
predicts at init) is nanospa/predict.py: it reads the model's variants, which live above.
"""
from .kernels import kernel_matrix, q_values, normalised_kernel, espa_gammas, uspa_rhos
from .cholesky import (espa_kernel, uspa_kernel, checked_cholesky, transfer_matrix, espa_attention_reference, sym_sqrt,
                       noncausal_attention, check_attention, log_attention_from, bias_and_rescale,
                       dense_layer_bias, realise)
from .attn_bias import espa_bias, uspa_bias, bias_block, layer_bias, rescale
from .activations import LEAKY_RELU_SLOPE
from .local_maps import q_map, c_map
from .act_transform import activation_transform, shaped_activation_names
from .inputs import POS_VARIANCE, sinusoidal_encoding, token_variance
from .maps import MLPMap, attention_map, input_kernel
from .collapse import (mean_offdiag, min_entry, effective_rank, kernel_stats, uniform_causal_attention,
                       value_skipinit_attention, softmax_attention_map)
from .plan import Plan, split_activation
from .walks import espa_attention, uspa_attention, spa_matrix, spa_kernel, spa_schedule
from .budget import make_plan, activation_spec, BUDGETS, DEFAULT_BUDGET
