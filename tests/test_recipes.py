"""The recipe search path, user recipes, `grpo recipes` and the shipped wheel."""

import subprocess
import sys
import zipfile
from pathlib import Path

import yaml
from conftest import grpo, plan_json

from grpo_launch.cli import main
from grpo_launch.compose import recipes

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "recipes" / "recipe").glob("*.yaml"))


def _recipe_dir(tmp_path: Path, name: str, description: str) -> Path:
    d = tmp_path / "user"
    (d / "recipe").mkdir(parents=True)
    text = (ROOT / "recipes" / "recipe" / "tiny-cpu.yaml").read_text()
    text = text.replace("description: tiny random model", f"description: {description}")
    (d / "recipe" / f"{name}.yaml").write_text(text.replace("max_steps: 20", "max_steps: 7"))
    return d


def test_every_shipped_recipe_plans():
    assert len(SHIPPED) == 12
    for name in SHIPPED:
        assert plan_json(f"recipe={name}")["recipe"] == name


def test_recipes_lists_exactly_the_shipped_recipes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["recipes"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]  # below the header
    assert [row.split()[0] for row in rows] == SHIPPED


def test_default_recipe_is_tiny_cpu():
    assert plan_json()["recipe"] == "tiny-cpu"


def test_user_recipe_shadows_shipped_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    d = _recipe_dir(tmp_path, "tiny-cpu", "mine")
    assert main(["plan", "--json", "--recipes-dir", str(d)]) == 0
    assert '"max_steps": 7' in capsys.readouterr().out
    assert main(["recipes", "--recipes-dir", str(d)]) == 0
    listing = capsys.readouterr().out
    assert "mine" in listing and str(d) in listing


def test_recipes_path_variable(tmp_path, monkeypatch):
    d = _recipe_dir(tmp_path, "from-env", "found through the variable")
    monkeypatch.setenv("GRPO_RECIPES_PATH", str(d))
    assert plan_json("recipe=from-env")["trainer_args"]["max_steps"] == 7


def test_search_order(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    monkeypatch.setenv("GRPO_RECIPES_PATH", str(second))
    assert recipes.search_path([first])[:2] == [first.resolve(), second.resolve()]
    assert recipes.search_path([])[-1] == recipes.shipped_dir()


def test_recipes_new_then_plan(tmp_path, capsys):
    assert main(["recipes", "new", "my-7b", "--from", "qwen7b-server"]) == 0
    written = tmp_path / "xdg" / "grpo-launch" / "recipes" / "recipe" / "my-7b.yaml"
    assert f"wrote {written}" in capsys.readouterr().out
    assert written.read_text().startswith("# @package _global_\n# Copied from recipe 'qwen7b-server'")
    plan = plan_json("recipe=my-7b")
    assert plan["recipe"] == "my-7b" and plan["placement"] == "server"


def test_recipes_show_prints_every_key(capsys):
    assert main(["recipes", "show", "qwen72b-colocate", "vllm.gpu_memory_utilization=0.4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# recipe qwen72b-colocate: cluster=4x8-h100-80gb")
    doc = yaml.safe_load(out)
    assert doc["vllm"]["gpu_memory_utilization"] == 0.4
    assert doc["zero"] == {"stage": 3, "offload_optimizer": True, "offload_param": False,
                           "contiguous_gradients": True, "overlap_comm": True}
    assert doc["placement"]["async_lora"]["proxy"]["host"] == "127.0.0.1"  # defaults filled in


def test_help_has_worked_examples():
    for args in (["--help"], ["plan", "--help"], ["recipes", "--help"], ["recipes", "new", "--help"]):
        result = grpo(*args, env={"COLUMNS": "120"})
        assert result.returncode == 0, result.stderr
    assert "grpo plan recipe=qwen72b-colocate" in grpo("plan", "--help", env={"COLUMNS": "120"}).stdout
    assert "grpo recipes new my-7b --from qwen7b-server" in grpo("recipes", "--help", env={"COLUMNS": "120"}).stdout


def test_wheel_ships_the_recipes(tmp_path):
    """A non-editable install finds every recipe: build the wheel, install it alone, list recipes from it."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("grpo_launch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "grpo_launch/compose/primary/config.yaml" in names
    assert all(f"grpo_launch/recipes/recipe/{n}.yaml" in names for n in SHIPPED)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import grpo_launch.compose.recipes as r; "
            "print(r.shipped_dir()); print(len(r.list_recipes(r.search_path())))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")], capture_output=True, text=True,
                         cwd=tmp_path, check=True, timeout=60).stdout.split()
    assert out == [str(tmp_path / "site" / "grpo_launch" / "recipes"), str(len(SHIPPED))]


# What the colocate post's pairs may differ in besides their name and description: the placement and what it implies.
PAIR_DIFFERENCES = {
    "placement.kind": "the comparison itself",
    "vllm.gpu_memory_utilization": "each placement's default: vLLM beside a trainer rank, or on GPUs of its own",
    "cluster.nodes": "72B: the server's fifth node",
    "placement.colocate.sleep_level": "72B: sleep mode frees a colocated vLLM's memory for the trainer; a server needs "
                                      "none",
    "vllm.tensor_parallel_size": "72B: one colocated engine per node (TP 8), the server on the fifth node's 4 GPUs",
}


def test_the_colocate_posts_pairs_differ_only_in_their_placement():
    from grpo_launch.cli.run import config_changes
    from grpo_launch.compose import compose
    from grpo_launch.materialize import composed_config

    for size in ("1.5b", "7b", "72b"):
        colocate, server = (compose([f"recipe=qwen{size}-{kind}"]) for kind in ("colocate", "server"))
        old, new = composed_config(colocate).document(), composed_config(server).document()
        changed = {c.split(":")[0] for c in config_changes(old, new)}
        changed -= {"recipe", "description", "choices.recipe", "choices.placement", "choices.cluster"}
        assert changed <= set(PAIR_DIFFERENCES), (size, changed - set(PAIR_DIFFERENCES))
        assert colocate.config.trainer == server.config.trainer  # the same per-device batch, steps, everything
        batches = [plan_json(f"recipe=qwen{size}-{kind}")["batch"] for kind in ("colocate", "server")]
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"):
            assert batches[0][key] == batches[1][key], (size, key)
