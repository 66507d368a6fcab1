"""Built-in datasets, generated offline (data.source=builtin)."""

from __future__ import annotations

import random
from typing import Any


def sevens(num_samples: int, seed: int) -> list[dict[str, Any]]:
    """Prompts are short sums ("12+7="); the `sevens` reward pays for '7's, so learning shows within ~20 steps."""
    rng = random.Random(seed)
    return [{"prompt": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="} for _ in range(num_samples)]
