"""The best setting found by `perfdoctor tune`, worded as the code change to make.

Each knob becomes the line a user writes in the script (or the environment variable to set),
naming what the script does now when the baseline recorded it (inject.json): the DataLoader's
arguments as the script passed them, the optimizer class it built, the thread count it set.
"""

from __future__ import annotations

LOADER = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


def apply_text(changes: dict, inject: dict, cuda: bool) -> str:
    """Lines of code (and one environment variable) that make `changes` permanent."""
    if not changes:
        return "keep the script as it is: no change was measured faster than the baseline"
    lines = []
    loader = {k: changes[k] for k in LOADER if k in changes}
    if loader:
        asked = ((inject.get("loaders") or [{}])[0]).get("asked") or {}
        if loader.get("num_workers") == 0:     # torch refuses these without workers (as the trial set them)
            if asked.get("persistent_workers"):
                loader["persistent_workers"] = False
            if asked.get("prefetch_factor") is not None:
                loader["prefetch_factor"] = None
            if asked.get("multiprocessing_context") is not None:
                loader["multiprocessing_context"] = None
        args = ", ".join(f"{k}={v!r}" for k, v in loader.items())
        now = ", ".join(f"{k}={asked.get(k)!r}" for k in loader if k in asked)
        lines.append(f"DataLoader(..., {args})" + (f"  # the script has {now}" if now else ""))
        again = rebuilt(inject)
        if again > 1 and loader.get("persistent_workers"):
            lines.append(f"# the script built this DataLoader {again} times (per epoch?): build it once, before the "
                         "epoch loop, or its workers start again with each one, persistent or not")
    if "threads" in changes:
        asked = inject.get("threads_asked") or []
        now = f"  # the script sets {asked[-1]}" if asked else f"  # the script runs with {inject.get('threads')}" \
            if inject.get("threads") else ""
        lines.append(f"torch.set_num_threads({changes['threads']}){now}")
    if "optimizer" in changes:
        impl = changes["optimizer"]
        names = [o["class"] for o in inject.get("optimizers") or [] if impl in o.get("supports", [])]
        for name in dict.fromkeys(names) or ["Optimizer"]:
            lines.append(f"torch.optim.{name}(..., {impl}=True)")
    if changes.get("cudnn_benchmark"):
        lines.append("torch.backends.cudnn.benchmark = True")
    if changes.get("channels_last"):
        lines.append("model = model.to(memory_format=torch.channels_last)  # before the training loop; and each "
                     "input batch: x = x.to(memory_format=torch.channels_last)")
    if changes.get("tf32"):
        lines.append('torch.set_float32_matmul_precision("high"); torch.backends.cudnn.allow_tf32 = True')
    if changes.get("float32"):
        was = " / ".join(inject.get("float32_from") or []) or "float64"
        lines.append("model.float()  # and .float() on the tensors fed to it" +
                     (" (torch.from_numpy keeps numpy's float64)" if "float64" in was else "") +
                     f": the model trains in {was} now")
        inner = inject.get("float32_inner")
        if inner:     # model.float() alone would fail there: the forward's own float64 meets float32 weights
            example = "torch.double" if "float64" in was else f"torch.{was.split(' / ')[0]}"
            lines.append(f"# and float32 for the tensors the model's forward makes in {was} and passes to its "
                         f"{', '.join(inner)} (e.g. torch.zeros(..., dtype={example}) -> dtype=torch.float32)")
    if changes.get("autocast"):
        dev = "cuda" if cuda else "cpu"
        lines.append(f'with torch.autocast("{dev}", dtype=torch.{changes["autocast"]}):  '
                     "# around the model's forward (and the loss)")
    if changes.get("compile"):
        mode = f', mode="{changes["compile"]}"' if isinstance(changes["compile"], str) else ""
        lines.append(f"model = torch.compile(model{mode})  # before the training loop (what the trial ran; "
                     "model.compile() in place compiled nothing of an nn.Sequential on torch 2.13)")
    if changes.get("recompute") == "off":
        n = inject.get("checkpoint_calls")
        lines.append("y = block(x)  # instead of torch.utils.checkpoint.checkpoint(block, x): memory permitting"
                     + (f"; the script made {n} such calls" if n else ""))
    if changes.get("empty_cache") == "off":
        n = inject.get("empty_cache_calls")
        lines.append("# torch.cuda.empty_cache()  # remove it from the training loop"
                     + (f": the script made {n} calls" if n else ""))
    if changes.get("anomaly") == "off":
        lines.append("torch.autograd.set_detect_anomaly(False)  # or remove set_detect_anomaly(True) / detect_anomaly() "
                     "from the training run: a debugging mode")
    if changes.get("attention_dropout") == "off":
        lines.append("attention dropout 0 in training  # e.g. attention_probs_dropout_prob=0.0 (BERT), attn_pdrop=0.0 "
                     "(GPT-2), m.dropout = 0.0 on each nn.MultiheadAttention (nn.Transformer's dropout= would also "
                     "turn off its residual and feed-forward dropout), dropout_p=0.0 in scaled_dot_product_attention: "
                     "SDPA's fused CPU kernel takes no dropout")
    if changes.get("batch_scale"):
        asked = ((inject.get("loaders") or [{}])[0]).get("asked") or {}
        bs = asked.get("batch_size")
        k = changes["batch_scale"]
        lines.append(f"DataLoader(dataset, batch_size={bs * k if isinstance(bs, int) else f'{k} * batch_size'}, ...)  "
                     f"# {k}x the samples a step (the speed-up is in samples per second); scale the learning rate "
                     f"with it (lr x {k}, with a warm-up) and check the validation metric")
    if changes.get("gather_select"):
        lines.append("x.index_select(0, idx)  # instead of x[idx], idx a 1-D tensor of row numbers: the same rows; its "
                     "backward index_add_ instead of a one-row-at-a-time index_put_")
    if changes.get("distribution_checks") == "off":
        lines.append("torch.distributions.Distribution.set_default_validate_args(False)  # once at start-up, or "
                     "validate_args=False where a distribution is built")
    if changes.get("keep_iterator"):
        n = inject.get("iterator_starts")
        lines.append("it = iter(loader)  # once; then x, y = next(it) each step, and it = iter(loader) again only when "
                     "it runs out (StopIteration); loader.batch_size instead of next(iter(loader)) to read a batch's "
                     "shape" + (f": the script started {n} iterators" if n else ""))
    if changes.get("index_batches"):
        asked = ((inject.get("loaders") or [{}])[0]).get("asked") or {}
        bs = asked.get("batch_size") or "B"
        lines.append(f"DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), batch_size={bs}, drop_last=False), "
                     "batch_size=None)  # one dataset[[i1, ..., iB]] a batch, from torch.utils.data (SequentialSampler "
                     "without shuffle)" + (f": the script has batch_size={bs}" if asked.get("batch_size") else ""))
    if changes.get("save_every"):
        n = changes["save_every"]
        lines.append(f"if step % {n} == 0: save(...)  # torch.save / save_file: every {n} steps, or off the training "
                     "thread (torch.distributed.checkpoint.async_save)")
    if changes.get("expandable_segments"):
        lines.append("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # in the environment, before python starts")
    if changes.get("keep_host_memory"):
        from perfdoctor.collect.inject_switches import KEEP_ENV
        lines.append("export " + " ".join(f"{k}={v}" for k, v in KEEP_ENV.items()) + "  # glibc: in the environment, "
                     "before python starts (or LD_PRELOAD jemalloc / tcmalloc)")
    return "\n".join(lines)


def rebuilt(inject: dict) -> int:
    """How many times the script built its first DataLoader: loaders made on the same line, on a
    dataset of the same class and length (inject.json's "built"), are that loader built again."""
    built = [ld.get("built") for ld in inject.get("loaders") or []]
    return built.count(built[0]) if built and built[0] else len(built[:1])
