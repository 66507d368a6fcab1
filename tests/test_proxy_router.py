"""The routing rule on its own: block hashing, groups, affinity, spill, unmatched, versions, the common-prefix
discount, loads in outstanding tokens."""

import pytest

from grpo_launch.proxy.router import AFFINITY, GROUP, SPILL, UNMATCHED, PrefixRouter, Prompt, block_hashes, prompt_of

BS = 4
SYSTEM = list(range(1000, 1012))  # three blocks every prompt starts with


def prompt(i: int, blocks: int = 3) -> list[int]:
    return SYSTEM + [i * 100 + k for k in range(blocks * BS)]


def hashes(tokens, model="policy-v1"):
    return block_hashes(model, tokens, BS)


def ask(tokens, model="policy-v1", max_tokens=0):
    return prompt_of(model, tokens, BS, max_tokens)


def busy(r, replica: int, tokens: int):
    """A request of `tokens` outstanding tokens in flight on `replica` (no prefix of its own)."""
    return r.route(Prompt(weight=tokens), [replica])


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


def test_a_groups_requests_follow_the_first_whatever_the_loads():
    r = router(imbalance=0)
    first = r.route(ask(prompt(1)), ALL)
    assert first.kind == UNMATCHED
    busy(r, first.replica, 10_000)  # far over any margin
    siblings = [r.route(ask(prompt(1)), ALL) for _ in range(7)]
    assert {(d.replica, d.kind) for d in siblings} == {(first.replica, GROUP)}
    for d in [first, *siblings]:
        r.finish(d)
    later = r.route(ask(prompt(1)), ALL)  # the group is over: the same prompt again is judged by its loads
    assert later.kind == SPILL and later.replica != first.replica


def test_same_prompt_sticks_to_its_replica_within_the_margin():
    r = router(imbalance=2)
    first = r.route(ask(prompt(1), max_tokens=20), ALL)  # weight 44
    r.finish(first)
    busy(r, first.replica, 80)  # under 2 requests' worth of the mean in flight (80) above the others (0)
    again = r.route(ask(prompt(1)), ALL)
    assert (again.replica, again.kind) == (first.replica, AFFINITY)
    assert again.matched_blocks == again.prompt_blocks == 6


def test_new_prompts_split_the_work_evenly_unless_a_replica_is_overloaded():
    r = router(imbalance=2)
    chosen = [r.route(ask(list(range(i * 50, i * 50 + 8)), max_tokens=10), ALL) for i in range(4)]
    assert sorted(d.replica for d in chosen) == ALL  # equal replicas take turns
    for d in chosen:
        r.finish(d)
    long = r.route(ask(list(range(900, 940)), max_tokens=10), ALL)  # 50 tokens; each replica was sent 18
    r.finish(long)
    assert r.sent[long.replica] == 68
    others = {r.route(ask(list(range(k * 1000, k * 1000 + 8)), max_tokens=10), ALL).replica for k in (3, 4, 5)}
    assert long.replica not in others  # it was sent the most: the others catch up first
    r.sent[long.replica] = 0  # now it was sent the least, but it is busy far beyond the margin
    busy(r, long.replica, 200)
    assert r.route(ask(list(range(7000, 7008)), max_tokens=10), ALL).replica != long.replica


def test_a_returning_replica_joins_the_split_where_the_others_are():
    r = router()
    for i in range(8):
        r.route(ask(list(range(i * 50, i * 50 + 8))), [0, 1, 2])
    r.rejoined(3, [0, 1, 2])
    assert r.sent[3] == min(r.sent[:3]) > 0  # not sent everything until it has caught up with the others


def test_overloaded_holder_spills_to_least_loaded():
    r = router(imbalance=2)
    home = r.route(ask(prompt(1)), ALL)
    r.finish(home)
    for i in ALL:
        busy(r, i, 10)
    busy(r, home.replica, 25)  # mean in flight 13: a margin of 26; home is 25 above the rest
    assert r.choose(ask(prompt(1)), ALL).kind == AFFINITY
    busy(r, home.replica, 10)  # mean 12.5: a margin of 25; home is 35 above
    spilled = r.route(ask(prompt(1)), ALL)
    assert spilled.kind == SPILL and spilled.replica != home.replica


def test_with_many_requests_in_flight_only_twice_the_least_load_is_overload():
    r = router(imbalance=1)
    home = r.route(ask(prompt(1)), ALL)
    r.finish(home)
    for i in ALL:
        for _ in range(10):
            busy(r, i, 10)  # 100 outstanding tokens each
    for _ in range(9):
        busy(r, home.replica, 10)  # 190: far over 1 request's worth above the others, not twice as many
    assert r.choose(ask(prompt(1)), ALL).kind == AFFINITY
    for _ in range(2):
        busy(r, home.replica, 10)  # 210: more than twice as many
    assert r.choose(ask(prompt(1)), ALL).kind == SPILL


def test_longest_prefix_wins_and_ties_go_to_the_less_loaded():
    r = router()
    short, full = prompt(1, blocks=1), prompt(1, blocks=3)
    r.record(hashes(short), 0)
    r.record(hashes(full), 2)
    busy(r, 2, 1)
    assert r.choose(ask(full), ALL).replica == 2
    r.record(hashes(full), 3)  # after a spill two replicas hold it all
    busy(r, 2, 1)
    busy(r, 3, 1)
    assert r.choose(ask(full), ALL).replica == 3


def test_versions_never_share_a_prefix():
    r = router()
    r.finish(r.route(ask(prompt(1), "policy-v3"), ALL))
    d = r.choose(ask(prompt(1), "policy-v4"), ALL)
    assert d.kind == UNMATCHED and d.matched_blocks == 0


def test_shared_system_prompt_attracts_nobody():
    r = router()
    home = r.route(ask(prompt(1)), ALL)
    r.route(ask(prompt(2)), ALL)  # second continuation of the system prompt: now a branch point
    third = r.choose(ask(prompt(3)), ALL)
    assert third.kind == UNMATCHED and third.common_blocks == 3 and third.replica != home.replica


def test_prefix_every_replica_holds_is_not_specific():
    r = router()
    shared = hashes(SYSTEM)
    for i in ALL:
        r.record(shared, i)
    for i in (0, 2, 3):
        busy(r, i, 3)
    d = r.choose(ask(prompt(9)), ALL)
    assert d.kind == UNMATCHED and d.common_blocks == 3 and d.replica == 1


def test_only_available_replicas_are_chosen_and_forget_drops_ownership():
    r = router()
    r.record(hashes(prompt(1)), 1)
    assert r.choose(ask(prompt(1)), [0, 2, 3]).replica != 1
    r.forget(1)
    assert r.choose(ask(prompt(1)), ALL).kind == UNMATCHED
    with pytest.raises(LookupError):
        r.choose(ask(prompt(1)), [])


def test_a_group_whose_replica_left_goes_elsewhere_and_stays_together():
    r = router()
    first = r.route(ask(prompt(1)), ALL)
    others = [i for i in ALL if i != first.replica]
    moved = r.route(ask(prompt(1)), others)  # a retry after its replica died
    assert moved.replica != first.replica
    assert r.route(ask(prompt(1)), ALL).replica == moved.replica  # the rest of the group follows it


def test_loads_return_to_zero_when_requests_finish():
    r = router()
    decisions = [r.route(ask(prompt(i % 3), max_tokens=8), ALL) for i in range(12)]
    assert sum(r.outstanding) == sum(d.prompt.weight for d in decisions) == 12 * (len(prompt(0)) + 8)
    for d in decisions:
        r.finish(d)
    assert r.outstanding == [0, 0, 0, 0] and not r._groups


def test_table_is_lru_bounded():
    r = router(max_tracked_blocks=10)
    for i in range(20):
        r.record(hashes(list(range(i * 100, i * 100 + 8))), i % 4)
    assert r.tracked_blocks == 10
    assert r.choose(ask(list(range(1900, 1908))), ALL).kind == AFFINITY  # newest kept
    assert r.choose(ask(list(range(0, 8))), ALL).kind == UNMATCHED  # oldest evicted
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
    assert r.choose(ask(prompt(1)), ALL).kind == UNMATCHED  # replica 1's prompts: forgotten
    assert r.choose(ask(prompt(2)), ALL).replica == 2      # the others' are kept
    r.record(hashes(prompt(1)), 1)                                            # served there again after it returned
    assert r.choose(ask(prompt(1)), ALL).replica == 1
    r.record(hashes(prompt(5)), 3)  # prompt 5 is on replicas 1 (forgotten) and 3
    r.forget(3)
    assert r.choose(ask(prompt(5)), ALL).kind == UNMATCHED
    assert r.choose(ask(prompt(1)), ALL).replica == 1      # recorded after 1 left: still held
