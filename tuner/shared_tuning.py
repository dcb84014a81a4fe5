"""Tuning a list of shapes when other tuners may share the cache: each shape is leased in
the database before it is searched, so two `sandwichc tune` processes split the work
instead of both searching everything; a lease whose tuner died (no heartbeat for ttl_s)
is taken over. A shape another tuner finished is then found cached."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sandwich.tuner.budget import Budget
from sandwich.tuner.guide import Guides, GuideSettings
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.tuner.rpc_measure import RpcTarget
from sandwich.tuner.tune import OpReport, op_samples, open_pool, tune_op
from sandwich.tuner.tuning_db import lease_owner
from sandwich.types import GemmOp

TTL_S = 30.0  # a lease not renewed for this long belonged to a tuner that died
RENEW_S = 5.0


class _Heartbeat:
    """Renews the owner's leases from a background thread while the process lives, so a
    long search of one M never looks like a dead tuner."""

    def __init__(self, cache: KernelCache, owner: str, every_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cache, owner, every_s),
                                        name="sandwichc-lease", daemon=True)

    def _run(self, cache: KernelCache, owner: str, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                cache.db.renew(owner)
            except Exception:  # noqa: BLE001 - a busy database: the next beat will do
                pass

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def tune_shared(shapes: list[tuple[list[str], GemmOp]], *, seq_max: int, threads: int,
                budget: Budget, cache: KernelCache,
                on_step: Callable[[int], None] = lambda _: None,
                on_shape: Callable[[list[str], GemmOp], None] = lambda *_: None,
                ttl_s: float = TTL_S, renew_s: float = RENEW_S, poll_s: float = 1.0,
                sleep: Callable[[float], None] = time.sleep,
                remote: RpcTarget | None = None, guides: Guides | None = None) -> list[OpReport]:
    """Tune every shape once between all tuners of this cache; reports in `shapes` order."""
    owner = lease_owner()
    # largest first (longest-processing-time order): the tuners finish close together
    pending = sorted(range(len(shapes)), key=lambda i: -shapes[i][1].n * shapes[i][1].k)
    reports: dict[int, OpReport] = {}
    with _Heartbeat(cache, owner, renew_s), \
            open_pool(remote, cache=cache, threads=threads, seq_max=seq_max) as remote:
        while pending:
            progressed = False
            for i in list(pending):
                names, op = shapes[i]
                key = (cache.fingerprint, cache.kernel_n(op.n), op.k, op.dtype, threads)
                if not cache.db.claim(key, owner, ttl_s=ttl_s):
                    continue  # another tuner is on it: come back when it is done
                try:
                    on_shape(names, op)
                    reports[i] = tune_op(names=names, op=op, seq_max=seq_max, threads=threads,
                                         budget=budget, cache=cache, on_step=on_step,
                                         remote=remote,
                                         guide=guides(op.dtype) if guides else None)
                finally:
                    cache.db.release(key, owner)
                    if guides:  # what this shape taught the model outlives a killed tune
                        guides.save()
                pending.remove(i)
                progressed = True
            if pending and not progressed:
                sleep(poll_s)
    return [reports[i] for i in range(len(shapes))]


def tune_shapes(shapes, *, seq_max: int, threads: int, budget, cache, progress: bool = True,
                remote: RpcTarget | None = None, guides: Guides | None = None):
    """Tune each (names, op) over M in [1, seq_max] with a progress bar, sharing the work
    with other tuners of the same cache; the OpReports. Without `guides`, the cost model
    takes the budget's share of each round."""
    from tqdm import tqdm

    if guides is None:
        guides = Guides(GuideSettings(measure_share=budget.measure_share), cache_dir=cache.dir,
                        fingerprint=cache.fingerprint)

    with tqdm(total=sum(len(op_samples(op, budget, seq_max)) for _, op in shapes), unit="M",
              disable=not progress, dynamic_ncols=True) as bar:
        return tune_shared(shapes, seq_max=seq_max, threads=threads, budget=budget, cache=cache,
                           remote=remote, guides=guides, on_step=bar.update, on_shape=lambda names, op: bar.set_description(
                               f"{'+'.join(names)} {op.n}x{op.k}"))
