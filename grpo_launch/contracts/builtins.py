"""The built-in parts a recipe can name, and where each lives: a registry that is plain data.

The planner checks names against it without importing anything; the trainer imports the targets.
"""

# reward name -> "module:function"; the trainer imports the function.
REWARDS = {
    "accuracy": "trl.rewards:accuracy_reward",            # math-verify against the `solution` column
    "think_format": "trl.rewards:think_format_reward",    # <think>...</think> then an answer
    "length_penalty": "grpo_launch.trainer.rewards:length_penalty",
    "sevens": "grpo_launch.trainer.rewards:sevens",       # the tiny task's reward
}

# built-in dataset name -> "module:function" building its rows offline.
TASKS = {"sevens": "grpo_launch.trainer.tasks:sevens"}
# data.eval=held-out: the data's last rows, which training skips (a built-in task: rows of its generator that
# training never sees); HELD_OUT_ROWS of them unless data.eval_samples says.
HELD_OUT = "held-out"
HELD_OUT_ROWS = 64

# built-in model name (model.name_or_path=builtin:NAME) -> the module whose `python -m` writes it to a directory.
MODELS = {"tiny": "grpo_launch.trainer.tiny_model"}
BUILTIN_MODEL_PREFIX = "builtin:"
BUILTIN_MODEL_DIR = "model"  # built-in models are made inside the run directory, so a run is self-contained


def names_a_path(model: str) -> bool:
    """Whether `model.name_or_path` is a local directory by its spelling (a hub id, org/name, is not)."""
    return model.startswith(("/", "./", "../", "~"))
