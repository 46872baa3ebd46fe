"""tune's store_samples trial (collect/inject_store.py): the most preprocessing the data set once
(PD306) can give, measured as a bound, never applied as a setting."""

from __future__ import annotations

import json
import textwrap

import pytest
from tunecases import facts, injected

from perfdoctor.collect import inject_store
from perfdoctor.collect.inject_store import POOL_BATCHES, StoredSamples, StoredStream
from perfdoctor.report.tune_labels import tune_no_best
from perfdoctor.tune import plan

PREPARED = textwrap.dedent("""
    import pickle
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Images(Dataset):
        classes = ["a", "b"]
        calls = 0
        def __len__(self):
            return 1000
        def __getitem__(self, i):
            Images.calls += 1
            return torch.full((3, 8, 8), float(i)).mul(2).add(1), i % 2

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(8.0).reshape(-1, 1))

    lin = torch.nn.Linear(3 * 8 * 8, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    loader = DataLoader(Images(), batch_size=8, shuffle=True)
    built = Images.calls
    seen, n = set(), 0
    for x, y in loader:
        seen.update(int(v) for v in (x[:, 0, 0, 0] - 1) / 2)
        loss = torch.nn.functional.cross_entropy(lin(x.flatten(1)), y)
        opt.zero_grad(); loss.backward(); opt.step()
        n += 1
    print("built", built, "epoch", Images.calls - built, "batches", n, "distinct", len(seen))
    print("len", len(loader.dataset), "classes", loader.dataset.classes, "pickles", len(pickle.dumps(loader.dataset)) > 0)
    for other in (DataLoader(TensorDataset(torch.ones(16, 1)), batch_size=4), DataLoader(Stream(), batch_size=4),
                  DataLoader(loader.dataset, batch_size=8)):
        print(type(other.dataset).__name__, end=" ")
    print()
""")


def test_store_samples_serves_a_pool_prepared_once_when_the_loader_is_built(tmp_path, capfd):
    """A map-style dataset's samples are prepared when the loader is built (a pool of
    POOL_BATCHES batches, at least POOL_MIN samples), then served for the whole epoch, which
    keeps its length and batch count; attributes read through; a TensorDataset and a loader built
    again on the stored dataset are left alone (a stream is stored too: the tests below)."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"store_samples": True}, PREPARED)
    lines = out.splitlines()
    pool = max(64, POOL_BATCHES * 8)
    assert lines[0] == f"built {pool} epoch 0 batches 125 distinct {pool}", out
    assert lines[1] == "len 1000 classes ['a', 'b'] pickles True"
    assert lines[2].split() == ["TensorDataset", "StoredStream", "StoredSamples"]
    assert "store_samples" in inj["applied"] and not inj["notes"]
    assert inj["loaders"][0]["built"].endswith(" Images 1000")          # the script's dataset, as it built it
    bare_out, bare = injected(tmp_path, capfd, {}, PREPARED)
    assert bare_out.splitlines()[0] == "built 0 epoch 1000 batches 125 distinct 1000"
    assert "store_samples" not in bare["applied"]


def test_a_dataset_whose_samples_fail_is_left_alone_and_said_so(tmp_path, capfd):
    pytest.importorskip("torch")
    script = PREPARED.replace("Images.calls += 1", "Images.calls += 1\n        assert i < 0, 'no such file'")
    script = script[:script.index("built = ")] + "print(type(loader.dataset).__name__)\n"
    out, inj = injected(tmp_path, capfd, {"store_samples": True}, script)
    assert out.strip() == "Images" and "store_samples" not in inj["applied"]
    assert len(inj["notes"]) == 1 and inj["notes"][0].startswith("store_samples: dataset[")
    assert "AssertionError: no such file" in inj["notes"][0]


# A stream of samples parsed one by one (an IterableDataset without len), sharded over workers by
# get_worker_info as torch's documentation shows: two epochs without workers, one with two.
STREAM = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Parsed(IterableDataset):
        made = 0
        def __init__(self, n):
            self.n = n
        def __iter__(self):
            info = get_worker_info()
            lo, step = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(lo, self.n, step):
                Parsed.made += 1
                yield torch.full((4,), float(i)), i % 3

    loader = DataLoader(Parsed(300), batch_size=8)
    built = Parsed.made
    epochs = []
    for _ in range(2):
        epochs.append(sum(1 for _ in loader))
    print("built", built, "made in epochs", Parsed.made - built, "batches", *epochs, type(loader.dataset).__name__)
    first = next(iter(loader))[0][:, 0].tolist()
    print("first", *first)
    sharded = DataLoader(Parsed(300), batch_size=8, num_workers=2)
    print("workers", sum(1 for _ in sharded), len(list(DataLoader(Parsed(5), batch_size=2))))
    before = Parsed.made
    for _ in range(2):                       # a loader built per epoch over a new stream
        n = sum(1 for _ in DataLoader(Parsed(300), batch_size=8))
    print("rebuilt", Parsed.made - before, n)
""")


def test_store_samples_replays_a_streams_first_samples_for_as_long_as_its_epoch(tmp_path, capfd):
    """An IterableDataset is stored too: its first samples are the pool, counted on to the end
    of its first pass when the loader is built, and each epoch replays the pool for that many
    samples (the same batch count), split over workers as the sharded stream splits itself; a
    stream built again (a loader per epoch) is not prepared again."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"store_samples": True}, STREAM)
    lines = out.splitlines()
    pool = max(64, POOL_BATCHES * 8)
    assert lines[0] == "built 300 made in epochs 0 batches 38 38 StoredStream", out
    assert lines[1] == "first " + " ".join(f"{float(i)}" for i in range(8))
    # 2 workers: 150 samples each, 19 batches each; the 5-sample stream is shorter than a pool
    assert lines[2] == "workers 38 3", out
    assert lines[3] == "rebuilt 0 38"         # prepared once for the stream's class and attributes
    assert "store_samples" in inj["applied"] and not inj["notes"]
    assert inj["loaders"][0]["built"].endswith(" Parsed None")
    bare_out, _ = injected(tmp_path, capfd, {}, STREAM)
    assert bare_out.splitlines()[0] == "built 0 made in epochs 600 batches 38 38 Parsed"
    assert bare_out.splitlines()[2:] == ["workers 38 3", "rebuilt 600 38"]
    assert pool < 300                         # the epochs replayed a pool, not the stream


def test_a_stream_that_runs_past_the_preparation_time_replays_without_end(monkeypatch):
    """A stream longer than POOL_S allows to count (or without end) keeps its pool and replays it
    without end: the trial's run stops at its duration. One with len() is not counted at all."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    class Endless(IterableDataset):
        made = 0
        def __iter__(self):
            while True:
                Endless.made += 1
                yield torch.zeros(2)

    class Sized(Endless):
        def __len__(self):
            return 1000

    monkeypatch.setattr(inject_store, "POOL_S", 0.2)
    a = {"dataset": Endless(), "batch_size": 4}
    assert inject_store.store_samples(a, torch) is None
    ds = a["dataset"]
    assert isinstance(ds, StoredStream) and isinstance(ds, IterableDataset) and ds.count is None
    assert len(ds.pool) == 64 and Endless.made > 64
    batches = DataLoader(ds, batch_size=4)
    it = iter(batches)
    assert all(next(it).shape == (4, 2) for _ in range(100))
    with pytest.raises(TypeError):
        len(ds)
    Endless.made = 0
    a = {"dataset": Sized(), "batch_size": 32}
    assert inject_store.store_samples(a, torch) is None
    assert a["dataset"].count == 1000 == len(a["dataset"]) and Endless.made == 128 + 1


def test_a_stream_whose_samples_fail_or_that_is_empty_is_left_alone():
    torch = pytest.importorskip("torch")
    from torch.utils.data import IterableDataset

    class Broken(IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)
            raise OSError("no such file")

    class Empty(IterableDataset):
        def __iter__(self):
            return iter(())

    a = {"dataset": Broken(), "batch_size": 4}
    why = inject_store.store_samples(a, torch)
    assert why == "the stream's sample 1 failed (OSError: no such file)" and isinstance(a["dataset"], Broken)
    assert inject_store.store_samples({"dataset": Empty()}, torch) == "an empty stream"


def test_a_stored_sample_is_looked_up_by_index_and_other_keys_pass_through():
    pytest.importorskip("torch")
    base = {"k": "by key", 0: "a", 1: "b", 2: "c", 3: "d"}
    ds = StoredSamples(base, ["s0", "s1"])
    assert [ds[i] for i in range(5)] == ["s0", "s1", "s0", "s1", "s0"] and ds["k"] == "by key"
    with pytest.raises(AttributeError):
        ds.__getitems__                  # the fetcher then fetches index by index: stored samples


def test_numpy_and_tensor_indices_are_served_from_the_pool():
    """SubsetRandomSampler over a numpy array of indices (a train/val split) yields numpy.int64:
    those indices, and 0-d integer tensors, are indices too, served from the pool, not prepared
    again (the trial then measured the unprepared loader as the bound)."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, SubsetRandomSampler

    class Prepared:
        calls = 0
        def __len__(self):
            return 10
        def __getitem__(self, i):
            Prepared.calls += 1
            return torch.zeros(2)

    ds = StoredSamples(Prepared(), [torch.ones(2), torch.full((2,), 2.0)])
    assert ds[np.int64(3)] is ds.pool[1] and ds[torch.tensor(2)] is ds.pool[0] and ds[np.int32(-1)] is ds.pool[1]
    assert ds[True] is not ds.pool[1] and Prepared.calls == 1          # a bool is no index here: the dataset's own
    batches = list(DataLoader(ds, batch_size=5, sampler=SubsetRandomSampler(np.arange(10))))
    assert Prepared.calls == 1 and all(float(b.min()) >= 1 for b in batches)


def test_a_report_offering_pd306_plans_the_bound_trial_never_a_best_setting():
    trials = plan.plan(facts(preprocess=True))
    stored = [t for t in trials if t.changes == {"store_samples": True}]
    assert len(stored) == 1 and stored[0].group == "preprocessing" and stored[0].bound and not stored[0].skip
    assert plan.rule_for(stored[0].changes, {"PD306", "PD301"}) == "PD306"
    assert [t.group for t in trials].index("preprocessing") > [t.group for t in trials].index("loader")
    assert all("store_samples" not in t.changes for t in plan.plan(facts()))
    # only the bound was faster: no setting to apply, and the bound named as PD306's most
    trial = {"label": "store_samples=True", "bound": True, "status": "faster", "speedup": 2.4, "rule": "PD306"}
    other = {"label": "num_workers=1", "bound": False, "status": "no change", "speedup": 1.01, "rule": "PD301"}
    lines = tune_no_best({"trials": [other, trial], "apply": "keep the script as it is"})
    assert lines[0].startswith("no setting tune can make was measurably faster; store_samples=True measured 2.40x: "
                               "the most PD306's code change")
    assert len(lines) == 1                  # not "keep the script as it is: no change was measured faster"


def test_an_inconclusive_bound_is_said_so_not_that_no_trial_ran():
    """tune --only PD306 on a stream whose trial varied: the bound ran and was inconclusive (once
    said as "nothing was measured: no trial could run"); beside a setting measured equal the
    apply line stays."""
    bound = {"label": "store_samples=True", "bound": True, "status": "inconclusive", "speedup": 1.70, "rule": "PD306"}
    assert tune_no_best({"trials": [bound], "only": ["PD306"]}) == [
        "no setting was measured; store_samples=True (the most PD306's code change can give) was tried.",
        "1 trial(s) inconclusive (store_samples=True): the runs varied too much to tell a gain from a loss; rerun "
        "on a quiet machine, or with a larger --budget"]
    same = {"label": "num_workers=1", "bound": False, "status": "no change", "speedup": 1.01, "rule": "PD301"}
    lines = tune_no_best({"trials": [same, bound], "apply": "keep the script as it is"})
    assert lines[0] == "none of the trials was measurably faster than the baseline."
    assert lines[1].startswith("1 trial(s) inconclusive (store_samples=True)")
    assert lines[2] == "keep the script as it is"
    failed = {**bound, "status": "failed", "speedup": None}
    assert tune_no_best({"trials": [failed]}) == ["nothing was measured: no trial could run (reasons above)."]


@pytest.mark.slow
def test_tune_measures_what_preprocessing_once_gives_as_a_bound(tmp_path):
    """A Dataset that computes each sample from scratch (deterministic tensor math, ~0.4 ms a
    sample): the report offers PD306, tune measures its bound far faster than the baseline, sets
    it against PD306's ceiling, and never recommends it as the setting to apply."""
    pytest.importorskip("torch")
    from quiet import skip_if_shared
    from tunecases import tuned
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, Dataset
        torch.set_num_threads(1)

        class Computed(Dataset):
            def __len__(self):
                return 100_000

            def __getitem__(self, i):
                x = torch.full((48, 48), float(i % 97))
                for _ in range(6):
                    x = (x @ x).softmax(-1)
                return x.flatten()[:32], i % 2

        model = torch.nn.Linear(32, 2)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for x, y in DataLoader(Computed(), batch_size=16, shuffle=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """))
    # --only: the bound's trial alone (the loader's and threads' trials took half a minute more)
    doc, foreign = tuned(tmp_path, script, "--budget", "60", "--duration", "2", "--only", "pd306")
    assert doc["only"] == ["PD306"] and [t["changes"] for t in doc["trials"]] == [{"store_samples": True}]
    stored = doc["trials"][0]
    if stored["reason"] == "budget":                # the baseline repeated around every trial: a shared machine
        skip_if_shared(foreign)
    assert stored["rule"] == "PD306" and stored["bound"] and stored["offered"], stored
    assert stored["status"] == "faster" and stored["speedup"] > 3, stored
    assert stored["reason"].startswith("a bound, not a setting")
    # on this CPU-only run the wait's share bounds nothing (PD306's gain.unbounded): the bound
    # measured 4.38x against a ceiling of 3.78x, and >3x against 2.94x under a CI neighbour's load.
    # The probes found no random draw in the Dataset's fetches: PD306 expects a gain (the wait ~20x
    # faster), a low estimate on a CPU, where the rest of the step speeds up too
    check = stored["model_check"]
    assert check["rule"] == "PD306" and check["ceiling"] is None and check["expected"] > 2, check
    assert check["verdict"] in ("agrees", "above"), check
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    gain = next(f["gain"] for f in report["findings"] if f["id"] == "PD306")
    assert gain["ceiling"] is None and gain["share"] > 0.5                  # a wait of most of the step
    assert gain["expected"] > 2 and "no ceiling (on a CPU-only run the rest of the step" in gain["text"], gain
    assert not doc["best"] or doc["best"]["changes"] != {"store_samples": True}
    assert "store_samples" not in doc["apply"]
