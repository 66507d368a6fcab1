"""Which replica should serve a prompt: KV-prefix affinity with a load guard. Pure: no sockets, no clock.

vLLM caches a prompt's KV in full blocks of `block_size` tokens, keyed by a chained hash of everything before (and
the adapter). The router mirrors that: it hashes the prompt's full blocks the same way, seeded with the request's
`model` (a versioned adapter name, so policy v3's prefix never matches v4), and remembers in an LRU table which
replica served each block. A prompt goes where its longest prompt-specific prefix lives, unless that replica is
overloaded; the prefix every replica holds, or that many different prompts continue (a system prompt, a chat
template), is not specific and attracts nobody.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

BlockHash = int
AFFINITY, SPILL, UNMATCHED = "affinity", "spill", "unmatched"
Kind = Literal["affinity", "spill", "unmatched"]


def block_hashes(model: str, tokens: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of the prompt's full blocks; a partial last block is never cached, so it is not hashed.

    Python's 64-bit tuple hash: the table lives in this one process, so per-process salting does not matter, and it
    is 3-4x faster than a digest (it runs on every request). A collision misroutes one prompt, nothing worse.
    Raises ValueError when `tokens` holds something unhashable.
    """
    full = len(tokens) // block_size * block_size
    parent = hash(model)
    hashes = []
    try:
        ids = tuple(tokens[:full])
        for start in range(0, full, block_size):
            parent = hash((parent, ids[start:start + block_size]))
            hashes.append(parent)
    except TypeError as e:
        raise ValueError("prompt token ids must be integers") from e
    return hashes


class _Block:
    """What the router knows of one block: who served it, and whether different prompts continue it."""

    __slots__ = ("owners", "stamp", "successor", "branches")

    def __init__(self) -> None:
        self.owners = 0                         # bit i: replica i served a prompt through this block
        self.stamp = 0                          # owners are valid as of this record (see PrefixRouter.forget)
        self.successor: BlockHash | None = None
        self.branches = False                   # two different next blocks seen: a shared template, not a prompt


@dataclass(frozen=True)
class Decision:
    replica: int
    kind: Kind
    prompt_blocks: int
    matched_blocks: int                         # leading blocks the chosen replica was last seen holding
    common_blocks: int                          # leading blocks that are not prompt-specific


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class PrefixRouter:
    def __init__(self, replicas: int, *, imbalance: int, max_tracked_blocks: int) -> None:
        self.replicas = replicas
        self.imbalance = imbalance
        self.max_tracked_blocks = max_tracked_blocks
        self._table: OrderedDict[BlockHash, _Block] = OrderedDict()
        self._next = 0  # rotates the start of least-loaded ties, so equal replicas take turns
        # Departures are applied lazily: replica r's ownership of a block stamped at or before _forgotten[r] is stale.
        self._records = 0                       # record() calls so far: the stamp clock
        self._forgotten = [0] * replicas
        self._last_forgotten = 0

    @property
    def tracked_blocks(self) -> int:
        return len(self._table)

    def route(self, hashes: Sequence[BlockHash], inflight: Sequence[int], available: Sequence[int]) -> Decision:
        """Choose among `available` replica indices and remember that the choice now holds these blocks."""
        decision = self.choose(hashes, inflight, available)
        self.record(hashes, decision.replica)
        return decision

    def choose(self, hashes: Sequence[BlockHash], inflight: Sequence[int], available: Sequence[int]) -> Decision:
        if not available:
            raise LookupError("no replica available")
        everyone = 0
        for r in available:
            everyone |= 1 << r
        holders, matched, common, depth, table = everyone, {}, 0, 0, self._table
        for h in hashes:
            block = table.get(h)
            if block is None:
                break
            owners = self._owners(block)
            if block.branches or owners & everyone == everyone:
                common = depth + 1
            if holders & ~owners:  # these replicas' prefixes end here
                for r in _bits(holders & ~owners):
                    matched[r] = depth
                holders &= owners
            depth += 1
        for r in _bits(holders):
            matched[r] = depth

        best, best_specific = -1, 0
        for r, m in matched.items():
            specific = m - common
            if specific > best_specific or (specific == best_specific > 0 and inflight[r] < inflight[best]):
                best, best_specific = r, specific
        if best >= 0 and inflight[best] - min(inflight[r] for r in available) <= self.imbalance:
            return Decision(best, AFFINITY, len(hashes), matched[best], common)
        least = self.least_loaded(inflight, available)
        return Decision(least, SPILL if best >= 0 else UNMATCHED, len(hashes), matched.get(least, 0), common)

    def least_loaded(self, inflight: Sequence[int], available: Sequence[int]) -> int:
        """The replica with the fewest requests in flight; equal ones take turns."""
        n = len(available)
        start, self._next = self._next % n, self._next + 1
        return min((available[(start + k) % n] for k in range(n)), key=inflight.__getitem__)

    def record(self, hashes: Sequence[BlockHash], replica: int) -> None:
        bit, table, previous = 1 << replica, self._table, None
        self._records += 1
        for h in hashes:
            block = table.get(h)
            if block is None:
                block = table[h] = _Block()
            else:
                table.move_to_end(h)
                self._owners(block)
            block.owners |= bit
            block.stamp = self._records
            if previous is not None and not previous.branches:
                if previous.successor is None:
                    previous.successor = h
                elif previous.successor != h:
                    previous.branches = True
            previous = block
        while len(table) > self.max_tracked_blocks:
            table.popitem(last=False)

    def forget(self, replica: int) -> None:
        """The replica lost its cache (it died or restarted): stop sending prompts there for their prefix.

        Constant time, whatever the table holds (a walk of 500k blocks took 50-350 ms of the event loop): the
        replica's bit is dropped from each block when the block is next read or written (`_owners`)."""
        self._forgotten[replica] = self._last_forgotten = self._records

    def _owners(self, block: _Block) -> int:
        """The block's owners, without replicas that left routing since it was last stamped."""
        if block.stamp > self._last_forgotten:
            return block.owners
        stale = 0
        for r, at in enumerate(self._forgotten):
            if at >= block.stamp:
                stale |= 1 << r
        block.owners &= ~stale
        block.stamp = self._records  # what is left is valid now: a later departure is seen again
        return block.owners

    def clear(self) -> None:
        """Every replica's prefix cache was reset."""
        self._table.clear()
