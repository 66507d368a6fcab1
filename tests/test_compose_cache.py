"""The composition cache answers exactly what Hydra would, and never when an input changed."""

import os
from pathlib import Path

import pytest

import grpo_launch.compose
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
    assert compose(["recipe=mine"], [d]).config.description == "seed 42"
    assert entries() == []
    assert compose(["recipe=mine", "seed=7"], [d]).config.description == "seed 7"


def test_a_clock_interpolation_is_composed_every_time(monkeypatch):
    composed = []
    real = grpo_launch.compose._hydra_compose
    monkeypatch.setattr("grpo_launch.compose._hydra_compose", lambda *a: composed.append(a) or real(*a))
    for _ in range(2):
        assert compose(["description=${now:%Y}"]).config.description.isdigit()
    assert len(composed) == 2 and entries() == []


def test_a_symlinked_group_folder_is_read_through(tmp_path):
    elsewhere = tmp_path / "elsewhere" / "cluster"
    elsewhere.mkdir(parents=True)
    (elsewhere / "mine.yaml").write_text("accelerator: cpu\ngpus_per_node: 1\n")
    d = tmp_path / "linked"
    d.mkdir()
    (d / "cluster").symlink_to(elsewhere, target_is_directory=True)
    assert compose(["cluster=mine"], [d]).config.cluster.gpus_per_node == 1
    (elsewhere / "mine.yaml").write_text("accelerator: cpu\ngpus_per_node: 3\n")
    assert compose(["cluster=mine"], [d]).config.cluster.gpus_per_node == 3


def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path):
    """What `cp -p`, `rsync -a` and `tar x` do: new content, the old size and modification time."""
    d = _user_recipe(tmp_path, "trainer:\n  max_steps: 7\n")
    path = d / "recipe" / "mine.yaml"
    assert compose(["recipe=mine"], [d]).config.trainer["max_steps"] == 7
    stat = path.stat()
    path.write_text(path.read_text().replace("max_steps: 7", "max_steps: 8"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert compose(["recipe=mine"], [d]).config.trainer["max_steps"] == 8


def test_an_undecodable_unrelated_recipe_file_does_not_stop_planning(tmp_path, capsys):
    d = _user_recipe(tmp_path, "rewards:\n  - fn: sevens\ntrainer:\n  max_completion_length: 8\n")
    (d / "recipe" / "binary.yaml").write_bytes(b"\xff\xfe\x00 not text")
    assert main(["plan", "--json", "--recipes-dir", str(d)]) == 0
    assert main(["plan", "--json", "recipe=mine", "--recipes-dir", str(d)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_the_library_versions_are_part_of_the_key(monkeypatch):
    import hydra
    import omegaconf

    assert cache._version("hydra") == hydra.__version__
    assert cache._version("omegaconf") == omegaconf.__version__
    dirs = recipes.search_path()
    before = cache.inputs(dirs)
    monkeypatch.setattr(cache, "_version", lambda package: "0.0-other")
    assert cache.inputs(dirs) != before


def test_the_least_recently_used_entries_are_evicted(monkeypatch):
    monkeypatch.setattr(cache, "MAX_ENTRIES", 3)
    read = cache.inputs(recipes.search_path())
    path = {seed: cache.cache_dir() / f"{cache.key(read, [f'seed={seed}'])}.json" for seed in range(1, 6)}
    for seed in (1, 2, 3):
        compose([f"seed={seed}"])
    for age, seed in enumerate((1, 2, 3)):  # stored in this order, a second apart
        os.utime(path[seed], (1_000_000 + age, 1_000_000 + age))
    assert compose(["seed=1"]).config.seed == 1  # a hit: seed=1 is now the most recently used
    compose(["seed=4"])
    assert sorted(entries()) == sorted([path[1], path[3], path[4]])


def test_a_sweep_leaves_at_most_the_bound(monkeypatch):
    monkeypatch.setattr(cache, "MAX_ENTRIES", 4)
    assert main(["plan", "-m", "--json", "seed=range(0,10)"]) == 0
    assert len(entries()) == 4


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
