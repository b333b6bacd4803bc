"""How the ranks of a torchrun job share an index and the queries: every such decision, made here.

An index of P partitions (a plain index is one partition) searched by W ranks (``rank_role``):

* P >= W, **partitioned**: rank r holds partitions r, r + W, r + 2W, ... and searches every query;
* P < W with W a multiple of P, **replica groups**: R = W / P copies of the index; rank r holds partition
  r mod P and searches query slice r // P of R. P = 1 is pure **replication**: every rank holds the whole
  index and searches 1/W of the queries, so throughput scales with W while the index fits one device
  (splitting the documents instead leaves each rank the per-batch costs that do not shrink with N);
* any other P < W is refused with the counts that work.

Slices are contiguous and in order (``slice_bounds``), so concatenating the slices gives the query set back.
``BatchPlan`` applies this to a whole query set (``lsr search`` / ``lsr run`` under torchrun,
``lsr.parallel.batch``); ``DistributedSearcher`` applies it to every batch it is given. ``str(plan)``
prints it (``lsr search --explain`` under torchrun), as every plan of lsr (``lsr.utils.plans.Plan``)::

    batch plan: 13 queries, 2 partition(s), 4 rank(s)
      layout  replica groups  (2 copies of the index, each searches its share of the queries)
      rank 0  partitions [0], queries 0..5 (6)
      ...
      merge   rank 0 gathers every rank's top-k once, after all searching  (by score desc, doc index asc; ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from lsr.utils.plans import Plan, Step

__all__ = ["BatchPlan", "RankRole", "plan_batch", "rank_partitions", "rank_role", "slice_bounds"]

SHOWN_RANKS = 8  # ranks listed one per line by BatchPlan's steps; the others are summarised


class RankRole(NamedTuple):
    """What one rank does: its partitions, and which of ``n_slices`` equal slices of the queries it searches."""

    partitions: list[int]
    query_slice: int
    n_slices: int


def rank_role(n_partitions: int, rank: int, world_size: int) -> RankRole:
    """Partitioned (P >= W: every rank searches all queries) or replica groups (W = R * P: rank r searches
    slice r // P of the queries on partition r mod P). Any other P < W is refused with the counts that work."""
    if n_partitions >= world_size:
        return RankRole(list(range(rank, n_partitions, world_size)), 0, 1)
    if world_size % n_partitions:
        raise ValueError(f"an index of {n_partitions} partitions cannot be shared by {world_size} ranks: rebuild it "
                         f"with --partitions {world_size} (or a multiple, or a divisor of {world_size}), or start "
                         f"{n_partitions} ranks")
    return RankRole([rank % n_partitions], rank // n_partitions, world_size // n_partitions)


def rank_partitions(n_partitions: int, rank: int, world_size: int) -> list[int]:
    """Partitions of ``rank``: r, r + W, r + 2W, ... (P >= W); r mod P in replica groups (P < W)."""
    return rank_role(n_partitions, rank, world_size).partitions


def slice_bounds(n: int, n_slices: int) -> list[int]:
    """Start of each of ``n_slices`` contiguous near-equal slices of n rows (sizes differ by one at most), and n."""
    return [n * j // n_slices for j in range(n_slices + 1)]


_WHY = {"one process": "no torchrun job: the partitions are searched in turn and merged",
        "replicas": "the whole index on every rank, each searches 1/{W} of the queries",
        "replica groups": "{R} copies of the index, each searches its share of the queries",
        "partitioned": "the documents split over the ranks, each searches every query"}


@dataclass(frozen=True)
class BatchPlan(Plan):
    """A whole query set searched by the ranks of a job: each rank its slice on its partitions, no collective
    until rank 0 gathers every rank's lists once, at the end, and merges them exactly."""

    n_partitions: int
    world_size: int
    n_queries: int

    @property
    def layout(self) -> str:
        if self.world_size == 1:
            return "one process"
        if self.n_partitions == 1:
            return "replicas"
        return "replica groups" if self.n_partitions < self.world_size else "partitioned"

    def role(self, rank: int) -> RankRole:
        return rank_role(self.n_partitions, rank, self.world_size)

    def query_range(self, rank: int) -> range:
        """The queries ``rank`` searches: a contiguous slice of the query set."""
        role = self.role(rank)
        bounds = slice_bounds(self.n_queries, role.n_slices)
        return range(bounds[role.query_slice], bounds[role.query_slice + 1])

    def title(self) -> str:
        return f"batch plan: {self.n_queries} queries, {self.n_partitions} partition(s), {self.world_size} rank(s)"

    def plan_steps(self) -> tuple[Step, ...]:
        """The layout and why, one row per rank (the first few), the gather."""
        why = _WHY[self.layout].format(W=self.world_size, R=self.world_size // max(1, self.n_partitions))
        steps = [Step("layout", self.layout, why)]
        for r in range(min(self.world_size, SHOWN_RANKS)):
            q = self.query_range(r)
            steps.append(Step(f"rank {r}", f"partitions {self.role(r).partitions}, queries {q.start}..{q.stop - 1} "
                                           f"({len(q)})"))
        if self.world_size > SHOWN_RANKS:
            steps.append(Step("...", f"{self.world_size - SHOWN_RANKS} more ranks"))
        if self.world_size > 1:
            steps.append(Step("merge", "rank 0 gathers every rank's top-k once, after all searching",
                              "by score desc, doc index asc; rank 0 writes the run"))
        return tuple(steps)


def plan_batch(n_partitions: int, world_size: int, n_queries: int) -> BatchPlan:
    """The plan of searching ``n_queries`` queries over an index of ``n_partitions`` with ``world_size`` ranks;
    ValueError (with the counts that work) when the ranks cannot share the partitions."""
    rank_role(n_partitions, 0, world_size)  # the refusal of a layout that does not divide
    return BatchPlan(n_partitions, world_size, n_queries)
