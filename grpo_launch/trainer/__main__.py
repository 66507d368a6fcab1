"""`python -m grpo_launch.trainer --run-dir DIR`: what accelerate and torchrun start on every rank."""

from grpo_launch.trainer.main import main

main()
