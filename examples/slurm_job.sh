#!/bin/bash
# Slurm batch script: 2 nodes x 2 ranks. srun starts the ranks; collectives reads the
# step's own variables (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST): the
# store sits on the step's first node, at a port derived from the job and step ids, so
# steps running at once do not collide. `python` without srun here stops at once with
# an error saying to use srun.
#
#   sbatch examples/slurm_job.sh          (from the checkout, after the README's install)
#SBATCH --job-name=collectives-hello
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=00:05:00
set -euo pipefail
# One secret for the job, made here; srun passes the environment to every task.
COLLECTIVES_JOB_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))")
export COLLECTIVES_JOB_SECRET
srun python examples/hello_allreduce.py
# Or let collectives-run start the ranks (it uses srun for the other nodes):
#   collectives-run python examples/hello_allreduce.py
