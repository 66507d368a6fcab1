"""Recipe sections the trainer receives as they are: the data source and the LoRA adapter.

They are sections of the recipe schema (`compose.schema.Config.data`, `.lora`) and fields of the plan's
`TrainerInputs`, declared once here. Mutable dataclasses, because OmegaConf builds them as structured configs.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_launch.contracts.knobs import knob


@dataclass(kw_only=True)
class Data:
    source: str = knob("hub", "Where prompts come from.", choices=("hub", "files", "builtin"))
    path: str = knob(doc="Hub dataset id, a local file or glob (jsonl, parquet, csv), or a built-in task name.")
    config: str | None = knob(None, "Hub dataset configuration (subset) name.")
    split: str = knob("train", "Split to train on.")
    prompt_column: str = knob("prompt", "Column holding the prompt (text or chat messages).")
    answer_column: str | None = knob(None, "Column holding the reference answer; reward functions receive it "
                                           "as `solution` (TRL's accuracy reward reads that name).")
    system_prompt: str | None = knob(None, "System message placed before each prompt (makes prompts "
                                           "chat-formatted).", any_text=True)
    max_samples: int | None = knob(None, "Use only the first N rows.", ge=1)
    num_samples: int = knob(512, "Rows generated for a built-in task (at most 10,000,000).", ge=1, le=10_000_000)
    eval: str | None = knob(None, "Held-out prompts, scored with the recipe's reward functions every "
                                  "trainer.eval_steps and at the end (TRL's evaluation): 'held-out' (the data's last "
                                  "eval_samples rows, which training skips; a built-in task generates rows training "
                                  "never sees), a split of the hub dataset (source=hub, e.g. test), or a file or glob "
                                  "(source=files). null: no evaluation.")
    eval_samples: int | None = knob(None, "Evaluate on N held-out rows (held-out: 64 by default; a split or file: "
                                          "its first N, all by default).", ge=1, le=10_000_000)


@dataclass(kw_only=True)
class Lora:
    enabled: bool = knob(False, "Train a LoRA adapter (peft) instead of all weights.")
    r: int = knob(16, "LoRA rank.", ge=1)
    alpha: int = knob(32, "LoRA alpha.", ge=1)
    dropout: float = knob(0.05, "LoRA dropout.", ge=0.0, le=1.0)
    target_modules: list[str] = knob(factory=lambda: ["all-linear"],
                                     doc="Modules to adapt; ['all-linear'] adapts every linear layer but the "
                                         "output head.")
