"""`grpo`, the real CLI, with scheduler=hf-jobs's bucket transfers (`bucket_transfer`, which speaks Xet) replaced by
copies into the stand-in's bucket directory, GRPO_STANDIN_ROOT (tests/hf_jobs_standin.py). Nothing else differs.

    python tests/hf_jobs_cli.py run recipe=tiny-cpu-async-lora scheduler=hf-jobs ...
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hf_jobs_standin import copy_transfer  # noqa: E402

from grpo_launch.cli import entrypoint  # noqa: E402
from grpo_launch.launch.schedulers import hf_jobs  # noqa: E402

hf_jobs.bucket_transfer = copy_transfer(Path(os.environ["GRPO_STANDIN_ROOT"]))
entrypoint()
