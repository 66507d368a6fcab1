"""Which replica should serve a prompt: a GRPO group as a unit, KV-prefix affinity, loads in outstanding tokens.
Pure: no sockets, no clock.

vLLM caches a prompt's KV in full blocks of `block_size` tokens, keyed by a chained hash of everything before (and
the adapter). The router mirrors that: it hashes the prompt's full blocks the same way, seeded with the request's
`model` (a versioned adapter name, so policy v3's prefix never matches v4), and remembers in an LRU table which
replica served each block.

- A request whose whole prompt (model and every token) is that of a request still in flight is a sibling in its
  group (TRL sends a prompt's G completions together): it goes where the group went, whatever the loads, so the
  group's prompt is prefilled once.
- Otherwise the prompt goes where its longest prompt-specific prefix lives, unless that replica is overloaded: its
  outstanding tokens exceed the least-loaded replica's by more than `imbalance` requests' worth (the mean request
  in flight) and are more than twice as many. The prefix every replica holds, or that many different prompts
  continue (a system prompt, a chat template), is not specific and attracts nobody.
- A prompt with no specific prefix, or one that spills, goes to the replica that has been sent the fewest tokens
  among those that are not overloaded: the run's work is split evenly (a group is one prompt's G requests, so it is
  split group by group), and a slow or busy replica still gets no more than its margin.

A request's tokens are its prompt and `max_tokens`: what the replica's KV cache holds for it while it runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

BlockHash = int
GROUP, AFFINITY, SPILL, UNMATCHED = "group", "affinity", "spill", "unmatched"
KINDS = (GROUP, AFFINITY, SPILL, UNMATCHED)
# A replica is overloaded beyond `imbalance` requests' worth only if it also holds this many times what the least
# loaded holds (SGLang's router asks both an absolute and a relative excess too). With many groups in flight, a
# group or two more is noise: shedding at 1.25x split the benchmark's work by the replicas' momentary speed (prompt
# tokens 1.05-1.21x the mean on 2 CPU replicas), at 2x it stayed even (1.00-1.03x) with no longer makespan.
RELATIVE_EXCESS = 2.0
Kind = Literal["group", "affinity", "spill", "unmatched"]


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


@dataclass(frozen=True)
class Prompt:
    """What routing needs of one request."""

    hashes: Sequence[BlockHash] = ()    # its full blocks (block_hashes)
    group: object = None                # the whole prompt (model and every token): equal for a group's requests
    weight: int = 0                     # tokens it holds while in flight: prompt plus max_tokens


def prompt_of(model: str, tokens: Sequence[int], block_size: int, max_tokens: int) -> Prompt:
    hashes = block_hashes(model, tokens, block_size)
    tail = tuple(tokens[len(hashes) * block_size:])
    return Prompt(hashes, (hashes[-1] if hashes else hash(model), tail), len(tokens) + max_tokens)


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
    prompt: Prompt
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
        self.outstanding = [0] * replicas       # tokens of the requests each replica is serving
        self.sent = [0] * replicas              # tokens of every request sent to each replica
        self._inflight = 0                      # requests being served, all replicas together
        self._groups: dict[object, list[int]] = {}  # group in flight -> [replica, requests in flight]
        self._table: OrderedDict[BlockHash, _Block] = OrderedDict()
        self._next = 0  # rotates the start of least-loaded ties, so equal replicas take turns
        # Departures are applied lazily: replica r's ownership of a block stamped at or before _forgotten[r] is stale.
        self._records = 0                       # record() calls so far: the stamp clock
        self._forgotten = [0] * replicas
        self._last_forgotten = 0

    @property
    def tracked_blocks(self) -> int:
        return len(self._table)

    def route(self, prompt: Prompt, available: Sequence[int]) -> Decision:
        """Choose among `available` replica indices, remember that the choice now holds the prompt's blocks, and
        count the request as in flight there until `finish`."""
        decision = self.choose(prompt, available)
        self.record(prompt.hashes, decision.replica)
        self.outstanding[decision.replica] += prompt.weight
        self.sent[decision.replica] += prompt.weight
        self._inflight += 1
        if prompt.group is not None:
            group = self._groups.setdefault(prompt.group, [decision.replica, 0])
            group[0] = decision.replica
            group[1] += 1
        return decision

    def finish(self, decision: Decision) -> None:
        """The request routed by `decision` ended: answered, failed or abandoned."""
        self.outstanding[decision.replica] -= decision.prompt.weight
        self._inflight -= 1
        group = self._groups.get(decision.prompt.group)
        if group is not None:
            group[1] -= 1
            if not group[1]:
                del self._groups[decision.prompt.group]

    def choose(self, prompt: Prompt, available: Sequence[int]) -> Decision:
        if not available:
            raise LookupError("no replica available")
        hashes, n = prompt.hashes, len(prompt.hashes)
        group = self._groups.get(prompt.group) if prompt.group is not None else None
        if group is not None and group[0] in available:
            return Decision(group[0], GROUP, prompt, n, n, 0)

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

        load = self.outstanding
        best, best_specific = -1, 0
        for r, m in matched.items():
            specific = m - common
            if specific > best_specific or (specific == best_specific > 0 and load[r] < load[best]):
                best, best_specific = r, specific
        least = min(load[r] for r in available)
        bound = max(least + self.imbalance * self._mean_weight(), least * RELATIVE_EXCESS)
        if best >= 0 and load[best] <= bound:
            return Decision(best, AFFINITY, prompt, n, matched[best], common)
        chosen = self._evenly([r for r in available if load[r] <= bound])
        return Decision(chosen, SPILL if best >= 0 else UNMATCHED, prompt, n, matched.get(chosen, 0), common)

    def _mean_weight(self) -> float:
        return sum(self.outstanding) / self._inflight if self._inflight else 0.0

    def _evenly(self, candidates: Sequence[int]) -> int:
        """The candidate sent the fewest tokens; equal ones take turns."""
        n = len(candidates)
        start, self._next = self._next % n, self._next + 1
        return min((candidates[(start + k) % n] for k in range(n)), key=self.sent.__getitem__)

    def rejoined(self, replica: int, others: Sequence[int]) -> None:
        """The replica is back in routing: it counts as sent as much as the least-sent of the others, so the split
        goes on evenly from here rather than sending it everything until it has caught up."""
        self.sent[replica] = min((self.sent[r] for r in others), default=0)

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
