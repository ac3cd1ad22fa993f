"""The process-wide backend settings that decide what a rule answers, read once per propagate.

Convolution's layout follows the backend oneDNN or cuDNN would pick, and attention's the fused
kernel torch would pick; both read these flags, so memoized results are keyed by them.
"""
from __future__ import annotations

from typing import Hashable

import torch

from ..torch_compat import sdp_priority_order


def sdpa_backends() -> tuple[bool, bool, bool, bool]:
    """Whether flash, memory-efficient, math and cuDNN attention are enabled."""
    cuda = torch.backends.cuda
    return (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
            cuda.cudnn_sdp_enabled())


def environment() -> Hashable:
    """Every process-wide setting a result depends on: grad and inference mode (with grad on, inference
    mode still makes results that do not require grad), the default dtype, the backend flags."""
    mkldnn = torch.backends.mkldnn
    cudnn = torch.backends.cudnn
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
            mkldnn.is_available() and bool(mkldnn.enabled), bool(getattr(mkldnn, "deterministic", False)),
            bool(cudnn.enabled), bool(cudnn.deterministic), bool(cudnn.benchmark),
            torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(),
            sdpa_backends(), tuple(int(b) for b in sdp_priority_order()))
