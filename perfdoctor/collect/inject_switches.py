"""torch's own switches a script turns on, which `perfdoctor tune` turns off for a trial
(collect/inject.py's table): autograd anomaly detection (anomaly="off", PD374), torch.distributions'
argument checks (distribution_checks="off", PD379), and attention dropout inside
scaled_dot_product_attention (attention_dropout="off", PD381); and one rewrite of the script's
indexing, x[idx] gathered with index_select (gather_select=True, PD386); and glibc's malloc keeping
what it frees (keep_host_memory=True, PD393). Each function takes torch and
inject's session state (`st`: its changes, what was applied, the script's own calls)."""

from __future__ import annotations

import os

from perfdoctor.collect.dynamoskip import compiling_check


def set_anomaly(torch, st) -> None:
    """Count the script's turning autograd anomaly detection on (set_detect_anomaly(True),
    detect_anomaly(): both call torch.set_anomaly_enabled); with anomaly="off" it stays off."""
    orig = torch.set_anomaly_enabled
    off = st.changes.get("anomaly") == "off"

    def set_anomaly_enabled(enabled, *args, **kwargs):
        if enabled and os.getpid() == st.pid:
            st.anomaly_calls += 1
            if off:
                st.applied.add("anomaly")
                enabled = False
        return orig(enabled, *args, **kwargs)
    set_anomaly_enabled.__wrapped__ = orig
    torch.set_anomaly_enabled = set_anomaly_enabled


def distribution_checks(torch, st) -> None:
    """With distribution_checks="off": every torch.distributions distribution is built with
    validate_args=False, whatever the script passes or set as the default."""
    if st.changes.get("distribution_checks") != "off":
        return
    dist = torch.distributions.Distribution
    dist.set_default_validate_args(False)
    orig = dist.__init__
    compiling = compiling_check(torch)

    def __init__(self, batch_shape=torch.Size(), event_shape=torch.Size(), validate_args=None):
        if not compiling() and os.getpid() == st.pid:     # Dynamo cannot trace os.getpid: no graph break
            st.applied.add("distribution_checks")
        orig(self, batch_shape, event_shape, validate_args=False)
    __init__.__wrapped__ = orig
    dist.__init__ = __init__


def attention_dropout(torch, st) -> None:
    """With attention_dropout="off": scaled_dot_product_attention is called with dropout_p=0.
    torch.nn.functional's own callers (multi_head_attention_forward) look it up in the module's
    namespace, as models calling torch.nn.functional.scaled_dot_product_attention(...) do."""
    if st.changes.get("attention_dropout") != "off":
        return
    F = torch.nn.functional
    orig = F.scaled_dot_product_attention

    def scaled_dot_product_attention(*args, **kwargs):
        if len(args) > 4:                      # query, key, value, attn_mask, dropout_p, ...
            if args[4]:
                args = (*args[:4], 0.0, *args[5:])
                st.applied.add("attention_dropout")
        elif kwargs.get("dropout_p"):
            kwargs["dropout_p"] = 0.0
            st.applied.add("attention_dropout")
        return orig(*args, **kwargs)
    scaled_dot_product_attention.__wrapped__ = orig
    scaled_dot_product_attention.__doc__ = orig.__doc__
    F.scaled_dot_product_attention = scaled_dot_product_attention


def gather_select(torch, st) -> None:
    """With gather_select=True: x[idx] on a CPU tensor, idx a 1-D int64/int32 tensor of row numbers
    (none negative: index_select takes no negative numbers), is x.index_select(0, idx), the same
    rows; its backward is index_add_, where x[idx]'s is index_put_(accumulate=True). Any other
    index, a CUDA tensor, or code torch.compile traces goes to torch's own indexing."""
    if not st.changes.get("gather_select"):
        return
    Tensor = torch.Tensor
    orig = Tensor.__getitem__
    ints = (torch.int64, torch.int32)
    compiling = compiling_check(torch)

    def __getitem__(self, idx):
        if (isinstance(idx, Tensor) and idx.dim() == 1 and idx.dtype in ints and self.dim() >= 1
                and self.device.type == "cpu" and idx.device.type == "cpu" and not compiling()
                and (idx.numel() == 0 or int(idx.min()) >= 0)):
            if os.getpid() == st.pid:
                st.applied.add("gather_select")
            return self.index_select(0, idx)
        return orig(self, idx)
    __getitem__.__wrapped__ = orig
    Tensor.__getitem__ = __getitem__


# glibc's malloc: blocks up to 4 GiB from its heap, which it never trims below 64 GiB (the variables'
# values are sizes in bytes; glibc reads them at the process's first allocation)
KEEP_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}


def launch_env(changes: dict | None) -> dict:
    """The environment variables a change needs before python starts (collect/launcher.py sets
    them for the script's process): keep_host_memory's."""
    return dict(KEEP_ENV) if (changes or {}).get("keep_host_memory") else {}


def keep_host_memory(torch, st) -> None:
    """keep_host_memory=True (PD393): glibc's malloc keeps the blocks the step frees in the process
    (KEEP_ENV, set by the launcher) instead of unmapping each large one and faulting it in again
    the next step. Said not to apply where the variables did not reach the process or the C library
    is not glibc. (mallopt from inside the process, after torch's import, left a word-level LSTM
    5.6K faults a step of 85K and half of its kernel time: the variables took it to 340.)"""
    if not st.changes.get("keep_host_memory"):
        return
    import platform
    if platform.libc_ver()[0] != "glibc":
        raise RuntimeError("the C library is not glibc: its MALLOC_ variables do nothing")
    missing = [k for k, v in KEEP_ENV.items() if os.environ.get(k) != v]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set in the script's environment")
    st.applied.add("keep_host_memory")
