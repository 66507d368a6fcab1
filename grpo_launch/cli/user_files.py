"""The checks that read the user's files (reward files and modules, a files dataset, a local model directory), for
the subcommands: `grpo run`, `--dry-run` and `grpo rehearse` run them before anything is written; `grpo plan`, which
reads no file of the user's, names them as left to `grpo run`. The checks themselves are `launch.preflight`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_launch.compose import Composed
    from grpo_launch.launch.preflight import FileCheck
    from grpo_launch.plan import Plan


def file_checks(composed: Composed, plan: Plan) -> list[FileCheck]:
    from grpo_launch.launch.preflight import file_checks as checks
    from grpo_launch.plan.checks import prompt_room
    from grpo_launch.plan.model import resolve_model

    context = resolve_model(composed.config).context
    return checks(plan, prompt_room(composed.config, plan.trainer_class, context))


def check_user_files(composed: Composed, plan: Plan) -> None:
    """Every check of a file of the user's; an error says where the key's value came from."""
    from grpo_launch.errors import UserError

    for check in file_checks(composed, plan):
        try:
            check.run()
        except UserError as e:
            raise composed.origins.locate(e, composed.config) from None
