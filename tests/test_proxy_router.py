"""The routing rule on its own: block hashing, affinity, spill, unmatched, versions, the common-prefix discount."""

import pytest

from grpo_launch.proxy.router import AFFINITY, SPILL, UNMATCHED, PrefixRouter, block_hashes

BS = 4
SYSTEM = list(range(1000, 1012))  # three blocks every prompt starts with


def prompt(i: int, blocks: int = 3) -> list[int]:
    return SYSTEM + [i * 100 + k for k in range(blocks * BS)]


def hashes(tokens, model="policy-v1"):
    return block_hashes(model, tokens, BS)


def router(replicas=4, imbalance=2, max_tracked_blocks=10_000):
    return PrefixRouter(replicas, imbalance=imbalance, max_tracked_blocks=max_tracked_blocks)


ALL = [0, 1, 2, 3]


def test_hashes_are_chained_full_blocks_seeded_by_model():
    a = hashes(list(range(10)))
    assert len(a) == 2  # the partial third block is not cached by vLLM, so not hashed
    assert hashes(list(range(8)) + [99, 98]) == a
    assert hashes([7] + list(range(1, 10)))[1] != a[1]  # a change in block 0 changes every later hash
    assert hashes(list(range(10)), model="policy-v2") != a
    assert hashes([1, 2]) == []
    with pytest.raises(ValueError):
        hashes([[1], [2], [3], [4]])


def test_same_prompt_sticks_to_its_replica():
    r = router()
    first = r.route(hashes(prompt(1)), [0, 0, 0, 0], ALL)
    assert first.kind == UNMATCHED
    loads = [0, 0, 0, 0]
    loads[first.replica] = 2  # busier, but within the margin
    again = r.route(hashes(prompt(1)), loads, ALL)
    assert (again.replica, again.kind) == (first.replica, AFFINITY)
    assert again.matched_blocks == again.prompt_blocks == 6


def test_new_prompts_spread_over_equal_replicas():
    r = router()
    chosen = {r.route(hashes(list(range(i * 50, i * 50 + 8))), [0, 0, 0, 0], ALL).replica for i in range(4)}
    assert chosen == set(ALL)


def test_overloaded_holder_spills_to_least_loaded():
    r = router(imbalance=2)
    home = r.route(hashes(prompt(1)), [0, 0, 0, 0], ALL).replica
    loads = [1, 1, 1, 1]
    loads[home] = 4  # 3 beyond the least loaded: over the margin of 2
    spilled = r.route(hashes(prompt(1)), loads, ALL)
    assert spilled.kind == SPILL and spilled.replica != home
    loads[home] = 3  # exactly at the margin: still affine
    assert r.choose(hashes(prompt(1)), loads, ALL).kind == AFFINITY


def test_longest_prefix_wins_and_ties_go_to_the_less_loaded():
    r = router()
    short, full = prompt(1, blocks=1), prompt(1, blocks=3)
    r.record(hashes(short), 0)
    r.record(hashes(full), 2)
    assert r.choose(hashes(full), [0, 0, 1, 0], ALL).replica == 2
    r.record(hashes(full), 3)  # after a spill two replicas hold it all
    assert r.choose(hashes(full), [0, 0, 2, 1], ALL).replica == 3


def test_versions_never_share_a_prefix():
    r = router()
    r.route(hashes(prompt(1), "policy-v3"), [0, 0, 0, 0], ALL)
    d = r.choose(hashes(prompt(1), "policy-v4"), [0, 0, 0, 0], ALL)
    assert d.kind == UNMATCHED and d.matched_blocks == 0


def test_shared_system_prompt_attracts_nobody():
    r = router()
    home = r.route(hashes(prompt(1)), [0, 0, 0, 0], ALL).replica
    r.route(hashes(prompt(2)), [0, 0, 0, 0], ALL)  # second continuation of the system prompt: now a branch point
    loads = [0, 0, 0, 0]
    loads[home] = 1
    third = r.choose(hashes(prompt(3)), loads, ALL)
    assert third.kind == UNMATCHED and third.common_blocks == 3 and third.replica != home


def test_prefix_every_replica_holds_is_not_specific():
    r = router()
    shared = hashes(SYSTEM)
    for i in ALL:
        r.record(shared, i)
    d = r.choose(hashes(prompt(9)), [3, 0, 3, 3], ALL)
    assert d.kind == UNMATCHED and d.common_blocks == 3 and d.replica == 1


def test_only_available_replicas_are_chosen_and_forget_drops_ownership():
    r = router()
    r.record(hashes(prompt(1)), 1)
    assert r.choose(hashes(prompt(1)), [0, 0, 0, 0], [0, 2, 3]).replica != 1
    r.forget(1)
    assert r.choose(hashes(prompt(1)), [0, 0, 0, 0], ALL).kind == UNMATCHED
    with pytest.raises(LookupError):
        r.choose(hashes(prompt(1)), [0, 0, 0, 0], [])


def test_table_is_lru_bounded():
    r = router(max_tracked_blocks=10)
    for i in range(20):
        r.record(hashes(list(range(i * 100, i * 100 + 8))), i % 4)
    assert r.tracked_blocks == 10
    assert r.choose(hashes(list(range(1900, 1908))), [0] * 4, ALL).kind == AFFINITY  # newest kept
    assert r.choose(hashes(list(range(0, 8))), [0] * 4, ALL).kind == UNMATCHED  # oldest evicted
    r.clear()
    assert r.tracked_blocks == 0


class _Unwalkable(dict):
    """A routing table that fails any walk over all its blocks."""

    def _walk(self, *args):
        raise AssertionError("walked the whole table")

    values = items = keys = __iter__ = _walk


def test_forget_touches_no_block_and_ownership_returns_with_new_prompts():
    r = router()
    for i in range(40):
        r.record(hashes(prompt(i)), i % 4)
    table = r._table
    r._table = _Unwalkable(table)  # a departure used to visit every block (50-350 ms at 500k blocks)
    r.forget(1)
    r._table = table
    assert r.choose(hashes(prompt(1)), [0, 0, 0, 0], ALL).kind == UNMATCHED  # replica 1's prompts: forgotten
    assert r.choose(hashes(prompt(2)), [0, 0, 0, 0], ALL).replica == 2      # the others' are kept
    r.record(hashes(prompt(1)), 1)                                            # served there again after it returned
    assert r.choose(hashes(prompt(1)), [0, 0, 0, 0], ALL).replica == 1
    r.record(hashes(prompt(5)), 3)  # prompt 5 is on replicas 1 (forgotten) and 3
    r.forget(3)
    assert r.choose(hashes(prompt(5)), [0, 0, 0, 0], ALL).kind == UNMATCHED
    assert r.choose(hashes(prompt(1)), [0, 0, 0, 0], ALL).replica == 1      # recorded after 1 left: still held
