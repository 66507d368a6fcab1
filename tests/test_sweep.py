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
    monkeypatch.setenv("COLUMNS", "220")


def sweep_json(capsys, *args) -> list[dict]:
    assert main(["plan", "-m", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_issue_example_prints_a_row_per_combination(wide, capsys):
    assert main(["plan", "-m", *EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "12 combinations of recipe, vllm.tensor_parallel_size, zero · 12 planned, 12 fit, 0 refused" in out
    rows = [line for line in out.splitlines() if line.startswith(("qwen7b-server ", "qwen7b-colocate "))]
    assert len(rows) == 12 and sum("★" in r for r in rows) == 1
    assert rows[0].split()[:6] == ["qwen7b-server", "1", "2", "7", "1", "vLLM"]  # the first value varies slowest
    best = next(r for r in rows if "★" in r)
    assert best.split()[:3] == ["qwen7b-colocate", "2", "2"]  # 8 GPUs training, ZeRO-2, TP 2 for a 7B model


def test_refused_layouts_stay_in_the_table_with_their_reason(wide, capsys):
    assert main(["plan", "-m", "recipe=qwen7b-server,qwen7b-colocate", "vllm.tensor_parallel_size=4,8"]) == 0
    out = capsys.readouterr().out
    assert "4 combinations of recipe, vllm.tensor_parallel_size · 2 planned, 2 fit, 2 refused" in out
    refused = {line.split()[0]: line for line in out.splitlines() if "refused" in line and line.startswith("qwen7b-")}
    assert "no GPU is left for the trainer" in refused["qwen7b-server"]
    assert "does not split Qwen/Qwen2.5-Math-7B's 28" in refused["qwen7b-colocate"]  # vLLM's own rule, at plan time


def test_json_lists_plans_and_errors_in_table_order(capsys):
    entries = sweep_json(capsys, "recipe=qwen7b-server,qwen7b-colocate", "vllm.tensor_parallel_size=4,8")
    assert [e["values"] for e in entries] == [
        {"recipe": r, "vllm.tensor_parallel_size": tp} for r in ("qwen7b-server", "qwen7b-colocate")
        for tp in ("4", "8")]
    assert "no GPU is left" in entries[1]["error"]["message"] and "plan" not in entries[1]
    assert "does not split" in entries[3]["error"]["message"]
    assert [e.get("throughput_rank") for e in entries] == [2, None, 1, None] and [e.get("best") for e in entries] == \
        [False, None, True, None]
    assert entries[2]["throughput_proxy"]["fewer_trainer_gpus"] == -8


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
    assert [e["values"]["vllm.tensor_parallel_size"] for e in entries] == ["1"] * 4 + ["2"] * 4 + ["4"] * 4
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
