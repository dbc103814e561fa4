#!/usr/bin/env bash
# Run a crackseg command as one process per GPU (or per CPU slot) through torchrun.
#
#   CUDA_VISIBLE_DEVICES=0,1 ./launch.sh train --data data/demo --run checkpoints/demo
#   ./launch.sh --nproc 2 train ...                  # CPU: two gloo processes
#   ./launch.sh --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29400 train ...   # on each box
#
# Launcher options come before the command; everything after it goes to crackseg.
#   --nproc N            processes on this machine (default: GPUs in CUDA_VISIBLE_DEVICES,
#                        else GPUs that nvidia-smi lists, else 1)
#   --nnodes N           machines taking part (default 1: single box, --standalone)
#   --node-rank R        this machine's rank, 0..N-1 (several boxes only)
#   --rdzv-endpoint H:P  rendezvous host and port, the same on every box (several boxes only)
#   --rdzv-id ID         job id shared by the boxes (default crackseg)
#   --max-restarts N     restarts of all workers after a failure; training resumes from
#                        its last checkpoint (default 3 for train, 0 for other commands)
# PYTHON selects the interpreter (default: .venv/bin/python beside this script, else python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-}
if [[ -z $python ]]; then
  if [[ -x $here/.venv/bin/python ]]; then python=$here/.venv/bin/python; else python=python3; fi
fi

nproc="" nnodes=1 node_rank=0 endpoint="" rdzv_id=crackseg max_restarts=""
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
need() { [[ $# -ge 2 && -n $2 ]] || { echo "launch.sh: error: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --nproc) need "$@"; nproc=$2; shift 2 ;;
    --nnodes) need "$@"; nnodes=$2; shift 2 ;;
    --node-rank) need "$@"; node_rank=$2; shift 2 ;;
    --rdzv-endpoint) need "$@"; endpoint=$2; shift 2 ;;
    --rdzv-id) need "$@"; rdzv_id=$2; shift 2 ;;
    --max-restarts) need "$@"; max_restarts=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --*) echo "launch.sh: error: unknown launcher option $1 (launcher options go before the command)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { usage; exit 2; }
whole() {  # FLAG VALUE LEAST: a whole number of at least LEAST, or one line and exit status 2
  [[ $2 =~ ^[0-9]+$ ]] && (( 10#$2 >= $3 )) || { echo "launch.sh: error: $1 must be a whole number of at least $3, got '$2'" >&2; exit 2; }
}
whole --nnodes "$nnodes" 1
whole --node-rank "$node_rank" 0
(( 10#$node_rank < 10#$nnodes )) || { echo "launch.sh: error: --node-rank $node_rank must be below --nnodes $nnodes" >&2; exit 2; }
[[ -z $nproc ]] || whole --nproc "$nproc" 1
[[ -z $max_restarts ]] || whole --max-restarts "$max_restarts" 0
if [[ -z $max_restarts ]]; then
  if [[ $1 == train ]]; then max_restarts=3; else max_restarts=0; fi
fi

if [[ -z $nproc ]]; then
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -ra gpus <<<"$CUDA_VISIBLE_DEVICES"; nproc=${#gpus[@]}
  elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    nproc=$(nvidia-smi -L | grep -c '^GPU')
  else
    nproc=1
  fi
fi

if [[ $nnodes -gt 1 ]]; then
  [[ -n $endpoint ]] || { echo "launch.sh: error: --nnodes $nnodes needs --rdzv-endpoint HOST:PORT" >&2; exit 2; }
  rendezvous=(--nnodes "$nnodes" --node-rank "$node_rank" --rdzv-backend c10d --rdzv-endpoint "$endpoint" --rdzv-id "$rdzv_id")
else
  rendezvous=(--standalone)
fi

# Each rendezvous round gets a fresh store for the workers, hosted by the new rank 0 on a new
# port. Sharing the agents' store across rounds made restarted ranks read the killed ranks'
# addresses, and on several machines the agents' restart counts can differ (a node whose
# worker did not fail counts no restart), so no key prefix can tell the rounds apart there.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

# "--" keeps torchrun's parser off crackseg's options: without it torchrun reads --run as an
# ambiguous abbreviation of its --run-path, and --monitor as its --monitor-interval.
# One intra-op thread per process when there are several, as torchrun would set it, without its banner.
if [[ $nproc -gt 1 ]]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi

# crackseg.cli.launch runs torchrun so that a user mistake ends as its one line and exit status 2, not as
# torchrun's restarts and traceback.
exec "$python" -m crackseg.cli.launch "${rendezvous[@]}" --nproc-per-node "$nproc" \
  --max-restarts "$max_restarts" -m crackseg -- "$@"
