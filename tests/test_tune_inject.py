"""`perfdoctor tune`'s changes injected into a real child run of a script: each reaches the script
(workers, threads, optimizer, precision, channels_last, recompute, empty_cache, checkpoints, the
loader's iterator) and trains what it trained."""

from __future__ import annotations

import json
import textwrap

import pytest
from tunecases import SCRIPT, facts, injected, launch, measured

from perfdoctor.tune import plan
from perfdoctor.tune.apply import apply_text
from perfdoctor.tune.measure import loss_drift


HALF = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).bfloat16()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    y = x[:, :1].float() * 2
    for i in range(20):
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
    print("dtypes", next(model.parameters()).dtype, out.dtype, flush=True)
""")


def test_float32_change_trains_a_bfloat16_model_in_float32(tmp_path, capfd):
    """The same change on a model kept in bfloat16: its parameters and inputs float32, its output
    bfloat16 again; the code to apply names the dtype it trains in now."""
    res, d = launch(tmp_path, {"float32": True}, max_steps=None, script_text=HALF)
    assert res.exit_code == 0, capfd.readouterr().err[-2000:]
    assert "dtypes torch.float32 torch.bfloat16" in capfd.readouterr().out
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["float32"] and inj["float32_from"] == ["bfloat16"]
    assert inj["losses"][-1] < 0.7 * inj["losses"][0]                 # it still trains
    text = apply_text({"float32": True}, inj, cuda=False)
    assert text.startswith("model.float()") and "trains in bfloat16 now" in text and "numpy" not in text
    inner = apply_text({"float32": True}, {**inj, "float32_inner": ["GRUCell"]}, cuda=False)
    assert "makes in bfloat16 and passes to its GRUCell (e.g. torch.zeros(..., dtype=torch.bfloat16)" in inner


# -- injection into a real child -------------------------------------------------------------------

def test_injected_changes_reach_the_script(tmp_path, capfd):
    res, d = launch(tmp_path, {"num_workers": 1, "threads": 2, "optimizer": "foreach", "autocast": "bfloat16"})
    out = capfd.readouterr().out
    assert res.exit_code == 0
    assert "threads 2 workers 1" in out                      # the script's own print, after its set_num_threads(1)
    inj = json.loads((d / "inject.json").read_text())
    assert inj["loaders"][0]["asked"]["num_workers"] == 0 and inj["loaders"][0]["got"]["num_workers"] == 1
    assert inj["threads_asked"] == [1] and inj["threads"] == 2
    assert set(inj["applied"]) == {"num_workers", "threads", "optimizer", "autocast"}
    assert inj["optimizers"][0]["class"] == "SGD"
    # one loss per backward: 60 measured steps after the first optimizer step, which starts them
    assert len(inj["losses"]) == 61 and all(isinstance(x, float) for x in inj["losses"])


SCALED = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu")          # a GradScaler left on where no float16 runs (nanoGPT's default)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(30):
    loss = (model(x) - y).square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
    print(f"{loss.item():.6f}")
"""


def test_a_loss_a_grad_scaler_scaled_is_kept_as_the_loss(tmp_path, capfd):
    """tune's loss check read the scaled loss (times 65536 to start) where the script's loss is ~1:
    the loss GradScaler.scale() was given is kept instead, as the script prints it."""
    out, inj = injected(tmp_path, capfd, {}, SCALED)
    printed = [float(x) for x in out.split()]
    assert len(inj["losses"]) == 30 and inj["losses"] == pytest.approx(printed, rel=1e-5)
    assert max(inj["losses"]) < 10


def test_the_no_workers_trial_runs_a_loader_built_for_workers(tmp_path, capfd):
    """torch refuses persistent_workers, prefetch_factor and multiprocessing_context without
    workers: the num_workers=0 trial drops them, and the code to apply says so."""
    text = SCRIPT.replace("num_workers=0)", "num_workers=2, persistent_workers=True, prefetch_factor=4, "
                                            "multiprocessing_context='fork')")
    res, d = launch(tmp_path, {"num_workers": 0}, max_steps=20, script_text=text)
    assert res.exit_code == 0, capfd.readouterr().err[-2000:]
    inj = json.loads((d / "inject.json").read_text())
    assert inj["loaders"][0]["got"]["num_workers"] == 0
    assert inj["loaders"][0]["asked"]["multiprocessing_context"] == "fork"
    line = apply_text({"num_workers": 0}, inj, cuda=False)
    assert "num_workers=0, persistent_workers=False, prefetch_factor=None, multiprocessing_context=None" in line


REBUILT = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(1)
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    def make(ds):                                 # a new loader each epoch, from a helper
        return DataLoader(ds, batch_size=4)
    val = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    for epoch in range(3):
        for (x,) in make(TensorDataset(torch.randn(16, 2))):
            loss = lin(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        for (x,) in make(TensorDataset(torch.randn(8, 2))):     # validation, from the same helper
            pass
""")


def test_a_dataloader_built_again_each_epoch_is_told_to_be_built_once(tmp_path, capfd):
    """persistent_workers keeps workers alive as long as their DataLoader: a script that builds
    its loader anew each epoch (in a function the loop calls) restarts them anyway, so the code
    to apply says to build it once. Loaders on other data (validation, same helper) or built once
    are not counted."""
    _, inj = injected(tmp_path, capfd, {"num_workers": 1, "persistent_workers": True}, REBUILT)
    built = [ld["built"] for ld in inj["loaders"]]
    assert len(built) == 7 and len(set(built)) == 3 and built.count(built[0]) == 1   # val, then 3 x (train, val)
    train = {**inj, "loaders": inj["loaders"][1:]}
    text = apply_text({"num_workers": 1, "persistent_workers": True}, train, cuda=False)
    assert "built this DataLoader 3 times" in text and "build it once" in text
    assert "build it once" not in apply_text({"num_workers": 1, "persistent_workers": True}, inj, cuda=False)
    assert "build it once" not in apply_text({"threads": 2}, train, cuda=False)


def test_a_script_leaving_through_os_exit_keeps_its_record(tmp_path, capfd):
    """os._exit skips atexit: tune's record (what was applied, the losses) is written first."""
    res, d = launch(tmp_path, {"num_workers": 1}, max_steps=None,
                    script_text=SCRIPT + "import os\nos._exit(4)\n")
    assert res.exit_code == 4 and res.child["outcome"] == "exit" and "dtype" in capfd.readouterr().out
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["num_workers"] and len(inj["losses"]) == 3 * 32


def test_autocast_and_optimizer_injection_change_what_the_script_sees(tmp_path, capfd):
    res, d = launch(tmp_path, {"autocast": "bfloat16", "optimizer": "foreach"}, max_steps=None)
    assert res.exit_code == 0
    assert "dtype torch.bfloat16 foreach True" in capfd.readouterr().out


FLOAT64 = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0); torch.set_num_threads(1)      # tiny ops: a second thread only spins
    class Seq(torch.nn.Module):                  # float64 state made inside forward, as scripts do
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.LSTMCell(1, 16)
            self.head = torch.nn.Linear(16, 1)
        def forward(self, x):
            h = torch.zeros(x.size(0), 16, dtype=torch.double)
            c = torch.zeros(x.size(0), 16, dtype=torch.double)
            outs = []
            for xt in x.split(1, dim=1):
                h, c = self.cell(xt, (h, c))
                outs.append(self.head(h))
            return torch.cat(outs, dim=1)
    x = torch.sin(torch.arange(0, 8 * 30, dtype=torch.float64).reshape(8, 30) / 5)
    model = Seq().double()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for i in range(20):
        opt.zero_grad()
        out = model(x[:, :-1])
        loss = torch.nn.functional.mse_loss(out, x[:, 1:])
        loss.backward()
        opt.step()
    print("dtypes", next(model.parameters()).dtype, out.dtype, flush=True)
""")


def test_float32_change_trains_a_float64_model_in_float32(tmp_path, capfd):
    """The model and what enters it are float32, its output float64 again (the loss and target
    untouched), the optimizer still steps the same parameters: the loss follows the baseline's."""
    res, d = launch(tmp_path, {"float32": True}, max_steps=None, script_text=FLOAT64)
    assert res.exit_code == 0, capfd.readouterr().err[-2000:]
    assert "dtypes torch.float32 torch.float64" in capfd.readouterr().out
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["float32"] and not inj["notes"]
    (tmp_path / "b").mkdir()
    launch(tmp_path / "b", {}, max_steps=None, script_text=FLOAT64)
    assert "dtypes torch.float64 torch.float64" in capfd.readouterr().out
    ref = json.loads((tmp_path / "b" / "run" / "inject.json").read_text())
    drift = loss_drift(measured(ref["losses"]), measured(inj["losses"]))
    assert drift["steps"] == 20 and not drift["diverged"] and drift["drift"] < 1e-3
    assert ref["losses"][-1] < 0.5 * ref["losses"][0]                 # it trains: the comparison means something
    text = apply_text({"float32": True}, inj, cuda=False)
    # the forward makes its LSTMCell state in float64: model.float() alone would fail on it
    assert text.startswith("model.float()") and inj["float32_inner"] == ["LSTMCell"] and "its LSTMCell" in text
    assert ref["float32_inner"] == [] and "its LSTMCell" not in apply_text({"float32": True}, ref, cuda=False)


def test_autocast_on_a_float64_model_runs_it_in_bfloat16_only_on_top_of_float32(tmp_path, capfd):
    """torch.autocast casts float32 ops only: alone it leaves a float64 model in float64 (so the
    plan stacks it on float32), and on float32 the model's linear layers run in bfloat16."""
    text = FLOAT64.replace("out = model(x[:, :-1])", "out = model(x[:, :-1]); print('out', out.dtype, flush=True)")
    alone, _ = injected(tmp_path, capfd, {"autocast": "bfloat16"}, text)
    assert "out torch.float64" in alone and "out torch.bfloat16" not in alone
    out, inj = injected(tmp_path, capfd, {"float32": True, "autocast": "bfloat16"}, text)
    assert set(inj["applied"]) == {"float32", "autocast"} and "out torch.bfloat16" in out


GAN_LOSSES = textwrap.dedent("""
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0); torch.set_num_threads(1)
    disc = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
    opt = torch.optim.SGD(disc.parameters(), lr=0.1)
    bce = nn.BCELoss()
    for step in range(12):
        x, real = torch.rand(16, 8), torch.ones(16, 1)
        out = disc(x)
        loss = bce(out, real) + F.huber_loss(disc(x), real) + F.binary_cross_entropy(out, real)
        opt.zero_grad(); loss.backward(); opt.step()
    print("dtypes", out.dtype, loss.dtype, flush=True)
""")


def test_autocast_runs_the_loss_under_it_as_the_fix_says(tmp_path, capfd):
    """pytorch/examples' DCGAN: nn.BCELoss on the discriminator's bfloat16 output beside float32
    labels failed the autocast trial ("Found dtype Float but expected BFloat16"), where the fix's
    own code (the loss inside the autocast block) runs. Loss modules, and the functional losses
    that refuse mixed dtypes, run under the trial's autocast: in float32, the model in bfloat16."""
    out, inj = injected(tmp_path, capfd, {"autocast": "bfloat16"}, GAN_LOSSES)
    assert inj["applied"] == ["autocast"] and "dtypes torch.bfloat16 torch.float32" in out
    assert len(inj["losses"]) == 12
    import torch
    assert torch.nn.functional.binary_cross_entropy.__name__ == "binary_cross_entropy"   # this process: untouched
    assert not hasattr(torch.nn.functional.binary_cross_entropy, "__wrapped__")


CHECKPOINTED = textwrap.dedent("""
    from torch.utils.checkpoint import checkpoint
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)      # tiny ops: a second thread only spins
    calls = 0
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            global calls
            calls += 1
            return torch.nn.functional.dropout(self.lin(x).relu(), 0.2)
    blocks = torch.nn.ModuleList([Block(), Block()])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    for step in range(20):
        h = torch.randn(4, 8)
        h = checkpoint(blocks[0], h, use_reentrant=False)
        h = torch.utils.checkpoint.checkpoint(blocks[1], h, use_reentrant=False, preserve_rng_state=True)
        loss = h.pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    print("forward calls per step", calls / 20, flush=True)
""")


def test_recompute_off_runs_checkpointed_blocks_once(tmp_path, capfd):
    """Two checkpointed blocks: their forward runs twice per step (once again in backward) unless
    tune's recompute=off calls them directly; the calls are counted either way, and the losses
    are the same (the checkpoint reruns dropout with the RNG state it had)."""
    losses = {}
    for changes, per_step in (({}, 4.0), ({"recompute": "off"}, 2.0)):
        out, inj = injected(tmp_path, capfd, changes, CHECKPOINTED)
        assert f"forward calls per step {per_step}" in out
        assert inj["checkpoint_calls"] == 40 and inj["applied"] == (["recompute"] if changes else [])
        losses[bool(changes)] = inj["losses"]
    assert len(losses[True]) == 20 and losses[True] == pytest.approx(losses[False], rel=1e-5)


EMPTY_CACHE = textwrap.dedent("""
    import torch
    from torch.cuda import empty_cache                   # by name, after torch: the injected one
    torch.set_num_threads(1)
    freed = []
    torch.cuda.memory.is_initialized = lambda: True      # stands in for a CUDA device: the allocator's
    torch._C._cuda_emptyCache = lambda: freed.append(1)  # release, which empty_cache calls
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(20):
        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
        empty_cache() if step % 2 else torch.cuda.empty_cache()
    print("released", len(freed), flush=True)
""")


def test_empty_cache_off_skips_the_scripts_calls(tmp_path, capfd):
    """The baseline counts the script's torch.cuda.empty_cache() calls (both ways of naming it),
    which plans an empty_cache=off trial (PD343) on a CUDA machine; the trial skips them."""
    for changes, released in (({}, 20), ({"empty_cache": "off"}, 0)):
        out, inj = injected(tmp_path, capfd, changes, EMPTY_CACHE)
        assert f"released {released}\n" in out
        assert inj["empty_cache_calls"] == 20 and inj["applied"] == (["empty_cache"] if changes else [])
    ranked = plan.plan(facts(verdict="device", cuda=True, empty_cache_calls=20, ranked=["PD343"]))
    assert ranked[0].changes == {"empty_cache": "off"} and ranked[0].group == "allocator" and ranked[0].skip is None
    assert plan.rule_for({"empty_cache": "off"}, {"PD343"}) == "PD343"
    cpu = {t.label: t.skip for t in plan.plan(facts(empty_cache_calls=20))}
    assert cpu["empty_cache=off"] == "no CUDA device"
    assert not any("empty_cache" in t.changes for t in plan.plan(facts(cuda=True)))
    assert apply_text({"empty_cache": "off"}, inj, cuda=True).startswith("# torch.cuda.empty_cache()  # remove it")


SAVING = textwrap.dedent("""
    import io, os, sys, tempfile
    from safetensors.torch import save_file              # first: its import imports torch
    import torch
    torch.set_num_threads(1)
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    d = tempfile.mkdtemp()
    copies = 0
    for step in range(20):
        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, os.path.join(d, f"{step}.safetensors"))
        torch.save(opt.state_dict(), os.path.join(d, f"{step}.pt"))
        buf = io.BytesIO(); torch.save(m.state_dict(), buf); copies += buf.tell() > 0     # a copy, not a checkpoint
    print("written", sorted(os.listdir(d), key=lambda n: (int(n.split(".")[0]), n)), "copies", copies, flush=True)
""")


def test_save_every_writes_one_checkpoint_in_n(tmp_path, capfd):
    """The baseline counts the script's saves (safetensors' save_file bound by name in an import
    that imports torch, and torch.save); save_every=5 writes every save of one step in five
    (the model and its optimizer together) and never skips a save into a buffer."""
    both = lambda steps: [f"{i}.{x}" for i in steps for x in ("pt", "safetensors")]   # noqa: E731
    for changes, written in (({}, both(range(20))), ({"save_every": 5}, both((0, 5, 10, 15)))):
        out, inj = injected(tmp_path, capfd, changes, SAVING)
        assert f"written {written} copies 20\n" in out, out
        assert inj["save_calls"] == 60 and inj["applied"] == (["save_every"] if changes else [])
    trials = plan.plan(facts(verdict="host", data_wait=0.0, frequent_saves=True, ranked=["PD350"]))
    assert trials[0].changes == {"save_every": plan.SAVE_EVERY} and trials[0].skip is None
    assert plan.rule_for(trials[0].changes, {"PD350"}) == "PD350"
    assert not any("save_every" in t.changes for t in plan.plan(facts()))
    assert apply_text({"save_every": 100}, inj, cuda=False).startswith("if step % 100 == 0: save(...)  # torch.save / save_file")


LIGHTNING_SAVING = textwrap.dedent("""
    import os, tempfile
    import torch
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    torch.set_num_threads(1)
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    io, d = TorchCheckpointIO(), tempfile.mkdtemp()
    for step in range(20):
        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
        io.save_checkpoint({"state_dict": m.state_dict()}, os.path.join(d, f"{step}.ckpt"))
    print("written", sorted(int(n.split(".")[0]) for n in os.listdir(d)), flush=True)
""")


def test_save_every_thins_lightnings_checkpoint_writes(tmp_path, capfd):
    """Lightning's checkpoint writer serialises into a buffer with torch.save and writes the bytes
    itself: save_every thins its saves (a user's every-step ModelCheckpoint trial had failed as
    "never reached" after 42 saves), each counted once (its torch.save inside is the same save)."""
    pytest.importorskip("lightning")
    for changes, written in (({}, list(range(20))), ({"save_every": 5}, [0, 5, 10, 15])):
        out, inj = injected(tmp_path, capfd, changes, LIGHTNING_SAVING)
        assert f"written {written}\n" in out, out
        assert inj["save_calls"] == 20 and inj["applied"] == (["save_every"] if changes else [])


def test_without_changes_nothing_is_injected(tmp_path, capfd):
    res, d = launch(tmp_path, None)
    assert res.exit_code == 0 and "threads 1 workers 0" in capfd.readouterr().out
    assert not (d / "inject.json").exists()

CNN = textwrap.dedent("""
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    x = torch.randn(16, 3, 12, 12)
    y = x.mean((1, 2, 3)).unsqueeze(1)
    w0 = model[0].weight.detach().clone()
    for i in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    w = model[0].weight
    print("layout", w.is_contiguous(memory_format=torch.channels_last), "inputs", all(seen),
          "stepped", not torch.equal(w.detach(), w0), "same", w is opt.param_groups[0]["params"][0], flush=True)
""")


def test_channels_last_change_trains_the_model_in_channels_last(tmp_path, capfd):
    """PD342's change: the convolution weights channels_last in place (the optimizer still steps
    the same Parameter), the input batches too; the losses those of the NCHW run (same math, in
    another memory layout). Planned where the report found NCHW convolutions: PD342 on a GPU,
    PD392 on the CPU (where no modelled gain says which way it goes: the trial measures it)."""
    out, inj = injected(tmp_path, capfd, {"channels_last": True}, CNN)
    assert "layout True inputs True stepped True same True" in out
    assert inj["applied"] == ["channels_last"] and inj["channels_last_modules"] == 1 and not inj["notes"]
    out_ref, ref = injected(tmp_path, capfd, {}, CNN)
    assert "layout False inputs False stepped True same True" in out_ref
    drift = loss_drift(measured(ref["losses"]), measured(inj["losses"]))
    assert drift["steps"] == 20 and not drift["diverged"] and drift["drift"] < 1e-4
    assert "model.to(memory_format=torch.channels_last)" in apply_text({"channels_last": True}, inj, cuda=True)
    facts = lambda **kw: plan.Facts(cores=4, cuda=True, verdict="device", **kw)  # noqa: E731
    trials = plan.plan(facts(nchw=True, ranked=["PD342", "PD320"]))
    assert trials[0].changes == {"channels_last": True} and trials[0].skip is None
    assert not any("channels_last" in t.changes for t in plan.plan(facts()))
    cpu = plan.plan(plan.Facts(cores=4, cuda=False, verdict="device", nchw=True))
    assert [t.skip for t in cpu if "channels_last" in t.changes] == [None]
    assert plan.rule_for({"channels_last": True}, {"PD342"}) == "PD342"
    assert plan.rule_for({"channels_last": True}, {"PD392", "PD375"}) == "PD392"


TWO_MODELS = textwrap.dedent("""
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 1))
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 6, 1))  # no 4-D parameters
    seen = []
    mlp.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    opt = torch.optim.SGD([*cnn.parameters(), *mlp.parameters()], lr=0.01)
    x = torch.randn(4, 3, 6, 6)
    for i in range(3):
        opt.zero_grad()
        (cnn(x).sum() + mlp(x).sum()).backward()
        opt.step()
    print("mlp inputs channels_last", any(seen), flush=True)
""")


def test_channels_last_changes_only_the_models_it_converts(tmp_path, capfd):
    """A module without 4-D parameters called beside a CNN keeps its inputs as they are (only
    the converted model's inputs become channels_last), and the record counts the one model
    converted, not every model called."""
    out, inj = injected(tmp_path, capfd, {"channels_last": True}, TWO_MODELS)
    assert "mlp inputs channels_last False" in out
    assert inj["applied"] == ["channels_last"] and inj["channels_last_modules"] == 1


LAZY_CNN = textwrap.dedent("""
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3, padding=1), torch.nn.Flatten(), torch.nn.LazyLinear(1))
    opt = None
    x = torch.randn(4, 3, 6, 6)
    for i in range(3):
        out = model(x)                     # the first call makes the parameters
        opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)
        opt.zero_grad()
        out.sum().backward()
        opt.step()
    print("layout", model[0].weight.is_contiguous(memory_format=torch.channels_last), flush=True)
""")


def test_channels_last_waits_for_a_lazy_model_to_make_its_parameters(tmp_path, capfd):
    """Lazy modules have no shapes before their first call (their parameters refuse dim()): the
    model is converted at the first call after that, instead of the script failing."""
    out, inj = injected(tmp_path, capfd, {"channels_last": True}, LAZY_CNN)
    assert "layout True" in out and inj["channels_last_modules"] == 1


# -- keep_iterator (PD355) -------------------------------------------------------------------------

PEEKING = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    lin = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.arange(40.0).reshape(-1, 1)), batch_size=4, shuffle=True)   # 10 batches
    seen = []
    for step in range(25):
        (x,) = next(iter(loader))                  # a new iterator every step
        seen.append(x.flatten().tolist())
        loss = lin(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    epochs = [sorted(v for b in seen[i:i + 10] for v in b) for i in (0, 10)]
    print("epochs whole", all(e == [float(v) for v in range(40)] for e in epochs))
    short = DataLoader(TensorDataset(torch.arange(40.0).reshape(-1, 1)), batch_size=4)
    for epoch in range(3):                          # an epoch loop that stops early: left alone
        print("starts at", next(iter(short))[0][0].item(), end="; ")
        for i, (x,) in enumerate(short):
            if i == 4:
                break
    print()
""")


def test_keep_iterator_hands_a_peeking_iterator_out_again_until_it_runs_out(tmp_path, capfd):
    """tune's trial of PD355: `next(iter(loader))` every step draws from one iterator, a new one
    only when it ran out (an epoch: every sample once); an epoch loop that stops early, and its
    peek, are left as they are. Without the change the starts are only counted."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"keep_iterator": True}, PEEKING)
    assert "epochs whole True" in out
    # 25 steps over 10-batch epochs: 3 iterators; the short loader's peek is followed by its own
    # epoch loop, which takes the peek's iterator (1 batch drawn) and breaks after 5 more: 3
    # starts, and its next peek gets a new one (6 batches drawn is no peek's)
    assert inj["iterator_starts"] == 3 + 3 and inj["iterator_reuses"] == 22 + 3
    assert "keep_iterator" in inj["applied"]
    assert out.count("starts at 0.0") == 3                     # the short loader's epochs start over
    bare_out, bare = injected(tmp_path, capfd, {}, PEEKING)
    assert bare["iterator_starts"] == 25 + 6 and bare["iterator_reuses"] == 0 and "keep_iterator" not in bare["applied"]
    assert "epochs whole False" in bare_out                   # a fresh order every step repeats samples
    text = apply_text({"keep_iterator": True}, bare, cuda=False)
    assert text.startswith("it = iter(loader)") and "started 31 iterators" in text

INDEXED = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Subset, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TensorDataset(torch.arange(50.0).reshape(-1, 1), torch.arange(50) % 3)
    lin = torch.nn.Linear(1, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    for loader in (DataLoader(ds, batch_size=8, shuffle=True),
                   DataLoader(Subset(ds, list(range(0, 50, 2))), batch_size=4, drop_last=True),
                   DataLoader(ds, batch_size=8, collate_fn=lambda b: b)):      # the script's own collate: left
        got = []
        for batch in loader:
            if isinstance(batch[0], tuple):
                got.append(len(batch))
                continue
            x, y = batch
            got.append(x.flatten().tolist() + y.tolist())
            loss = torch.nn.functional.cross_entropy(lin(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        print(type(batch).__name__, len(loader), loader.batch_size, got)
""")


def test_index_batches_draws_the_same_rows_with_one_indexing_a_batch(tmp_path, capfd):
    """tune's trial of PD358: a TensorDataset (or a Subset of one) fetched sample by sample gets a
    BatchSampler over its own sampler and batch_size=None; the batches hold the same rows in the
    same order, shuffled or not, drop_last kept; a loader with its own collate_fn is left alone."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"index_batches": True}, INDEXED)
    bare_out, bare = injected(tmp_path, capfd, {}, INDEXED)
    lines, bare_lines = out.splitlines(), bare_out.splitlines()
    assert len(lines) == len(bare_lines) == 3
    for a, b in zip(lines, bare_lines):
        # type, batches, batch_size, the rows of every batch: the same, batch_size aside
        ka, kb = a.split(" ", 3), b.split(" ", 3)
        assert ka[0] == kb[0] and ka[1] == kb[1] and ka[3] == kb[3]
    assert [x.split(" ", 3)[2] for x in lines] == ["None", "None", "8"]
    assert [x.split(" ", 3)[2] for x in bare_lines] == ["8", "4", "8"]
    assert "index_batches" in inj["applied"] and "index_batches" not in bare["applied"]
    text = apply_text({"index_batches": True}, bare, cuda=False)
    assert "sampler=BatchSampler(RandomSampler(dataset), batch_size=8" in text and "batch_size=None" in text
    assert plan.plan(facts(per_sample=True, ranked=["PD358"]))[0].changes == {"index_batches": True}
    assert plan.rule_for({"index_batches": True}, {"PD358"}) == "PD358"


LIGHTNING_REBUILT = textwrap.dedent("""
    import inspect
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    from lightning.fabric.utilities.data import _replace_dunder_methods, _update_dataloader
    ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    with _replace_dunder_methods(DataLoader, "dataset"):     # as Trainer.fit builds the user's loader
        loader = DataLoader(ds, batch_size=32, num_workers=0)
    again = _update_dataloader(loader, DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False))
    x, y = next(iter(again))
    print("rebuilt batch", len(x), "workers", again.num_workers, "named", DataLoader.__init__.__name__,
          "batch_size" in inspect.signature(DataLoader.__init__).parameters, flush=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in again:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
""")


@pytest.mark.parametrize("changes", [{}, {"num_workers": 1}])
def test_a_loader_lightning_builds_again_keeps_its_batches(tmp_path, capfd, changes):
    """Lightning's DDP builds the script's DataLoader again with a DistributedSampler, reading its
    arguments from DataLoader.__init__'s signature: tune's wrapper showed (*args, **kwargs), and
    every run of a Lightning DDP job, its baseline included, trained on batches of one sample
    (32 in the script: 5.4 ms/step where the job takes 40). The wrapper keeps the signature; a
    change still reaches the loader built again."""
    pytest.importorskip("lightning")
    out, rec = injected(tmp_path, capfd, changes, LIGHTNING_REBUILT)
    assert f"rebuilt batch 32 workers {changes.get('num_workers', 0)} named __init__ True" in out, out
    assert rec["applied"] == list(changes)
