"""`grpo recipes`: list, show and copy recipes."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_launch.cli.app import RecipesDirOption, app, recipe_arguments

recipes_app = typer.Typer(
    help="List recipes, show one composed, or copy one to edit.",
    invoke_without_command=True,
    rich_markup_mode="rich",
    epilog="""
[bold]Examples[/]

  grpo recipes                                     every recipe with its one-line description
  grpo recipes show qwen72b-colocate               the composed YAML, every default filled in
  grpo recipes show qwen7b-server zero=3 vllm.tensor_parallel_size=4
  grpo recipes show my-7b --recipes-dir ./recipes  a recipe of another directory
  grpo recipes show ./my-recipe.yaml               a recipe file by its path
  grpo recipes new my-7b --from qwen7b-server      copy it to ~/.config/grpo-launch/recipes to edit
""",
)
app.add_typer(recipes_app, name="recipes")


@recipes_app.callback()
def recipes_list(ctx: typer.Context, recipes_dir: list[str] | None = RecipesDirOption) -> None:
    """List the recipes on the search path (user recipes shadow shipped ones of the same name)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = recipes_dir or []
        return
    from rich.table import Table
    from rich.text import Text

    from grpo_launch.cli.console import console
    from grpo_launch.compose import recipes

    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.add_column("recipe", style="cyan", no_wrap=True)
    table.add_column("description")
    table.add_column("from", style="dim")
    for info in recipes.list_recipes(recipes.search_path(recipes_dir or [])):
        table.add_row(*map(Text, (info.name, info.description, "shipped" if info.shipped else
                                  str(info.path.parent.parent))))
    console().print(table)


@recipes_app.command("show", epilog="[bold]Example[/]\n\n  grpo recipes show qwen72b-colocate zero=3")
def recipes_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Recipe name (recipe=NAME too), or the path of a recipe file."),
    overrides: list[str] | None = typer.Argument(None, metavar="[KEY=VALUE]...",
                                                    help="Hydra overrides applied on top."),
    recipes_dir: list[str] | None = RecipesDirOption,
) -> None:
    """Print a recipe's composed YAML: groups merged, overrides applied, every key's value."""
    import dataclasses

    import yaml

    from grpo_launch.compose import compose, recipes

    recipe = name if recipes.names_recipe_file(name) else f"recipe={name.removeprefix('recipe=')}"
    overrides, dirs = recipe_arguments([recipe, *(overrides or [])], [*(recipes_dir or []), *(ctx.obj or [])])
    composed = compose(overrides, dirs)
    full = dataclasses.asdict(composed.config)
    typer.echo(f"# recipe {composed.recipe}: " + ", ".join(f"{g}={o}" for g, o in composed.choices.items()
                                                            if g != "recipe"))
    typer.echo(yaml.safe_dump(full, sort_keys=False, default_flow_style=False, width=100).rstrip())


@recipes_app.command("new", epilog="[bold]Example[/]\n\n  grpo recipes new my-72b --from qwen72b-colocate\n"
                                    "  grpo plan recipe=my-72b")
def recipes_new(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Name of the new recipe."),
    source: str = typer.Option(..., "--from", help="Recipe to copy."),
    to: Path | None = typer.Option(None, "--to", help="Recipes directory to write into; default: the user "
                                                       "directory (~/.config/grpo-launch/recipes)."),
    force: bool = typer.Option(False, "--force", help="Write it even when a recipe of that name exists on the search "
                                                      "path (a shipped one too), which the copy then shadows or is "
                                                      "shadowed by."),
    recipes_dir: list[str] | None = RecipesDirOption,
) -> None:
    """Copy a recipe into a user directory to edit (like `tune cp`), found by its new name. A name that a recipe on
    the search path has already (a shipped one too) is refused without --force: the copy would shadow that recipe,
    or be shadowed by it."""
    from grpo_launch.compose import recipes

    dest_root = to or recipes.user_dir()
    dirs = recipes.search_path([*(recipes_dir or []), *(ctx.obj or [])])
    dest, shadowing = recipes.copy_recipe(dirs, source.removeprefix("recipe="), name, dest_root, force=force)
    typer.echo(f"wrote {dest}")
    if shadowing:
        typer.echo(f"note: {shadowing}")
    if to is not None:
        typer.echo(f"use it with: grpo plan recipe={name} --recipes-dir {to}")
    else:
        typer.echo(f"use it with: grpo plan recipe={name}")
