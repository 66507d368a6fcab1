"""`grpo plan -m`: Hydra's sweep grammar, one row per combination, refused layouts kept with their reason."""

import json

import pytest
from conftest import plan_json

import grpo_launch.compose
from grpo_launch.cli import main
from grpo_launch.compose.sweep import compose_sweep

EXAMPLE = ["recipe=qwen7b-server,qwen7b-colocate", "vllm.tensor_parallel_size=1,2,4", "zero=2,3"]


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "260")


def sweep_json(capsys, *args) -> list[dict]:
    assert main(["plan", "-m", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_issue_example_prints_a_row_per_combination(wide, capsys):
    assert main(["plan", "-m", *EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "12 combinations of recipe, vllm.tensor_parallel_size, zero · 12 fit, 0 refused" in out
    rows = [line for line in out.splitlines() if line.startswith(("qwen7b-server ", "qwen7b-colocate "))]
    assert len(rows) == 12 and sum("★" in r for r in rows) == 1
    assert rows[0].split()[:6] == ["qwen7b-server", "1", "2", "7", "1", "vLLM"]  # the first value varies slowest
    best = next(r for r in rows if "★" in r)
    # 8 GPUs training, the largest TP (the colocate post: more TP sped its 7B model up); ZeRO-3 hides its gathers
    # behind compute and ties ZeRO-2 within 0.5%
    assert best.split()[:3] == ["qwen7b-colocate", "4", "3"]


def test_refused_layouts_stay_in_the_table_with_their_reason(wide, capsys):
    assert main(["plan", "-m", "recipe=qwen7b-server,qwen7b-colocate", "vllm.tensor_parallel_size=4,8"]) == 0
    out = capsys.readouterr().out
    assert "4 combinations of recipe, vllm.tensor_parallel_size · 2 fit, 2 refused" in out
    refused = {line.split()[0]: line for line in out.splitlines() if "refused" in line and line.startswith("qwen7b-")}
    assert "no GPU is left for the trainer" in refused["qwen7b-server"]
    assert "does not split Qwen/Qwen2.5-Math-7B's 28" in refused["qwen7b-colocate"]  # vLLM's own rule, at plan time


def test_json_lists_plans_and_errors_in_table_order(capsys):
    entries = sweep_json(capsys, "recipe=qwen7b-server,qwen7b-colocate", "vllm.tensor_parallel_size=4,8")
    assert [e["values"] for e in entries] == [
        {"recipe": r, "vllm.tensor_parallel_size": tp} for r in ("qwen7b-server", "qwen7b-colocate")
        for tp in (4, 8)]
    assert "no GPU is left" in entries[1]["error"]["message"] and "plan" not in entries[1]
    assert "does not split" in entries[3]["error"]["message"]
    assert [e.get("throughput_rank") for e in entries] == [2, None, 1, None] and [e.get("best") for e in entries] == \
        [False, None, True, None]
    assert entries[2]["samples_per_hour_per_gpu"] > entries[0]["samples_per_hour_per_gpu"] > 0
    assert entries[2]["step_s"] == entries[2]["plan"]["prediction"]["step_s"]


def test_each_row_is_the_plan_of_its_combination_alone(capsys):
    for entry in sweep_json(capsys, *EXAMPLE):
        assert entry["plan"] == plan_json(*entry["overrides"])


def test_range_choice_and_glob(capsys):
    entries = sweep_json(capsys, "seed=range(1,4)", "trainer.learning_rate=choice(0.01,0.02)", "zero=glob(3*)")
    assert len(entries) == 3 * 2 * 2
    assert {e["values"]["zero"] for e in entries} == {"3", "3-offload"}
    assert [e["plan"]["trainer_args"]["seed"] for e in entries[::4]] == [1, 2, 3]


def test_sort_by_a_column(capsys):
    entries = sweep_json(capsys, *EXAMPLE, "--sort", "throughput")
    assert [e["throughput_rank"] for e in entries] == list(range(1, 13))
    entries = sweep_json(capsys, *EXAMPLE, "--sort", "vllm.tensor_parallel_size")
    assert [e["values"]["vllm.tensor_parallel_size"] for e in entries] == [1] * 4 + [2] * 4 + [4] * 4
    assert main(["plan", "-m", *EXAMPLE, "--sort", "hedroom"]) == 2
    assert "--sort hedroom: not a column; did you mean 'headroom'?" in capsys.readouterr().err


def test_every_row_refused_is_an_error_after_the_table(capsys):
    assert main(["plan", "-m", "trainer.learnig_rate=1,2"]) == 2
    captured = capsys.readouterr()
    assert "2 combinations" in captured.out
    assert "none of the 2 combinations can be planned" in captured.err and "Traceback" not in captured.err


BAD_SWEEPS = [
    (["zero=2,9"], "unknown zero option '9'"),
    (["seed=interval(0,1)"], "interval() has no values to plan"),
    (["zero=glob(9*)"], "matches no zero option"),
    (["seed=1,2", "seed=3,4"], "seed is swept twice"),
    (["seed=1,2", "--dry-run"], "--dry-run shows one plan; -m compares many"),
    (["seed=1,2", "--suggest"], "--suggest shows one plan"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SWEEPS, ids=[" ".join(a) for a, _ in BAD_SWEEPS])
def test_a_bad_sweep_is_refused_before_planning(args, message, capsys):
    assert main(["plan", "-m", *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == "" and "Traceback" not in captured.err


def test_without_m_a_sweep_names_grpo_plan_m(capsys):
    assert main(["plan", "zero=2,3"]) == 2
    assert "sweeps (a,b, range(), choice()) are for `grpo plan -m`" in capsys.readouterr().err
    assert main(["plan", "--sort", "fits"]) == 2
    assert "--sort orders the rows of a sweep" in capsys.readouterr().err


def test_grpo_run_m_is_refused_naming_grpo_plan_m(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-m", "zero=2,3"]) == 2
    err = capsys.readouterr().err
    assert "grpo run starts one run at a time" in err and "grpo plan -m zero=2,3" in err
    assert list(tmp_path.iterdir()) == []


def test_hydra_composes_each_choice_of_groups_once(monkeypatch):
    monkeypatch.setenv("GRPO_COMPOSE_CACHE", "0")
    calls = []
    real = grpo_launch.compose._hydra_compose
    monkeypatch.setattr("grpo_launch.compose._hydra_compose", lambda dirs, groups: calls.append(groups) or
                        real(dirs, groups))
    sweep, composed = compose_sweep(EXAMPLE)
    assert len(sweep.combinations) == len(composed) == 12
    assert len(calls) == 4  # 2 recipes x 2 ZeRO options; the 3 TP values are keys


def test_the_72b_layouts_star_colocate(wide, capsys):
    assert main(["plan", "-m", "recipe=glob(qwen72b-*)"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("qwen72b-")}
    assert "★" in rows["qwen72b-colocate"] and "★" not in rows["qwen72b-server"]


@pytest.mark.parametrize("order", ["qwen1.5b-async-lora,qwen1.5b-async-lora-run1",
                                   "qwen1.5b-async-lora-run1,qwen1.5b-async-lora"])
def test_the_async_posts_run_5_is_starred_whatever_the_order(order, capsys):
    entries = sweep_json(capsys, f"recipe={order}")
    best = next(e for e in entries if e["best"])
    assert best["values"]["recipe"] == "qwen1.5b-async-lora"
    run1 = next(e for e in entries if not e["best"])
    assert run1["step_s"] > 3 * best["step_s"] and run1["gpu_hours"] > 3 * best["gpu_hours"]


def test_columns_for_the_prediction_and_a_cpu_sweep_says_it_predicts_nothing(wide, capsys):
    assert main(["plan", "-m", "recipe=qwen1.5b-colocate", "trainer.per_device_train_batch_size=8,16"]) == 0
    out = capsys.readouterr().out
    assert "step s" in out and "samples/h/GPU" in out and "GPU-h" in out
    assert main(["plan", "-m", "seed=1,2"]) == 0
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if line.startswith(("1 ", "2 ")) and "★" in line]
    assert "no step-time prediction for CPUs" in out
