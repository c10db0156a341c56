"""How a blocking work-queue call waits for the other side of the ring.

A blocked push waits for consumers to free slots, a blocked pop for producers to publish
items.  A wait spins without the GIL (the C ring) for as long as the other side moves: a
ring that a kernel is draining (or filling) is waited for by spinning, never by sleeping,
and every call that makes progress starts afresh.  Only once the other side did not move
for its *pace* (below) does the wait back off: ``IDLE_ROUNDS`` such spins, then sleeps from
``FIRST_SLEEP`` doubling up to ``MAX_SLEEP``, each followed by one look at the ring.

The pace.  How long the other side may sit still and still count as moving starts at
``IDLE_NS`` (``IDLE_NS_SHARED`` where a kernel runs on the host's cores, a CPU device: a
work-item may need this core) and follows the other side: when a call that had backed
off to sleeping (its spins gave up) makes progress within ``MAX_IDLE_NS`` of its first
wait, the other side was slow, not idle, and later waits spin for twice that gap (a
work-group that takes 550 µs a
claim, PoCL's pthread device running a 64-item claim of hashes, is waited for by spinning,
where a fixed 50 µs slept on two waits in three).  A gap of ``MAX_IDLE_NS`` or more resets
the pace: the other side stopped.

What a blocked call costs.  On a queue whose other side stopped, a call spins for at most
``IDLE_ROUNDS`` paces (at most ``2 * MAX_IDLE_NS``, 4 ms, right after a slow but moving other
side; 100 µs or 400 µs otherwise), then looks once a millisecond (about 3 % of a core,
measured with Intel's CPU runtime on a 2-core host) and notices the other side within
about a millisecond once it resumes.  (A persistent kernel blocked in ``wq_pop`` spins on
the device: on a CPU device that is a core at 100 % until the queue is closed.)

On a CPU device a single-item wait (push, pop: latency) also yields the core
(``sched_yield``) once nothing moved for 5 µs, so a work-item that shares this thread's
core can answer at once (p50 1.2 µs against 189 µs without); batch waits do not yield
(throughput: a yield on a busy host can lose the core for a whole time slice, and yielding
on every look made a drained producer several times slower).  And there only one host
thread spins at a time: others back off to sleeping at once (three host threads spinning
on a 2-core host starved the kernel they waited for).
"""

from __future__ import annotations

import time

from svmkit.workqueue import ring as host_ring

__all__ = ["GATHER", "IDLE_ROUNDS", "Pace", "backoff", "gather"]

IDLE_NS = 200_000
IDLE_NS_SHARED = 50_000
MAX_IDLE_NS = 2_000_000
IDLE_ROUNDS = 2
FIRST_SLEEP = 2e-5
MAX_SLEEP = 1e-3
# A batch call that finds the ring not ready waits for a run of free (or published) slots
# instead of trailing the other side slot by slot: up to GATHER slots, at most a
# GATHER_RING_SHARE-th of the ring (see gather()).
GATHER = 512
GATHER_RING_SHARE = 4


def gather(remaining: int, capacity: int) -> int:
    """How many ready slots a blocked batch call (``push_many``, ``pop_many``) of
    ``remaining`` items asks the C ring's wait for: ``min(remaining, GATHER, capacity /
    GATHER_RING_SHARE)``, but 2 at least (a wait for 1 is a single-item wait, which
    yields the core on a CPU device) unless one item is all that is left.  The wait ends
    once that many are ready or 2 µs after the first was (``GATHER_NS``), and the call
    claims what is ready then; the pure-Python ring claims what is ready at once.

    A producer that claims each slot as soon as the device frees it writes the cache line
    the device is still freeing the next slots of, so the line goes back and forth once per
    slot instead of once per run.  Asking for a longer run keeps the two sides apart:
    ``wq_pop_ahead`` fed by ``push_many(4096)`` through a 65,536-slot ring, Intel's CPU
    runtime on a 2-core host, 62 M items/s asking for 64 (82 % of one work-item's
    ``wq_pop`` drain rate), 95 M/s asking for 512 (124 %); the 1,024-slot task queue of
    ``svmkit demo tasks`` ran the same asking for 64 and 256.  A quarter of the ring at
    most, so a small ring is still refilled while the device drains the rest of it.
    """
    return max(1, min(remaining, GATHER, max(2, capacity // GATHER_RING_SHARE)))


_ONE_SPINNER, _YIELD = 1, 2  # ring.wait flags (see the C ring's wait)


class Pace:
    """How long one side of one ring may sit still before a wait for it deems it idle.

    One per queue and direction (the producers' pace is what a blocked pop waits by, the
    consumers' what a blocked push waits by).  Host threads update it without a lock: it is
    one integer, and any recent value is a good one.
    """

    __slots__ = ("base_ns", "idle_ns")

    def __init__(self, shares_cores: bool) -> None:
        self.base_ns = IDLE_NS_SHARED if shares_cores else IDLE_NS
        self.idle_ns = self.base_ns

    def clock_if_learned(self) -> int:
        """The start of a single-item wait: now while the pace is a learned one (a gap the
        first spin catches decays it), else 0.  At the base pace a call that progresses
        within its first spin teaches nothing, so it reads no clock and calls nothing (those
        were 0.2 µs of a 1 µs host -> device -> host round trip)."""
        return time.monotonic_ns() if self.idle_ns > self.base_ns else 0

    def first_spin_started(self) -> int:
        """The start of a wait whose first spin just gave up: that spin ran for the pace
        with nothing moving, so now minus the pace."""
        return time.monotonic_ns() - self.idle_ns

    def moved(self, gap_ns: int, rounds: int) -> None:
        """A call made progress ``gap_ns`` after its first wait, having waited ``rounds``
        times.  A gap the spins missed (``IDLE_ROUNDS`` waits or more: they gave up) but
        under ``MAX_IDLE_NS`` was a slow other side: spin twice as long from now on.  A gap
        the spin caught lets the pace decay towards twice that gap.  ``MAX_IDLE_NS`` or
        more: it had stopped, start over."""
        if gap_ns >= MAX_IDLE_NS:
            self.idle_ns = self.base_ns
        elif rounds >= IDLE_ROUNDS:
            self.idle_ns = min(MAX_IDLE_NS, max(self.idle_ns, 2 * gap_ns))
        elif self.idle_ns > self.base_ns:
            self.idle_ns = max(self.base_ns, 2 * gap_ns, self.idle_ns - self.idle_ns // 8)


def backoff(
    ring: host_ring.RingOps,
    for_pop: bool,
    round_: int,
    want: int = 1,
    shares_cores: bool = False,
    idle_ns: int | None = None,
) -> None:
    """Wait once for the ring.  ``round_`` counts the waits since this call last made
    progress (callers reset it to 0 when an item went through): the first ``IDLE_ROUNDS``
    spin while the other side moves (``idle_ns``: its :class:`Pace`), later ones sleep,
    doubling from ``FIRST_SLEEP`` to ``MAX_SLEEP``; ``shares_cores``: the kernel runs on
    the host's cores (one spinning thread at a time; a single-item wait, ``want == 1``,
    yields the core once nothing moved for 5 µs)."""
    if round_ < IDLE_ROUNDS:
        if shares_cores:
            flags = _ONE_SPINNER | (_YIELD if want == 1 else 0)
            ring.wait(for_pop, idle_ns or IDLE_NS_SHARED, want, flags)
        else:
            ring.wait(for_pop, idle_ns or IDLE_NS, want)
    else:
        time.sleep(min(MAX_SLEEP, FIRST_SLEEP * (1 << min(round_ - IDLE_ROUNDS, 16))))
