"""Secrets go by name, never by value: every value of a recipe is written to the run directory (config.yaml,
plan.json, launch.sh, the job files) and to the composition cache, so a value that is, or looks like, a secret is
refused at plan time, before anything is written.

What is checked:
- every value of the recipe (any key, `trainer.*` and lists included): the forms of well-known tokens (Hugging Face
  `hf_...`, OpenAI and Anthropic `sk-...`, GitHub `ghp_...`/`github_pat_...`, GitLab `glpat-...`, Slack `xox?-...`,
  AWS access key ids `AKIA...`, PEM private keys);
- `env.set`, whose values become environment variables, where a secret is most often put: names that look like a
  secret (TOKEN, SECRET, PASSWORD, API_KEY, KEY), and values holding a long random string: 32 or more characters
  without a break (letters and digits, both, and + = _ -, as hex, base64url and most keys spell them; a path's
  "/" breaks it) whose characters spread like a random string's rather than a word's. A variable refused there can
  always be passed by name: `env.passthrough`.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.knobs import texts
from grpo_launch.contracts.secrets import REDACTED
from grpo_launch.errors import UserError

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|(^|_)KEY($|_)", re.IGNORECASE)
TOKEN_FORMS = (
    ("a Hugging Face token", re.compile(r"hf_[A-Za-z0-9]{30,}")),
    ("an OpenAI or Anthropic API key", re.compile(r"sk-[A-Za-z0-9_-]{20,}")),
    ("a GitHub token", re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}")),
    ("a GitLab token", re.compile(r"glpat-[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"xox[abposr]-[A-Za-z0-9-]{10,}")),
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)
RANDOM_RUN = re.compile(r"[A-Za-z0-9+=_-]{32,}")  # not "/": a path is not a key
RANDOM_BITS_PER_CHAR = 3.5  # a word's letters repeat; 32 random hex digits spread over about 3.7-4 bits, base64 more
PASSTHROUGH_HINT = ("export it in your shell and add its name to env.passthrough: the processes then read it from your "
                    "environment, and it is never written")


def _entropy(text: str) -> float:
    return -sum(n / len(text) * math.log2(n / len(text)) for n in Counter(text).values())


def _random(run: str) -> bool:
    return (any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
            and _entropy(run) >= RANDOM_BITS_PER_CHAR)


def token_form(text: str) -> str | None:
    """What kind of well-known token `text` holds, or None."""
    return next((what for what, form in TOKEN_FORMS if form.search(text)), None)


def check_secrets(config: Config) -> None:
    for name in config.env.set:
        if SECRET_NAME.search(name):
            raise UserError(f"env.set.{name}={REDACTED} looks like a secret by its name; values in env.set are "
                            f"written to the run directory", key=f"env.set.{name}",
                            hint=f"remove it from env.set and add '{name}' to env.passthrough: its value is then "
                                 f"read from your shell by name and never written")
    for path, text in texts(config):
        what = token_form(text)
        if what is None and path.startswith("env.set.") and any(map(_random, RANDOM_RUN.findall(text))):
            what = "a key (a long random string)"
        if what is not None:
            # The value is not repeated: the message says `key=***`, and where it was set.
            raise UserError(f"{path}={REDACTED} holds what looks like {what}; every value of a recipe is written to "
                            f"the run directory (config.yaml, plan.json, launch.sh)", key=path, hint=PASSTHROUGH_HINT)
