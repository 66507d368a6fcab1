"""The `grpo` typer app and the options its subcommands share."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="grpo",
    help="Launch GRPO training (TRL + vLLM + DeepSpeed/accelerate) from one declarative recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

RecipesDirOption = typer.Option(
    None, "--recipes-dir", metavar="DIR",
    help="Add a directory of recipes (its recipe/, cluster/, model/, ... folders) ahead of the shipped ones; "
         "repeatable. $GRPO_RECIPES_PATH adds more.")
