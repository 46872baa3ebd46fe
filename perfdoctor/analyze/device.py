"""Device-side metrics: kernel statistics, launch-boundness and tensor-core use.

Tensor-core kernels are recognised by name (cuBLAS/cuDNN/CUTLASS naming: h884, s1688, 16816,
xmma, wgmma, tensorop ...), as the TensorBoard plugin does. A kernel is tensor-core *eligible*
when it is a GEMM/convolution by name, or was launched by a GEMM/convolution op.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import isin, median
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

TC_KERNEL_RX = re.compile(
    r"h884|s884|h1688|s1688|i8816|c1688|16816|hmma|xmma|wgmma|tensorop|884gemm|1688gemm|"
    r"dgrad_1x1_stride_2x2|first_layer_wgrad_kernel|conv1x1|conv2d_c1_k1|direct_group", re.I)
ELIGIBLE_KERNEL_RX = re.compile(
    r"gemm|conv|cudnn|winograd|implicit_convolve|fprop|dgrad|wgrad|cutlass|xmma|Cijk_", re.I)
ELIGIBLE_OP_RX = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_?conv|cudnn_conv|convolution|"
    r"_convolution|mkldnn_conv|miopen_conv|_scaled_dot_product|scaled_dot_product)")


def device_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    total = float(steps.duration.sum())
    lo, hi = steps.span
    kr = np.flatnonzero(k.kernel)
    kr = kr[(t.ts[kr] >= lo) & (t.ts[kr] < hi)]
    out: dict = {"gpu.kernels_per_step": len(kr) / len(steps),
                 "gpu.kernel_median_us": median(t.dur[kr]) if len(kr) else None}
    s, e = intervals.clip(t.ts[kr], t.ts[kr] + t.dur[kr], lo, hi)
    out["gpu.kernel_busy_share"] = intervals.total(s, e) / total
    dev, launch = device_launch_index(t, k)
    is_k = k.kernel[dev] & (launch >= 0)
    if is_k.any():
        kd, lr = dev[is_k], launch[is_k]
        out["gpu.launch_bound_kernel_fraction"] = float(np.mean(t.dur[kd] < t.dur[lr]))
    else:
        out["gpu.launch_bound_kernel_fraction"] = None
    out.update(_tensor_cores(t, k, kr, total))
    return out


def _tensor_cores(t: EventTable, k: Kinds, kr: np.ndarray, total: float) -> dict:
    ktime = float(t.dur[kr].sum())
    if ktime <= 0:
        return {"tensor_core.kernel_share": None, "tensor_core.eligible_share": None,
                "tensor_core.eligible_step_share": None}
    tc = t.name_mask(lambda n: TC_KERNEL_RX.search(n) is not None)[kr]
    eligible = t.name_mask(lambda n: ELIGIBLE_KERNEL_RX.search(n) is not None)[kr] | tc
    eligible |= _launched_by_eligible_op(t, k, kr)
    etime = float(t.dur[kr][eligible].sum())
    return {"tensor_core.kernel_share": float(t.dur[kr][tc].sum()) / ktime,
            "tensor_core.eligible_share": etime / ktime,
            "tensor_core.eligible_step_share": etime / total}


def _launched_by_eligible_op(t: EventTable, k: Kinds, kr: np.ndarray) -> np.ndarray:
    """Kernels whose External id is that of a GEMM/convolution op."""
    ext = t.args["external_id"]
    kext = np.where(np.isnan(ext[kr]), t.args["external_id_legacy"][kr], ext[kr])
    ops = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: ELIGIBLE_OP_RX.match(n) is not None))
    op_ext = ext[ops]
    return isin(kext, op_ext[~np.isnan(op_ext)])
