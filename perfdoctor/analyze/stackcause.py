"""What one Python stack (py-spy's frames, root first) is doing: the cause of its time and the
labels of its frames, for analyze/stacks.py.

The causes, checked in this order on each stack:
- checkpoint: torch.save, torch.distributed.checkpoint, safetensors, save_pretrained, Lightning's
  save_checkpoint, numpy.save... anywhere in the stack;
- logging_sync: logging, TensorBoard, wandb, mlflow... frames, or the leaf is the user's own
  line reading device values (.item(), .cpu(), .tolist(), .numpy(): the source line is read)
  outside a periodic block (below);
- data_loader (DataLoader __next__), model (nn.Module calls), backward, optimizer (torch.optim
  frames, or the user's line is a hand-written update: it reads `.grad` and writes in place);
- producer_wait: the user's line waits for a value another thread or process makes: a thread
  or process pool's results (Executor.map's iterator, Future.result, as_completed, Pool.map /
  imap), a queue's get: batches (or any results) the loop's own producers make, a wait that is
  no DataLoader's and so no data wait in the step records;
- waiting: the innermost frame blocks (a selector, queue, pipe or lock: a DataLoader worker idle
  for its next index);
- perfdoctor: our own code runs (a frame of ours with only the standard library below it; a
  frame of ours with a library below is a wrapper the call passes through);
- waiting, too: the user's line sleeps, waits or joins, by its source text, or calls
  threading/multiprocessing/queue (--idle shows blocked time, and a sleep is not work);
- garbage_collection: the user's own line calls gc.collect() (a builtin: py-spy shows the line
  that calls it), under `if step % N` or not: a full collection walks every Python object;
- periodic: the user's own line (alone or calling data libraries) inside an `if step % N`
  body (sourcelines.py), or inside a function called from one (a sleeping `log_metrics(...)`
  under `if step % 10 == 0:`): a log line's metric, not batch preparation. Its share counts as
  logging (stacks.logging_sync_share): with N = 1 such a block runs every step; a module call
  (a forward) under such a block is an evaluation: the training forward runs every step;
- python_data: the rest of the user's own code, alone or calling data libraries (numpy, PIL,
  random, tokenizers, torchvision transforms...): batches built in the loop. A tensor op
  called straight from the loop also lands here (stacks cannot tell Python from a C call), so
  the rule caps it by the trace's untraced time.

One more reading takes the whole recording (analyze/stacks.py): python_data that runs after the
forward pass, on values read from tensors, is a metric of the step's results, not a batch in
the making (results_work): step_results, which counts as logging as periodic does. A
sklearn-style F1 over `out.argmax(1).numpy()` each step is such work, which no DataLoader worker
can take (PD352) and reading every N steps removes (PD351).
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from pathlib import Path

from perfdoctor.analyze.sourcelines import (DEVICE_COPY, DEVICE_READ, GC_COLLECT, GRAD_READ, IN_PLACE, WAITING,
                                            in_periodic_block, line_says)

_TOOL_DIR = str(Path(__file__).resolve().parents[1]) + "/"       # perfdoctor's own package
_STDLIB = re.compile(r"/lib(?:64)?/python\d\.\d+/(?!site-packages/|dist-packages/)")
_SITE = re.compile(r"/(?:site|dist)-packages/")
# the Python torch.compile writes and runs (Inductor's output code: <cache>/xx/c<hash>.py, the
# cache /tmp/torchinductor_<user> unless TORCHINDUCTOR_CACHE_DIR moves it): torch's, not the user's
_GENERATED = re.compile(r"/torchinductor_[^/]*/|/[a-z0-9]{2}/c[a-z0-9]{50,52}\.py$")
GENERATED_MODULE = "torch._inductor.output_code"

CHECKPOINT_MODULES = ("torch.serialization", "torch.distributed.checkpoint", "safetensors", "transformers",
                      "lightning", "pytorch_lightning", "accelerate", "deepspeed", "numpy", "orbax", "h5py")
CHECKPOINT_FUNCS = {"save", "_save", "_legacy_save", "save_file", "save_pretrained", "_save_checkpoint",
                    "save_checkpoint", "save_state", "save_model", "async_save", "savez", "savez_compressed"}
LOGGING_MODULES = ("logging", "torch.utils.tensorboard", "tensorboardX", "tensorboard", "wandb", "mlflow",
                   "neptune", "comet_ml", "clearml", "aim", "lightning.pytorch.loggers",
                   "pytorch_lightning.loggers", "lightning.fabric.loggers")
DATA_MODULES = ("numpy", "PIL", "cv2", "pandas", "random", "json", "csv", "re", "pickle", "torchvision.transforms",
                "torchvision.io", "torchvision.datasets", "torchaudio", "albumentations", "tokenizers",
                "transformers.tokenization_utils", "transformers.tokenization_utils_base",
                "transformers.tokenization_utils_fast", "datasets", "torch.utils.data")
ALIASES = {"torch.serialization.save": "torch.save", "torch.serialization.load": "torch.load",
           "torch.nn.modules.module.Module._wrapped_call_impl": "nn.Module.__call__",
           "torch.nn.modules.module.Module._call_impl": "nn.Module.__call__",
           "torch._tensor.Tensor.backward": "Tensor.backward",
           "torch.optim.optimizer.Optimizer.profile_hook_step.<locals>.wrapper": "Optimizer.step",
           "torch.optim.optimizer.Optimizer.zero_grad": "Optimizer.zero_grad",
           "torch.utils.data.dataloader._BaseDataLoaderIter.__next__": "DataLoader.__next__",
           "torch._dynamo.eval_frame.DisableContext.__call__.<locals>._fn": "torch.compile'd code"}
CAUSES = ("checkpoint", "logging_sync", "evaluation", "data_loader", "model", "backward", "optimizer", "perfdoctor",
          "producer_wait", "waiting", "garbage_collection", "periodic", "step_results", "loss", "python_data",
          "other")
# torch's Python-level tensor functions: a loss or a metric written out in the loop calls these
TENSOR_MATH_MODULES = ("torch.nn.functional", "torch.functional", "torch._tensor", "torch.nn._reduction")
# An evaluation inside the training loop: anything under a function named for it (the user's
# evaluate(), Lightning's evaluation loop, HF Trainer.evaluate / prediction_loop), or torch's
# no_grad / inference_mode decorator (torch.utils._contextlib) above a forward pass or a loader
# fetch; never with a backward pass in the stack.
EVAL_NAME = re.compile(r"^(evaluate|evaluation|eval|validate|validation|val|test)(_\w*)?$"
                       r"|^_?(evaluation|prediction|validation)_loop$|^(validation|test)_step$|^_run_evaluate$")
DECORATOR = ("torch.utils._contextlib",)


@dataclass
class Frame:
    func: str
    file: str
    line: int
    kind: str            # user | lib | tool
    module: str          # dotted module of a library frame ("" for user code)
    stdlib: bool = False  # the standard library's (or a frozen module's)


def _frame(func: str, file: str, line: int) -> Frame:
    f = file.replace("\\", "/")
    if f.startswith(_TOOL_DIR) or "/perfdoctor/collect/" in f:
        return Frame(func, file, line, "tool", "perfdoctor")
    if _GENERATED.search(f):
        return Frame(func, file, line, "lib", GENERATED_MODULE)
    m = _SITE.search(f) or _STDLIB.search(f)
    if m or f.startswith("<"):
        rel = f[m.end():] if m else f.strip("<>").replace("frozen ", "")
        mod = rel[:-3] if rel.endswith(".py") else rel
        mod = mod.replace("/", ".")
        mod = mod[:-9] if mod.endswith(".__init__") else mod
        return Frame(func, file, line, "lib", mod, stdlib=m is None or m.re is _STDLIB)
    return Frame(func, file, line, "user", "")


def frame_kind(file: str) -> str:
    """Who wrote the code in `file`: user, lib (a package, the standard library, a frozen module
    or <string>) or tool (perfdoctor), as the frames of a stack are told apart."""
    return _frame("", file, 0).kind


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# an LR scheduler wraps optimizer.step in a closure (torch.optim.lr_scheduler's wrap_step): the
# user's `opt.step()` line calls that wrapper, whose qualified name is 100 characters of <locals>
_STEP_WRAPPERS = ("torch.optim.lr_scheduler.",)


def label(f: Frame) -> str:
    if f.kind == "user":
        p = Path(f.file)
        # a package's __main__.py / __init__.py (python -m pkg) is named with its package
        name = f"{p.parent.name}/{p.name}" if p.name in ("__main__.py", "__init__.py") and p.parent.name else p.name
        return f"{name}:{f.line}"
    name = f"{f.module}.{f.func}"
    if name in ALIASES:
        return ALIASES[name]
    if ".<locals>." in name:
        if name.startswith(_STEP_WRAPPERS) and "step" in name and name.endswith("wrapper"):
            return "Optimizer.step"
        head, tail = name.split(".<locals>.", 1)[0], name.rsplit(".", 1)[-1]
        return f"{head}...{tail}"        # a closure: where it was made, and its own name
    return name


WAIT_MODULES = ("selectors", "threading", "queue", "multiprocessing.connection", "multiprocessing.queues",
                "multiprocessing.synchronize", "concurrent.futures._base")
WAIT_FUNCS = {"select", "wait", "join", "get", "poll", "_poll", "recv", "recv_bytes", "_recv", "_recv_bytes",
              "acquire", "sleep"}
# The user's line calls straight into one of these (whatever function: Thread.join, Queue.get,
# Pool.map ...): the loop hands its time to another thread or process, or sleeps.
CALLED_TO_WAIT = ("time", "threading", "multiprocessing", "queue", "concurrent.futures", "selectors")


def blocked(f: Frame) -> bool:
    """The stack's innermost frame blocks on a lock, a queue, a pipe or a selector: the thread
    waits, whatever called it."""
    return f.kind == "lib" and _in(f.module, WAIT_MODULES) and f.func.rsplit(".", 1)[-1] in WAIT_FUNCS


# What the user's line calls to receive a value another thread or process makes (the module of
# the first library frame below it, and that frame's function): a pool's or a future's results, a
# queue's next item. Thread.join, sleeps and locks are waiting, not this: nothing comes back.
PRODUCER_CALLS = {"concurrent.futures._base": ("result", "result_iterator", "as_completed", "wait",
                                               "_result_or_cancel"),
                  "queue": ("get",),
                  "multiprocessing.queues": ("get",),
                  "multiprocessing.pool": ("next", "__next__", "get", "map", "starmap", "wait")}


def _awaits_producer(shown: list[Frame]) -> bool:
    """The user's line calls straight into a call that returns another thread's or process's
    result (PRODUCER_CALLS), from the loop: `for x in pool.map(load, items)`, `fut.result()`,
    `q.get()`. perfdoctor's own frames are passed over (a DataLoader worker's idle `get` is under
    torch's worker loop: not this)."""
    if not shown or shown[0].kind != "lib":
        return False
    funcs = PRODUCER_CALLS.get(shown[0].module)
    return bool(funcs) and shown[0].func.rsplit(".", 1)[-1] in funcs


def _ours_running(below: list[Frame]) -> bool:
    """perfdoctor's own code runs: a frame of ours with only the standard library below it. A
    frame of ours with a library's below is a wrapper the call passes through (a DataLoader's
    workers are forked inside our iterator: all their frames have it)."""
    last = max((i for i, f in enumerate(below) if f.kind == "tool"), default=None)
    return last is not None and all(f.stdlib for f in below[last + 1:])


def _evaluating(frames: list[Frame], libs: list[Frame]) -> bool:
    """Inside a function named for an evaluation (its forward passes, its `.item()` lines, its
    loader), or a forward pass or loader fetch under a no_grad decorator (an EMA update under
    one runs no module: not this); never with a backward pass in the stack, nor inside an
    optimizer's step: LBFGS's step is decorated with no_grad and calls the closure (forward,
    loss, backward) with grad enabled again, through the same decorator (a user trial's LBFGS
    script read 36% "evaluation" and got PD354 first)."""
    if any(_in(f.module, ("torch.autograd", "torch.optim")) or f.func.endswith("backward") for f in libs):
        return False
    if any(EVAL_NAME.search(f.func.rsplit(".", 1)[-1]) for f in frames):
        return True
    marked = next((i for i, f in enumerate(frames)
                   if f.kind == "lib" and _in(f.module, DECORATOR) and f.func.endswith("decorate_context")), None)
    return marked is not None and any(
        f.kind == "lib" and (_in(f.module, ("torch.nn.modules",)) or f.module == "torch.utils.data.dataloader")
        for f in frames[marked + 1:])


def _updates_parameters(f: Frame, source) -> bool:
    """The user's line is a hand-written parameter update (sourcelines.GRAD_READ and IN_PLACE):
    it reads a gradient and writes a tensor in place, with no device read (a logged grad norm)."""
    return (line_says(f.file, f.line, GRAD_READ, source) and line_says(f.file, f.line, IN_PLACE, source)
            and not line_says(f.file, f.line, DEVICE_READ, source))


TIMED_WRAPPER = "perfdoctor/collect/timedcalls.py"   # its `timed` frame: a call timed on its way through


def code_frames(stack: tuple) -> list[Frame]:
    """The stack's code frames, root first (py-spy's process and thread pseudo-frames left out,
    and the frame of `perfdoctor run`'s timing wrapper: the call passes through it, and a builtin
    it wraps, gc.collect, has no frame of its own below it to tell the call by)."""
    return [_frame(*f) for f in stack if f[1] and not f[0].startswith(("process ", "thread ("))
            and not (f[0].endswith("timed") and f[1].replace("\\", "/").endswith(TIMED_WRAPPER))]


CODE_CHARS = 120     # of a source line shown beside its frame


def user_code(stack: tuple, source=linecache.getline) -> str | None:
    """The text of the user's innermost line in the stack (stripped, at most CODE_CHARS), as the
    file reads now; None when there is no user frame or the file cannot be read."""
    frames = code_frames(stack)
    user = next((f for f in reversed(frames) if f.kind == "user"), None)
    if user is None:
        return None
    try:
        text = source(user.file, user.line).strip()
    except (OSError, ValueError, TypeError):
        return None
    return (text[:CODE_CHARS - 1] + "…" if len(text) > CODE_CHARS else text) or None


def _forward_not_training(frames: list, user: int, libs: list, lines_of) -> bool:
    """A module call (a forward) from an every-N-steps block that does not train (no .backward( or
    .step( in it: a GAN's generator updated every n_critic steps trains)."""
    return any(_in(f.module, ("torch.nn.modules",)) for f in libs) and not any(
        f.kind == "user" and in_periodic_block(f.file, f.line, lines_of, training=True) for f in frames[:user + 1])


def classify(stack: tuple, source=linecache.getline, lines_of=linecache.getlines) -> tuple[str, str, str | None]:
    """(cause, frame label, user line label) of one stack, root first: ((func, file, line), ...).
    `source` gives a line's text, `lines_of` a file's lines (sourcelines.py reads them)."""
    frames = code_frames(stack)
    if not frames:
        return "other", "?", None
    user = max((i for i, f in enumerate(frames) if f.kind == "user"), default=None)
    below = frames[user + 1:] if user is not None else frames
    at = label(frames[user]) if user is not None else None
    shown = [f for f in below if f.kind != "tool"] or below     # perfdoctor's own wrappers are not named
    called = label(shown[0]) if shown else (at or "?")
    libs = [f for f in frames if f.kind == "lib"]
    # the user's every-N-steps block anywhere up the stack: the call `log_metrics(...)` under
    # `if step % 10 == 0:` makes the sleep inside log_metrics periodic work too
    periodic = user is not None and any(f.kind == "user" and in_periodic_block(f.file, f.line, lines_of)
                                        for f in frames[:user + 1])
    if any(_in(f.module, CHECKPOINT_MODULES) and f.func.rsplit(".", 1)[-1] in CHECKPOINT_FUNCS for f in libs):
        cause = "checkpoint"
    elif any(_in(f.module, LOGGING_MODULES) for f in libs):
        cause = "logging_sync"
    elif _evaluating(frames, libs) or periodic and _forward_not_training(frames, user, libs, lines_of):
        cause = "evaluation"    # a forward under `if step % N`: not the training step, which runs every step
    elif not below and _updates_parameters(frames[user], source):
        cause = "optimizer"     # a hand-written update (gradient accumulation's under `if step % N` too)
    elif not below and line_says(frames[user].file, frames[user].line, GC_COLLECT, source):
        cause = "garbage_collection"   # gc.collect() by hand, every N steps or every step: its own cost
    elif periodic and not below:
        cause = "periodic"      # the script's own every-N-steps work (a log line's metric, a sleep in a log call)
    elif not below and line_says(frames[user].file, frames[user].line, DEVICE_READ, source):
        cause = "logging_sync"
    elif any(f.module == "torch.utils.data.dataloader" and f.func.endswith("__next__") for f in libs):
        cause = "data_loader"
    # inside a module call, the autograd engine or an optimizer step anywhere in the stack: the
    # user's own forward, custom Function.backward or optimizer code below it belongs there too
    elif any(_in(f.module, ("torch.nn.modules",)) for f in libs) or any(
            _in(f.module, ("torch._functorch",)) and f.func.endswith("CompiledFunction.forward") for f in libs):
        cause = "model"         # a torch.compile'd forward runs in an autograd Function's forward
    elif any(_in(f.module, ("torch.autograd",)) or f.func.endswith("backward") and f.module == "torch._tensor"
             for f in libs):
        cause = "backward"
    elif _awaits_producer(shown):
        cause = "producer_wait"
    elif blocked(frames[-1]):       # a DataLoader worker idle for its next index, through our iterator
        cause = "waiting"
    elif _ours_running(below):
        cause = "perfdoctor"
    elif any(_in(f.module, ("torch.optim",)) for f in libs):
        cause = "optimizer"
    elif not below and line_says(frames[user].file, frames[user].line, WAITING, source) or any(
            _in(f.module, CALLED_TO_WAIT) for f in below[:1]):
        cause = "waiting"
    elif user is not None and all(f.kind == "lib" and _in(f.module, DATA_MODULES) for f in below):
        cause = "periodic" if periodic else "python_data"
    else:
        cause = "other"
    return cause, called, at


def forward_lines(stack: tuple) -> list[tuple[str, str, int]]:
    """(file, function, line) of each user frame of a stack: for a forward pass's stack (cause
    model), where each of the user's functions calls it."""
    return [(f.file, f.func, f.line) for f in code_frames(stack) if f.kind == "user"]


def results_work(stack: tuple, first_forward: dict[tuple[str, str], int], source=linecache.getline) -> bool:
    """A python_data stack that works on the step's results: one of its user frames stands after
    the first line of its function that calls the forward pass (`first_forward`: (file, function)
    -> that line, from the forward passes' stacks), and that frame's line or one below it reads
    values from tensors (.item(), .cpu(), .tolist(), .numpy()). Work before the forward stays batch
    preparation (python_data); tensor math after it that reads no value is the loss (after_forward)."""
    frames = [f for f in code_frames(stack) if f.kind == "user"]
    for i, f in enumerate(frames):
        first = first_forward.get((f.file, f.func))
        if first is not None and f.line > first and any(
                line_says(g.file, g.line, DEVICE_READ, source) for g in frames[i:]):
            return True
    return False


def before_forward(stack: tuple, first_forward: dict[tuple[str, str], int], source=linecache.getline) -> bool:
    """A python_data stack of the batch in the making: one of its user frames stands before the
    first line of its function that calls the forward pass. Tensor ops there (noise drawn, a blur,
    a normalisation: a synthetic batch) make the forward's input and need nothing of its output,
    so a DataLoader worker can run them ahead; a trace counts them as ops, not untraced time. Not
    where the user's innermost line copies to a device (`x.to(device)`): that time is the copy's,
    and pinned memory its fix."""
    frames = [f for f in code_frames(stack) if f.kind == "user"]
    if frames and line_says(frames[-1].file, frames[-1].line, DEVICE_COPY, source):
        return False
    for f in frames:
        first = first_forward.get((f.file, f.func))
        if first is not None and f.line < first:
            return True
    return False


def after_forward(stack: tuple, first_forward: dict[tuple[str, str], int], source=linecache.getline) -> bool:
    """Tensor math the loop does on the forward's output (a python_data or other stack): the
    innermost user frame stands after the first line of its function that calls the forward pass,
    and below it run torch's tensor functions alone (F.cross_entropy, torch.einsum,
    Tensor.__rsub__) or nothing (`sim = a @ b.T / t`): a loss written out, or a metric kept as a
    tensor. It needs that output, so no DataLoader worker can make it ahead (PD352 is for the
    batch); a user trial's contrastive loss read "python data" and "other". The innermost frame
    alone: a function the loop calls after its forward may make the next batch (nanoGPT's
    `X, Y = get_batch('train')` between the forward and the backward). Not a line that copies to
    a device (the copy's time, as in before_forward)."""
    frames = code_frames(stack)
    user = max((i for i, f in enumerate(frames) if f.kind == "user"), default=None)
    if user is None or any(f.kind != "lib" or not _in(f.module, TENSOR_MATH_MODULES) for f in frames[user + 1:]):
        return False
    if line_says(frames[user].file, frames[user].line, DEVICE_COPY, source):
        return False
    f = frames[user]
    return first_forward.get((f.file, f.func), f.line) < f.line
