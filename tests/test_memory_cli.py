"""`grpo plan` shows the memory tables, refuses a layout that does not fit, and stays free of heavy imports."""

import json
from pathlib import Path

import pytest
from conftest import grpo, plan_json

RECIPES = sorted(p.stem for p in (Path(__file__).parents[1] / "recipes" / "recipe").glob("*.yaml"))
WIDE = {"COLUMNS": "200"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_shipped_recipe_fits(recipe):
    memory = plan_json(f"recipe={recipe}")["memory"]
    assert memory["estimated"] and memory["fits"]


def test_qwen72b_colocate_shows_both_tables_and_fits():
    result = grpo("plan", "recipe=qwen72b-colocate", "--memory", env=WIDE)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "memory per GPU" in out and "host memory per node" in out
    assert "trainer + vLLM · 32 GPUs · node 0-3 · GPU 0-7" in out
    assert "fits: generation binds, headroom" in out
    assert "KV cache:" in out and "offloaded optimizer states" in out


def test_zero2_is_refused_with_numbers_and_suggestions():
    result = grpo("plan", "recipe=qwen72b-colocate", "zero=2", env=WIDE)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stdout == ""
    err = result.stderr
    assert "qwen72b-colocate does not fit in memory" in err
    assert "trainer + vLLM (32 GPUs), generation: 210.7 GiB of 80 GiB (weights 135.4" in err
    assert "layouts that fit (dropping zero=2), best first: zero.stage=3" in err
    assert "--force" in err


def test_force_plans_it_anyway():
    result = grpo("plan", "recipe=qwen72b-colocate", "zero=2", "--force", env=WIDE)
    assert result.returncode == 0, result.stderr
    assert "DOES NOT FIT" in result.stdout and "does not fit" in result.stdout


def test_suggest_prints_three_layouts_with_overrides():
    result = grpo("plan", "recipe=qwen72b-colocate", "--suggest", env=WIDE)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "suggestions" in out and "predicted completions per hour per GPU held" in out
    assert all(f"  {i}. " in out for i in (1, 2, 3))
    assert "32 trainer GPUs · colocate · ZeRO-3" in out


def test_suggest_on_a_misfit_shows_the_tables_then_refuses():
    result = grpo("plan", "recipe=qwen72b-colocate", "zero=2", "--suggest", env=WIDE)
    assert result.returncode == 2
    assert "changing zero=2: nothing fits with it" in result.stdout and "DOES NOT FIT" in result.stdout
    assert "does not fit in memory" in result.stderr


def test_json_has_a_memory_section_and_suggestions():
    result = grpo("plan", "recipe=qwen72b-colocate", "--json", "--suggest")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    memory = data["memory"]
    assert memory["fits"] and memory["parameters"] == 72_706_203_648
    (gpu,) = memory["gpus"]
    assert gpu["binding_phase"] == "generation" and len(gpu["members"]) == 32
    assert gpu["kv_cache"]["max_model_len"] == 4096
    assert [p["name"] for p in memory["hosts"][0]["phases"]] == ["load", "training"]
    assert len(data["suggestions"]) == 3 and all(s["summary"] for s in data["suggestions"])




def test_parameter_counts_take_a_unit_that_fits(capsys):
    from grpo_launch.cli import main
    from grpo_launch.contracts.memory import parameter_count

    assert [parameter_count(n) for n in (72_706_203_648, 1_543_714_304, 494_032_768, 8_400_000, 131_072)] == \
        ["72.7B", "1.54B", "494M", "8.4M", "0.13M"]
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "builtin:tiny (built-in): 0.13M parameters" in out and "0.00B" not in out
