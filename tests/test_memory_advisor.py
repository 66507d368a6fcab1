"""The advisor's layouts fit when applied through the real compose, keep the command line's choices, and its search
is pruned."""

from dataclasses import replace

import pytest

from grpo_launch.compose import compose
from grpo_launch.plan import advisor, build_plan
from grpo_launch.plan.advisor import Knobs, advise

GPU_RECIPES = ["qwen1.5b-async-lora", "qwen1.5b-colocate", "qwen1.5b-server", "qwen72b-colocate", "qwen72b-server",
               "qwen7b-colocate", "qwen7b-server"]


def _advice(*overrides):
    composed = compose(list(overrides))
    return composed, advise(composed, build_plan(composed))


def _applied(overrides, suggestion):
    """The suggestion's overrides appended to the user's, composed by Hydra and planned like `grpo plan` would."""
    composed = compose([*overrides, *suggestion.overrides])
    return composed, build_plan(composed)


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_first_choice_fits_when_applied_through_compose(recipe):
    overrides = [f"recipe={recipe}"]
    _, advice = _advice(*overrides)
    first = advice.suggestions[0]
    composed, plan = _applied(overrides, first)
    assert plan.memory.fits
    assert Knobs.of(composed.config, plan) == first.knobs


def test_zero2_suggestions_all_fit_and_say_what_they_drop():
    overrides = ["recipe=qwen72b-colocate", "zero=2"]
    _, advice = _advice(*overrides)
    assert advice.freed == ("zero=2",)
    assert len(advice.suggestions) == 3
    for suggestion in advice.suggestions:
        assert any(o.startswith("zero.stage=3") for o in suggestion.overrides)
        assert _applied(overrides, suggestion)[1].memory.fits


def test_ranked_by_the_proxy():
    _, advice = _advice("recipe=qwen7b-server")
    scores = [s.score for s in advice.suggestions]
    assert scores == sorted(scores)
    assert advice.suggestions[0].plan.world_size == 8  # colocate trains on all 8 GPUs; the server recipe on 6


def test_command_line_choices_stay_when_a_layout_fits_with_them():
    _, advice = _advice("recipe=qwen72b-colocate", "vllm.tensor_parallel_size=8", "placement.colocate.sleep_level=2")
    assert advice.freed == ()
    for suggestion in advice.suggestions:
        assert (suggestion.knobs.tp, suggestion.knobs.sleep_level) == (8, 2)
        assert not [o for o in suggestion.overrides if o.startswith(("vllm.tensor_parallel_size", "vllm.sleep"))]


def test_the_plan_itself_is_a_suggestion_when_it_ranks():
    _, advice = _advice("recipe=qwen1.5b-colocate")
    assert advice.suggestions[0].overrides == ()


def test_only_the_choices_the_suggestions_change_are_named():
    _, advice = _advice("recipe=qwen72b-colocate", "zero=2", "placement.colocate.sleep_level=2")
    assert "zero=2" in advice.freed
    sleep_levels = {s.knobs.sleep_level for s in advice.suggestions}
    assert ("placement.colocate.sleep_level=2" in advice.freed) == (sleep_levels != {2})


def test_cpu_recipe_gets_no_suggestions_and_says_why():
    advice = _advice()[1]
    assert advice.suggestions == () and "cpu" in advice.skipped


def test_the_search_plans_each_layout_once_and_stops_where_memory_runs_out(monkeypatch):
    """What keeps the search instant for `grpo plan` (the slowest case: two searches, the second without the
    command line's choices, ~200 layouts planned), asserted as behaviour rather than as a wall time: a search plans
    no layout twice, and for one shape and micro-batch it tries the utilizations in ascending order only until a
    plan is refused or goes over capacity."""
    composed = compose(["recipe=qwen72b-colocate", "zero=2"])
    plan = build_plan(composed)
    searches: list[list] = []
    search, attempt = advisor._search, advisor._try

    def recorded_search(*args):
        searches.append([])
        return search(*args)

    def recorded_attempt(composed, knobs):
        result = attempt(composed, knobs)
        searches[-1].append((knobs, result))
        return result

    monkeypatch.setattr(advisor, "_search", recorded_search)
    monkeypatch.setattr(advisor, "_try", recorded_attempt)
    assert advise(composed, plan).suggestions
    assert len(searches) == 2
    several = 0  # shapes that tried more than one utilization: the rule below is exercised
    for planned in searches:
        assert len({knobs for knobs, _ in planned}) == len(planned)
        shapes: dict = {}
        for knobs, result in planned:
            shapes.setdefault(replace(knobs, utilization=0.0), []).append((knobs.utilization, result))
        for tried in shapes.values():
            several += len(tried) > 1
            assert [u for u, _ in tried] == sorted(u for u, _ in tried)
            assert all(result is not None and not advisor._over_capacity(result) for _, result in tried[:-1])
    assert several
