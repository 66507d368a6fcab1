"""The `grpo` typer app, its own options (`--version`) and the options its subcommands share."""

from __future__ import annotations

import typer

from grpo_launch.launch.result import GRACE_S

# What `grpo --version` reports beside grpo-launch: the distributions a run depends on, by their package names.
STACK = (("TRL", "trl"), ("vLLM", "vllm"), ("DeepSpeed", "deepspeed"), ("torch", "torch"))

app = typer.Typer(
    name="grpo",
    help="Launch GRPO training (TRL + vLLM + DeepSpeed/accelerate) from one declarative recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

MAX_GRACE_S = 600.0


def _grace(seconds: float) -> float:
    if not 0 <= seconds <= MAX_GRACE_S:  # nan fails this too
        raise typer.BadParameter(f"{seconds:g} is not a number of seconds from 0 to {MAX_GRACE_S:g}")
    return seconds


GraceOption = typer.Option(GRACE_S, "--grace", metavar="S", callback=_grace, help="Seconds between SIGTERM and SIGKILL "
                                                                               "when stopping (0 to 600).")
OverridesArgument = typer.Argument(
    None, metavar="[recipe=NAME | RECIPE.yaml] [KEY=VALUE]...",
    help="Hydra overrides: recipe=NAME (or the path of a recipe file), a group option (placement=server, "
         "zero=3-offload, cluster=...), or any key (vllm.tensor_parallel_size=4, trainer.learning_rate=1e-6).")
# Closes the examples of every command that writes a run directory.
QUOTING_NOTE = ("Every value is quoted wherever a generated file or a printed command holds it, except scheduler.setup "
                "(shell\ncommands) and scheduler.slurm.sbatch (sbatch options), which run as written. Pass secrets by "
                "name: env.passthrough.\n")
RecipesDirOption = typer.Option(
    None, "--recipes-dir", metavar="DIR",
    help="Add a directory of recipes (its recipe/, cluster/, model/, ... folders) ahead of the shipped ones; "
         "repeatable. $GRPO_RECIPES_PATH adds more.")


def recipe_arguments(overrides: list[str], recipes_dir: list[str]) -> tuple[list[str], list[str]]:
    """The overrides and recipe directories with a recipe file's path (`grpo plan ./my-recipe.yaml`, as TRL's
    `--config FILE`) turned into `recipe=NAME` and the directory that holds it, ahead of the others."""
    from grpo_launch.compose import cache, recipes
    from grpo_launch.errors import UserError

    files = [o for o in overrides if recipes.names_recipe_file(o)]
    if not files:
        return overrides, recipes_dir
    if len(files) > 1:
        raise UserError(f"two recipe files ({files[0]}, {files[1]}): a plan composes one recipe", key="recipe",
                        hint="give one recipe file, and set keys with KEY=VALUE")
    name, directory = recipes.recipe_file(files[0], cache.cache_dir() / "recipe-files")
    return [f"recipe={name}" if o == files[0] else o for o in overrides], [str(directory), *recipes_dir]


def versions() -> list[tuple[str, str | None]]:
    """grpo-launch's version and those of the stack it finds installed (None: not installed), read from the
    installed metadata: nothing is imported, so `grpo --version` stays instant on a GPU node too."""
    from importlib.metadata import PackageNotFoundError, version

    found: list[tuple[str, str | None]] = []
    for label, name in (("grpo-launch", "grpo-launch"), *STACK):
        try:
            found.append((label, version(name)))
        except PackageNotFoundError:
            found.append((label, None))
    return found


def _print_version(wanted: bool) -> None:
    if not wanted:
        return
    for label, found in versions():
        typer.echo(f"{label} {found or 'not installed'}")
    raise typer.Exit()


@app.callback()
def options(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print grpo-launch's version and those of TRL, vLLM, DeepSpeed and torch found "
                                      "installed, and exit."),
) -> None:
    """The options of `grpo` itself; each subcommand has its own."""
