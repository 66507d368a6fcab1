"""Files generated from a source of truth stay current: TRL's field list and the recipe reference."""

import json
from pathlib import Path

from grpo_launch.compose import trl_checks
from grpo_launch.contracts import trl_fields
from grpo_launch.plan import reference

ROOT = Path(__file__).resolve().parents[1]


def test_trl_field_list_matches_installed_trl():
    """`grpo plan` checks trainer.* against trl_fields.json without importing TRL; it must be TRL's truth."""
    import trl

    generated = trl_fields.generate()
    assert generated["trl_version"] == trl.__version__
    assert json.loads(trl_fields.FIELDS_FILE.read_text()) == json.loads(json.dumps(generated)), (
        "regenerate with: python -m grpo_launch.contracts.trl_fields --write")


def test_removed_fields_are_really_gone():
    for name in trl_checks.REMOVED_FIELDS:
        assert name not in trl_fields.fields_of("GRPOConfig")


def test_recipe_reference_is_current():
    assert (ROOT / "docs" / "recipe-reference.md").read_text() == reference.reference_markdown(), (
        "regenerate with: python -m grpo_launch.plan.reference > docs/recipe-reference.md")
