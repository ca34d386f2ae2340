"""nanospa.signal: signal-propagation maths in float64 NumPy (docs/method.md §3-§10, §14).

kernels.py      kernels, rank-collapse measures, SPA targets and schedules
cholesky.py     checked Cholesky, general transfer matrix, non-causal variant, checks
attn_bias.py    E-SPA / U-SPA closed forms, log space, bias B and rescale D
act_transform.py  Q/C maps and DKS/TAT activation transforms (docs/activations.md)
predict.py      predicted kernels of a whole model at init, the input kernel of a sequence
budget.py       the kernel-budget policies and make_plan (docs/kernel_budget.md)
"""
from .kernels import (kernel_matrix, q_values, normalised_kernel, mean_offdiag, min_offdiag,
                      min_entry, effective_rank, kernel_stats, espa_kernel, uspa_kernel,
                      espa_gammas, uspa_rhos, uniform_causal_attention,
                      value_skipinit_attention)
from .cholesky import (checked_cholesky, transfer_matrix, sym_sqrt, noncausal_attention,
                       check_attention)
from .attn_bias import (espa_log_attention, espa_attention, espa_bias_and_rescale,
                        uspa_attention, uspa_bias_and_rescale, spa_attention,
                        log_attention_from, bias_and_rescale, spa_layer, spa_layers)
from .act_transform import activation_transform, q_map, c_map, shaped_activation_names
from .predict import (predict_kernels, input_kernel, sigma0_from_tokens, KernelPrediction,
                      MLPMap, measured_kernels)
from .budget import make_plan, BUDGETS, DEFAULT_BUDGET, Plan
