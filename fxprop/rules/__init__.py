"""Hand-written rules, one file per op family. Importing this package registers them all.

| family | file |
|---|---|
| elementwise ops | `elementwise.py` |
| reductions (max, min, mean, median, mode, softmax) | `reductions.py` |
| histograms | `histograms.py` |
| sorting and searching (sort, bucketize) | `sorting.py` |
| random sampling (multinomial, uniform) | `sampling.py` |
| moving and joining elements (roll, cat, stack) | `movement.py` |
| reshaping (reshape: a view where the sizes allow one) | `reshaping.py` |
| matrix products | `linalg.py` |
| triangular parts of matrices (tril, triu) | `triangular.py` |
| indexing (index_select, index_add, boolean masks, masked_scatter) | `indexing.py` |
| ops whose output sizes or values depend on the data | `data_dependent.py` |
| convolution (and cuDNN's) | `conv.py` |
| pooling | `pooling.py` |
| upsampling and grid sampling | `upsample.py` |
| batch norm | `normalization.py` |
| scaled dot-product attention | `attention.py`, with CUDA's backend choice in `sdpa_backends.py` |
| recurrent modules | `recurrent.py` |
| fused optimizer steps | `optimizers.py` |
| calls that change process-wide state (seeding the RNG) | `global_state.py` |
| functional collectives (`_c10d_functional`: all_reduce, broadcast, wait_tensor, ...) | `collectives.py` |
| higher-order ops (cond, while_loop, map, scan, autocast and grad-mode regions, ...) | `higher_order/` |

Which rule handles a call, these or torch's own kernels, is decided by `fxprop.resolve.order`.
"""
from ..resolve.registry import registered_rules, rule, target_name, unregister
from . import (attention, collectives, conv, data_dependent, elementwise, histograms, indexing, linalg, movement,  # noqa: F401
               normalization, global_state, optimizers, pooling, recurrent, reductions, reshaping, sampling, sorting,
               triangular, upsample)
from . import higher_order  # noqa: F401

__all__ = ["registered_rules", "rule", "target_name", "unregister"]
