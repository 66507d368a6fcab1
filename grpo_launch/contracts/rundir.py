"""Names inside a run directory, shared by the stages that write and read it."""

CONFIG_FILE = "config.yaml"        # the composed config, every key
OVERRIDES_FILE = "overrides.yaml"  # recipe, command-line overrides, recipe directories (what --resume re-composes)
PLAN_FILE = "plan.json"            # the plan: what the supervisor and the trainer entrypoint read
LOGS_DIR = "logs"                  # one log per process
REWARDS_DIR = "rewards"            # reward functions given as files, copied so the run is self-contained
METRICS_FILE = "metrics.jsonl"     # the trainer appends one JSON record per logged step
CURVES_FILE = "reward_curve.png"   # reward, loss, KL and completion length against step
TIMELINE_FILE = "phase_timeline.png"  # what each trainer rank and vLLM engine did over time (grpo report)
EVAL_FILE = "eval_curve.png"       # the held-out reward against step (data.eval)
DEEPSPEED_FILE = "deepspeed.json"  # DeepSpeed's config, when ZeRO is on
ACCELERATE_FILE = "accelerate.yaml"  # accelerate's config file
LAUNCH_FILE = "launch.sh"          # replays every process by hand, without grpo-launch
SLURM_JOB_FILE = "job.sbatch"      # scheduler=slurm: the batch job
SKYPILOT_TASK_FILE = "task.yaml"   # scheduler=skypilot: the SkyPilot task
HF_JOBS_FILE = "hf-jobs.sh"        # scheduler=hf-jobs: the Jobs, submitted by hand with `hf jobs run`
WHEELS_DIR = "dist"                # scheduler=hf-jobs: the wheel of grpo-launch a Job installs at its start
SUBMITTED_FILE = "submitted.json"  # what `grpo run` started (its job IDs, its pid): what `grpo stop` ends
JOB_LOG = "job.log"                # under logs/: the batch script's own output
NODE_FAILURES = "node-{node}.failure.json"  # under logs/: a node's first failure (contracts.failures.NodeFailure)
PREPARE_LOCK = ".prepare.lock"    # nodes sharing a run directory take turns at the prepare steps
WEIGHT_SYNC_DIR = "weight-sync"   # weights the trainer writes for vLLM to reload (CPU runs), rewritten every step
TRAINER_FAILURE = "trainer-rank{rank}.failure.json"  # under logs/: a trainer rank's exception, phase and step
WATCHDOG_LOG = "watchdog.log"      # under logs/: what the watchdog did when the supervisor died without stopping
CHECKPOINTS_DIR = "checkpoints"   # the trainer's output_dir unless trainer.output_dir says otherwise
FINAL_MODEL_DIR = "final"         # under the output_dir: the trained model (or adapter) once training ends
TIMELINE_SEGMENTS = "trainer-rank{rank}.timeline.jsonl"  # under logs/: what a trainer rank did when, a line a step
