"""Does making a batch draw random numbers (random augmentation)? Told around the loader's fetch.

PD306 tells an input-bound loop to do its per-sample preprocessing once and store the result, and
tune's store_samples trial serves samples prepared once: both assume the work gives the same sample
every epoch. Random augmentation (a random crop or flip, a random time shift of an audio clip,
noise) does not, and a user's audio loader that only shifted its clips at random was told to store
them (the trial measured the augmentation frozen). The hooks cannot read the Dataset's code, but
they can see its draws: around the first PROBES fetches of each process (the trainer's own with
num_workers=0, each worker's), the states of the global generators the usual augmentation
libraries draw from (torch's default CPU generator: torchvision's transforms; Python's `random`:
albumentations and hand-written code; numpy's legacy global RandomState) are read before and
compared after. A fetch that changed one drew random numbers. A numpy Generator the Dataset holds
itself (np.random.default_rng()) is not seen: "no draw" means none from these generators.

Cost: PROBES fetches per process pay a copy of torch's generator state (5 KB) and of Python's and
numpy's (2.5 KB each) twice; every later fetch a counter test.
"""

from __future__ import annotations

import sys

PROBES = 4              # fetches probed in each process


class RandomDraws:
    """One process's probes: `probed` fetches, of which `drew` changed a generator's state."""
    __slots__ = ("probed", "drew", "unreadable")

    def __init__(self):
        self.probed = 0
        self.drew = 0
        self.unreadable = False     # a generator's state could not be read: probe no more

    def before(self):
        """The generators' states before a fetch, or None once PROBES fetches were probed."""
        if self.probed >= PROBES or self.unreadable:
            return None
        try:
            return _states()
        except Exception:           # a generator that cannot be read: no fetch is probed
            self.unreadable = True
            return None

    def after(self, state) -> None:
        if state is None:
            return
        try:
            changed = not _same(state, _states())
        except Exception:
            return
        self.probed += 1
        self.drew += changed

    def info(self) -> dict | None:
        return {"probed": self.probed, "drew": self.drew} if self.probed else None


def _states() -> tuple:
    """(torch's default CPU generator state, Python's random state, numpy's global one): None for
    a module the process has not imported (it cannot have drawn from it)."""
    torch, rnd, np = sys.modules.get("torch"), sys.modules.get("random"), sys.modules.get("numpy")
    t = torch.random.get_rng_state() if torch is not None else None
    r = rnd.getstate() if rnd is not None else None
    n = None
    if np is not None:
        legacy = np.random.get_state(legacy=False)
        n = (legacy["state"]["key"].copy(), legacy["state"]["pos"], legacy.get("has_gauss"))
    return t, r, n


def _same(a: tuple, b: tuple) -> bool:
    (ta, ra, na), (tb, rb, nb) = a, b
    if (ta is None) != (tb is None) or (ta is not None and not bool((ta == tb).all())):
        return False
    if ra != rb:
        return False
    if na is None or nb is None:            # numpy imported during the fetch: its draws are not told
        return True
    return na[1] == nb[1] and na[2] == nb[2] and bool((na[0] == nb[0]).all())
