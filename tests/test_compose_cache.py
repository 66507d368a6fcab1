"""The composition cache answers exactly what Hydra would, and never when an input changed."""

from pathlib import Path

import pytest

from grpo_launch.cli import main
from grpo_launch.compose import cache, compose, recipes

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "recipes" / "recipe").glob("*.yaml"))


def entries() -> list[Path]:
    return sorted(cache.cache_dir().glob("*.json"))


@pytest.mark.parametrize("recipe", SHIPPED)
def test_a_cached_composition_equals_hydras(recipe, monkeypatch):
    overrides = [f"recipe={recipe}", "trainer.learning_rate=3e-6", "rewards=[{fn:accuracy,weight:2.0}]"]
    fresh = compose(overrides)          # composed by Hydra, then stored
    assert len(entries()) == 1
    monkeypatch.setattr("grpo_launch.compose._hydra_compose", None)  # a second Hydra composition would fail
    cached = compose(overrides)
    assert cached == fresh


def _user_recipe(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "mine"
    (d / "recipe").mkdir(parents=True, exist_ok=True)
    (d / "recipe" / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - override /placement: colocate\n"
                                            + body)
    return d


def test_editing_a_recipe_file_is_seen(tmp_path):
    d = _user_recipe(tmp_path, "trainer:\n  max_steps: 7\n")
    assert compose(["recipe=mine"], [d]).config.trainer["max_steps"] == 7
    d = _user_recipe(tmp_path, "trainer:\n  max_steps: 70\n")  # another size: another key
    assert compose(["recipe=mine"], [d]).config.trainer["max_steps"] == 70
    assert len(entries()) == 2


def test_other_overrides_are_other_entries():
    assert compose(["seed=1"]).config.seed == 1
    assert compose(["seed=2"]).config.seed == 2
    assert len(entries()) == 2


def test_a_recipe_with_an_interpolation_is_never_cached(tmp_path):
    d = _user_recipe(tmp_path, "description: seed ${seed}\n")  # (one that reads the environment is refused)
    assert cache.inputs(recipes.search_path([d])) is None
    assert compose(["recipe=mine"], [d]).config.description == "seed 42"
    assert entries() == []


def test_an_unreadable_entry_is_a_miss():
    first = compose(["seed=5"])
    (entry,) = entries()
    entry.write_text("{not json")
    assert compose(["seed=5"]) == first


def test_mistakes_are_found_after_a_cached_success(capsys):
    assert main(["plan", "--json", "trainer.learning_rate=1e-6"]) == 0
    assert main(["plan", "--json", "trainer.learnig_rate=1e-6"]) == 2
    assert "did you mean 'trainer.learning_rate'?" in capsys.readouterr().err


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("GRPO_COMPOSE_CACHE", "0")
    compose(["seed=3"])
    assert entries() == []
