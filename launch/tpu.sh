#!/usr/bin/env bash
# Run the rrc_jax trainer on a Cloud TPU slice with gcloud: create the slice, install the package on every worker,
# start / follow / stop training, and keep a spot or queued run alive through preemptions. `launch/README.md` is
# the guide; `launch/tpu.sh --help` and `launch/tpu.sh COMMAND --help` list the flags.
#
# Every gcloud call goes through `run` (shown on stderr as `+ gcloud ...`) or `query` (output captured, shown
# only in dry-run). With --dry-run both print the command on stdout, one per line with a `+ ` prefix, and run
# nothing; commands whose output steers the script (a resource's state, training status) are printed once and
# their result is a placeholder.
set -euo pipefail

PROG=${0##*/}
readonly PROG

# The helpers both launchers share (messages, run / show, flag parsing, main).
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Paths on the workers, relative to the ssh user's home (written as `$HOME/...` inside remote commands).
# REMOTE_DIR is the trainer's working directory: relative paths in its flags (assets/...) resolve there.
readonly REMOTE_DIR="\$HOME/rrc_jax"        # src/ (the source tree), venv/, dist/ (a wheel), assets/
readonly REMOTE_LOG="$REMOTE_DIR/train.log"   # the trainer's stdout + stderr on each worker
readonly REMOTE_STATUS="$REMOTE_DIR/train.status"  # the trainer's exit code, once it has exited
# Matches every `python -m rrc_jax.<module>` process (the trainer and its wrapper shell); the [r] keeps the
# pattern from matching the shell that runs pkill / pgrep, whose command line contains the pattern itself.
readonly TRAINER_PATTERN='python[0-9.]* -m [r]rc_jax\.'

# Flags (environment defaults where noted in usage).
NAME=${TPU_NAME:-}
ZONE=${ZONE:-}
PROJECT=${PROJECT:-}
ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-}
RUNTIME_VERSION=""
QUEUED=1
PROVISIONING=""  # "", spot, best-effort or preemptible
ASYNC=0
REPO=""
REF=""
WHEEL=""
COPY=0
ASSETS=""
PYTHON_VERSION=3.12
CONFIG=""
WORKDIR=""
DETACH=0
INTERVAL=60
GRACE=30
WORKER=""
FOLLOW=0
LINES=100
MAX_RESTARTS=10
DRY_RUN=0
TRAIN_OVERRIDES=()
MODEL=""
PORT=""
JUDGES=""
API_KEY_FILE=""

COMMAND=""
FOLLOWER_PID=""  # the background `tail` of worker 0's log (train)
RESTARTS=0       # watch's re-creations and restarts so far

usage() {
  case ${1:-} in
    create) cat <<'EOF'
usage: tpu.sh create --name NAME --zone ZONE --accelerator-type TYPE [flags]

Request a slice and wait until it is ACTIVE (Ctrl-C is safe: the request stays queued).
  --accelerator-type TYPE  e.g. v5p-64, v5litepod-64, v6e-64, v4-64 (env ACCELERATOR_TYPE)
  --runtime-version V      default by generation: v5p v2-alpha-tpuv5, v5litepod v2-alpha-tpuv5-lite,
                           v6e v2-alpha-tpuv6e, v4 tpu-ubuntu2204-base
  --spot                   spot capacity (preemptible at any time, far cheaper)
  --best-effort            queued resources only: the best-effort tier (gcloud alpha)
  --preemptible            --no-queue only: a preemptible TPU VM
  --no-queue               a plain TPU VM (gcloud compute tpus tpu-vm create) instead of a queued resource
  --async                  return once the request is accepted
  --interval SECONDS       between state checks while waiting (default 60)
EOF
    ;;
    setup) cat <<'EOF'
usage: tpu.sh setup --name NAME --zone ZONE [--repo URL [--ref REF] | --wheel gs://... | --copy] [flags]

Install jax[tpu] and rrc_jax on every worker, in a fresh virtual environment (~/rrc_jax/venv, made by uv with
its own Python, so the image's Python version does not matter).
  --repo URL         git clone URL on each worker (default: this checkout's `origin` remote, if any)
  --ref REF          the branch or tag to clone (default: the remote's default branch)
  --wheel gs://...   install this wheel, copied from Cloud Storage on each worker
  --copy             ship this checkout's HEAD (git archive; uncommitted changes are not included)
  --assets gs://...  mirror this prefix (models, prompt files) into ~/rrc_jax/assets on each worker; the trainer
                     runs in ~/rrc_jax, so its flags name them assets/...
  --python VERSION   the virtual environment's Python (default 3.12)
EOF
    ;;
    train) cat <<'EOF'
usage: tpu.sh train --name NAME --zone ZONE --config CONFIG --workdir gs://... [flags] [-- --config.KEY=VALUE ...]

Stop stale trainers and free the TPU on every worker, then start
`python -m rrc_jax.train --config=CONFIG --config.workdir=WORKDIR [overrides]` on every worker under nohup, in
~/rrc_jax (log: ~/rrc_jax/train.log). Then follow worker 0's log and check every worker's status every
--interval seconds; when a worker's trainer exits with an error, stop the trainers on all workers and exit 1.
Ctrl-C detaches (training goes on; `tpu.sh stop` stops it). The trainer resumes from the latest checkpoint in
WORKDIR.
  --config CONFIG     a packaged config (agr.py, scr.py, prc.py, drm.py) or a path relative to ~/rrc_jax
                      (src/... for a file in the shipped source tree)
  --workdir gs://...  checkpoints and metrics; a gs:// path, so that every worker and a re-created slice share it
  --api-key-file FILE a local file holding a reward service's bearer token (--config.reward.service_url),
                      copied to every worker and exported as RRC_API_KEY to the trainer
  --detach            start training and return
  --interval SECONDS  between status checks (default 60)
  --grace SECONDS     how long stale trainers get to exit after SIGTERM before SIGKILL (default 30)
EOF
    ;;
    logs) cat <<'EOF'
usage: tpu.sh logs --name NAME --zone ZONE [--worker N|all] [--follow] [--lines N]

Print the end of the trainer's log on each worker, each line prefixed with the worker's hostname.
  --worker N|all  (default all)
  --follow        keep printing new lines (Ctrl-C to end)
  --lines N       lines from the end (default 100)
EOF
    ;;
    ssh) cat <<'EOF'
usage: tpu.sh ssh --name NAME --zone ZONE [--worker N]

Open a shell on a worker (default 0).
EOF
    ;;
    stop) cat <<'EOF'
usage: tpu.sh stop --name NAME --zone ZONE [--grace SECONDS]

Stop every rrc_jax process on every worker: SIGTERM (the trainer saves a checkpoint and exits), SIGKILL after
--grace seconds (default 30), then kill whatever still holds the TPU and remove the libtpu lock file.
EOF
    ;;
    delete) cat <<'EOF'
usage: tpu.sh delete --name NAME --zone ZONE [--no-queue]

Delete the queued resource (and its TPU VM) or, with --no-queue, the TPU VM. Returns once the deletion is started.
EOF
    ;;
    watch) cat <<'EOF'
usage: tpu.sh watch [the flags of create, setup and train] [--max-restarts N] [-- --config.KEY=VALUE ...]

Keep a run alive. Every --interval seconds (default 60), read the slice's state:
  SUSPENDING, SUSPENDED, FAILED (queued resource) or PREEMPTED, TERMINATED (TPU VM):
      delete the slice, create it again, and once it is ACTIVE run setup and train --detach;
  ACTIVE / READY: check training on every worker; a failed or missing trainer is stopped on all workers and
      started again; when every worker's trainer has exited 0, exit 0.
Each re-creation or restart counts against --max-restarts (default 10); past it, exit 1. The trainer resumes
from its latest checkpoint in the gs:// workdir. With --dry-run: print one round of recovery and exit.
EOF
    ;;
    judge) cat <<'EOF'
usage: tpu.sh judge --name NAME --zone ZONE --model DIR [--port 8000] [-- SERVE_FLAGS ...]

Serve a judge model on the slice (one host: v5litepod-8, v6e-8, v5p-8, v4-8): stop what runs there, then start
`python -m rrc_jax.serve --model=DIR --host=0.0.0.0 --port=PORT [flags]` on worker 0 under nohup, in ~/rrc_jax
(log: ~/rrc_jax/judge.log). It answers OpenAI-compatible completions on the VPC's internal network (the default
firewall admits no outside traffic); `tpu.sh address` prints its URL. Several judge slices are a pool: list their
URLs in the reward service's --judges or the trainer's --config.inference.url.
  --model DIR   the judge's Hugging Face directory, relative to ~/rrc_jax (assets/... from setup --assets)
  --port PORT   (default 8000)
EOF
    ;;
    service) cat <<'EOF'
usage: tpu.sh service --name NAME --zone ZONE --config CONFIG --api-key-file FILE [--judges URL,...]
                      [--port 8100] [-- --config.KEY=VALUE ...]

Serve a reward recipe (python -m rrc_jax.service) on worker 0 of the slice, listening on every interface:
stop what runs there, then start it under nohup in ~/rrc_jax (log: ~/rrc_jax/service.log). Its judge asks the
judge slices at --judges (a pool; --config.inference.engine=openai), or runs on the slice's own chips without it.
A trainer then takes its rewards with --config.reward.service_url=URL (`tpu.sh address`).
  --config CONFIG      the recipe: a packaged config (agr.py, scr.py) or a path relative to ~/rrc_jax
  --api-key-file FILE  a local file holding the bearer token (the service listens beyond the loopback); copied to
                       ~/rrc_jax/api_key on worker 0 and read from there. Give the trainer the same file
                       (tpu.sh train --api-key-file FILE).
  --judges URL,...     the judge servers' base URLs, comma-separated
  --port PORT          (default 8100)
EOF
    ;;
    address) cat <<'EOF'
usage: tpu.sh address --name NAME --zone ZONE [--port PORT]

Print the base URL of worker 0 on the VPC's internal network, http://IP:PORT (default port 8000: a judge's).
EOF
    ;;
    *) cat <<EOF
usage: $PROG COMMAND [flags] [-- --config.KEY=VALUE ...]

Run rrc_jax on a Cloud TPU slice with gcloud.

commands:
  create   request a slice (a queued resource; --no-queue: a TPU VM) and wait until it is ACTIVE
  setup    install jax[tpu] and rrc_jax on every worker
  train    start the trainer on every worker; follow worker 0; when one worker fails, stop them all
  logs     print or follow the trainer's log on the workers
  ssh      open a shell on a worker
  stop     stop the trainer on every worker and free the TPU
  delete   delete the slice
  watch    keep a run alive: re-create a preempted slice, set it up and restart training
  judge    serve a judge model on a one-host slice (python -m rrc_jax.serve)
  service  serve a reward recipe on a slice (python -m rrc_jax.service), its judge a pool of judge slices
  address  print a slice's worker-0 URL on the internal network

flags of every command:
  --name NAME        the slice (queued resource and node) name (env TPU_NAME)
  --zone ZONE        (env ZONE)
  --project PROJECT  (env PROJECT; default: gcloud config get-value project)
  --no-queue         the slice is a plain TPU VM, not a queued resource
  --dry-run          print the commands, one per line prefixed with "+ ", and run nothing
  -h, --help         this help; "$PROG COMMAND --help" for a command's flags
EOF
    ;;
  esac
}

# --- command lines and queries (log, show, run: common.sh) --------------------------------------------------------

# Join shell commands into one line: "CMD1; CMD2; ...".
join_commands() {
  local joined
  printf -v joined '%s; ' "$@"
  printf '%s\n' "${joined%; }"
}

# Run a command for its output, shown only in dry-run, where the output is PLACEHOLDER: query PLACEHOLDER CMD...
query() {
  local placeholder=$1
  shift
  if ((DRY_RUN)); then
    show "$@"
    printf '%s\n' "$placeholder"
    return 0
  fi
  "$@"
}

# --- gcloud commands ----------------------------------------------------------------------------------------------

# Run COMMAND on WORKER (a number or `all`; all workers run in parallel and gcloud exits non-zero if any fails).
ssh_workers() {
  local worker=$1 command=$2
  run gcloud compute tpus tpu-vm ssh "$NAME" "--zone=$ZONE" "--project=$PROJECT" "--worker=$worker" \
    "--command=$command"
}

# Like ssh_workers, for the output (not shown outside dry-run: status polls would flood the log).
query_workers() {
  local worker=$1 command=$2
  query "" gcloud compute tpus tpu-vm ssh "$NAME" "--zone=$ZONE" "--project=$PROJECT" "--worker=$worker" \
    "--command=$command"
}

# Request the slice. A queued resource waits for capacity and then creates the node NAME; --best-effort exists in
# the alpha surface only. --no-queue creates the TPU VM directly (and fails at once if there is no capacity).
create_resource() {
  local cmd
  if ((QUEUED)); then
    cmd=(gcloud compute tpus queued-resources create "$NAME" "--node-id=$NAME")
    [[ $PROVISIONING == best-effort ]] && cmd=(gcloud alpha "${cmd[@]:1}")
    cmd+=("--accelerator-type=$ACCELERATOR_TYPE" "--runtime-version=$RUNTIME_VERSION")
  else
    cmd=(gcloud compute tpus tpu-vm create "$NAME" "--accelerator-type=$ACCELERATOR_TYPE"
      "--version=$RUNTIME_VERSION")
  fi
  cmd+=("--zone=$ZONE" "--project=$PROJECT")
  [[ -n $PROVISIONING ]] && cmd+=("--$PROVISIONING")
  run "${cmd[@]}"
}

# Delete the slice: the queued resource with its node (--force), or the TPU VM. --quiet skips the confirmation
# prompt. Pass --async to return at once; re-creating under the same name needs the deletion finished.
delete_resource() {
  if ((QUEUED)); then
    run gcloud compute tpus queued-resources delete "$NAME" "--zone=$ZONE" "--project=$PROJECT" --force --quiet "$@"
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "--zone=$ZONE" "--project=$PROJECT" --quiet "$@"
  fi
}

# The slice's state: a queued resource's (WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, SUSPENDED, FAILED, ...) or
# a TPU VM's (CREATING, READY, PREEMPTED, TERMINATED, ...); UNKNOWN when describe fails.
resource_state() {
  local state
  if ((QUEUED)); then
    state=$(query ACTIVE gcloud compute tpus queued-resources describe "$NAME" "--zone=$ZONE" \
      "--project=$PROJECT" '--format=value(state.state)') || state=UNKNOWN
  else
    state=$(query READY gcloud compute tpus tpu-vm describe "$NAME" "--zone=$ZONE" "--project=$PROJECT" \
      '--format=value(state)') || state=UNKNOWN
  fi
  printf '%s\n' "${state:-UNKNOWN}"
}

is_up() { [[ $1 == ACTIVE || $1 == READY ]]; }

is_lost() { [[ $1 =~ ^(SUSPENDING|SUSPENDED|FAILED|PREEMPTED|TERMINATED)$ ]]; }

# Poll the state until the slice is up (in dry-run: one poll).
wait_until_up() {
  local state
  while :; do
    state=$(resource_state)
    if is_up "$state" || ((DRY_RUN)); then return 0; fi
    is_lost "$state" && die "$NAME is $state"
    log "$NAME is $state; next check in ${INTERVAL}s"
    sleep "$INTERVAL"
  done
}

# --- setup --------------------------------------------------------------------------------------------------------

# The remote commands that fetch the package (a clone or the shipped archive in src/, or the wheel in dist/) and
# set $pkg to what to pip-install.
source_step() {
  if [[ -n $WHEEL ]]; then
    join_commands "rm -rf dist" "mkdir dist" "gcloud storage cp $(shell_quote "$WHEEL") dist/" \
      "pkg=\$(ls dist/*.whl)"
  elif ((COPY)); then
    join_commands "rm -rf src" "mkdir src" "tar -xzf \$HOME/rrc_jax_src.tar.gz -C src" "pkg=./src"
  else
    join_commands "rm -rf src" \
      "git clone --quiet --depth=1 ${REF:+--branch=$(shell_quote "$REF") }$(shell_quote "$REPO") src" "pkg=./src"
  fi
}

# The default source: this checkout's `origin` remote, unless --wheel or --copy is given.
resolve_source() {
  local sources=$((${#REPO} > 0 ? 1 : 0))
  sources=$((sources + (${#WHEEL} > 0 ? 1 : 0) + COPY))
  ((sources <= 1)) || die_usage "give one of --repo, --wheel and --copy"
  [[ -z $WHEEL || $WHEEL == gs://* ]] || die_usage "--wheel must be a gs:// path, not $WHEEL"
  [[ -z $ASSETS || $ASSETS == gs://* ]] || die_usage "--assets must be a gs:// path, not $ASSETS"
  [[ -z $REF || -n $REPO || $sources -eq 0 ]] || die_usage "--ref goes with --repo"
  if ((sources == 0)); then
    REPO=$(git -C "$(repo_root)" remote get-url origin 2>/dev/null) ||
      die_usage "missing --repo URL (this checkout has no 'origin' remote), --wheel gs://... or --copy"
  fi
}

repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

# Ship this checkout's HEAD to every worker as ~/rrc_jax_src.tar.gz (tpu-vm scp copies to all workers).
ship_checkout() {
  local root archive
  root=$(repo_root)
  archive="${TMPDIR:-/tmp}/rrc_jax_src.$$.tar.gz"
  if ! ((DRY_RUN)) && [[ -n $(git -C "$root" status --porcelain --untracked-files=no) ]]; then
    log "warning: uncommitted changes are not shipped (--copy ships HEAD)"
  fi
  run git -C "$root" archive --format=tar.gz "--output=$archive" HEAD
  run gcloud compute tpus tpu-vm scp "$archive" "$NAME:rrc_jax_src.tar.gz" "--zone=$ZONE" "--project=$PROJECT" \
    --worker=all
  ((DRY_RUN)) || rm -f "$archive"
}

# Install the package on every worker: uv (from PyPI, into ~/.local) makes a virtual environment with its own
# Python, then installs jax[tpu] (jax with libtpu) and the package into it, resolved together. --assets: mirror a
# Cloud Storage prefix (models, prompt files) into assets/ (rsync: unchanged files are not fetched again).
setup_workers() {
  local uv="\$HOME/.local/bin/uv" steps
  ((COPY)) && ship_checkout
  steps=("set -e" "mkdir -p $REMOTE_DIR" "cd $REMOTE_DIR" "$(source_step)")
  [[ -n $ASSETS ]] && steps+=("gcloud storage rsync --recursive $(shell_quote "$ASSETS") assets")
  steps+=("PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user --quiet --upgrade uv"
    "rm -rf venv" "$uv venv --quiet --python $(shell_quote "$PYTHON_VERSION") venv"
    "$uv pip install --quiet --python venv/bin/python 'jax[tpu]' \"\$pkg\""
    "venv/bin/python -c 'import jax, rrc_jax; print(\"jax\", jax.__version__, \"and rrc_jax installed\")'")
  ssh_workers all "$(join_commands "${steps[@]}")"
}

# --- training -----------------------------------------------------------------------------------------------------

# Stop every rrc_jax process on every worker: SIGTERM, up to GRACE seconds to exit (the trainer saves a
# checkpoint), SIGKILL; then kill whatever still holds the TPU devices (/dev/accel* on v4, /dev/vfio/* from v5)
# and remove the lock file libtpu leaves behind, which would stop the next start-up.
stop_training() {
  local pattern
  pattern=$(shell_quote "$TRAINER_PATTERN")
  ssh_workers all "$(join_commands "sudo pkill -TERM -f $pattern" \
    "for _ in \$(seq $GRACE); do pgrep -f $pattern >/dev/null || break; sleep 1; done" \
    "sudo pkill -KILL -f $pattern" \
    "sudo lsof -t /dev/accel* /dev/vfio/* 2>/dev/null | xargs -r sudo kill -9" \
    "sudo rm -f /tmp/libtpu_lockfile")"
}

# The trainer's command line on a worker, run in REMOTE_DIR. JAX's multi-host start-up needs no flags on Cloud TPU
# VMs: the trainer calls jax.distributed.initialize(), which finds the other workers itself.
trainer_command() {
  printf '%s' "$(key_export)"
  shell_quote venv/bin/python -m rrc_jax.train "--config=$CONFIG" "--config.workdir=$WORKDIR" \
    ${TRAIN_OVERRIDES[@]+"${TRAIN_OVERRIDES[@]}"}
}

# A reward service's bearer token: read from the file --api-key-file copied, never written in a command line.
key_export() {
  [[ -n $API_KEY_FILE ]] && printf '%s' "RRC_API_KEY=\$(cat $REMOTE_DIR/api_key) "
  return 0
}

# Copy --api-key-file to REMOTE_DIR/api_key on WORKER (a number or all), readable by its owner only.
ship_key() {
  [[ -n $API_KEY_FILE ]] || return 0
  run gcloud compute tpus tpu-vm scp "$API_KEY_FILE" "$NAME:rrc_jax/api_key" "--zone=$ZONE" "--project=$PROJECT" \
    "--worker=$1"
  ssh_workers "$1" "chmod 600 $REMOTE_DIR/api_key"
}

# --- a judge or a reward service on worker 0 ----------------------------------------------------------------------

# Start COMMAND (a shell line run in REMOTE_DIR) on worker 0 in its own session, logging to LOG (kept as .1).
launch_server() {
  local command=$1 log=$2 wrapped
  wrapped=$(shell_quote "$command")
  ssh_workers 0 "$(join_commands "set -e" "cd $REMOTE_DIR" "if [ -f $log ]; then mv -f $log $log.1; fi" \
    "setsid nohup bash -c $wrapped > $log 2>&1 < /dev/null &")"
}

server_started() {
  log "started; its URL: $PROG address --name $NAME --zone $ZONE --port $PORT; its log on worker 0: ~/$1"
}

# Start the trainer on every worker in its own session (setsid, nohup: it outlives the ssh connection), logging to
# REMOTE_LOG (the previous log kept as .1); a wrapper shell writes its exit code to REMOTE_STATUS.
launch_training() {
  local wrapped
  wrapped=$(shell_quote "$(trainer_command); echo \$? > $REMOTE_STATUS")
  ssh_workers all "$(join_commands "set -e" "cd $REMOTE_DIR" "rm -f $REMOTE_STATUS" \
    "if [ -f $REMOTE_LOG ]; then mv -f $REMOTE_LOG $REMOTE_LOG.1; fi" \
    "setsid nohup bash -c $wrapped > $REMOTE_LOG 2>&1 < /dev/null &")"
}

# Stop whatever runs on the TPU, ship the service's token (--api-key-file), then start training; if the start
# fails on any worker, stop them all.
start_training() {
  stop_training
  ship_key all
  if ! launch_training; then
    stop_training || true
    return 1
  fi
}

# One line per worker: "rrc_jax_status HOSTNAME running|EXIT_CODE|missing" (missing: no trainer, no exit code).
status_command() {
  join_commands "if [ -f $REMOTE_STATUS ]; then s=\$(cat $REMOTE_STATUS)" \
    "elif pgrep -f $(shell_quote "$TRAINER_PATTERN") >/dev/null; then s=running" "else s=missing" "fi" \
    "echo \"rrc_jax_status \$(hostname) \$s\""
}

# Training across the workers: done (every trainer exited 0), failed (one exited non-zero or is missing; the
# workers' lines go to stderr), running, or unknown (a worker did not answer).
training_status() {
  local out rc=0 tag value failed=0 running=0 workers=0
  out=$(query_workers all "$(status_command)") || rc=$?
  while read -r tag _ value; do
    [[ $tag == rrc_jax_status ]] || continue
    workers=$((workers + 1))
    case $value in
      0) ;;
      running) running=$((running + 1)) ;;
      *) failed=1 ;;
    esac
  done <<<"$out"
  if ((failed)); then
    grep '^rrc_jax_status' <<<"$out" | sed "s/^rrc_jax_status/$PROG: worker/" >&2
    echo failed
  elif ((rc != 0 || workers == 0)); then
    echo unknown
  elif ((running)); then
    echo running
  else
    echo "done"
  fi
}

stop_follower() {
  if [[ -n $FOLLOWER_PID ]]; then kill "$FOLLOWER_PID" 2>/dev/null || true; fi
}

# Follow worker 0's log in the background (in dry-run: show the command).
follow_worker0() {
  local command="tail -n +1 -F $REMOTE_LOG"
  if ((DRY_RUN)); then
    ssh_workers 0 "$command"
    return 0
  fi
  ssh_workers 0 "$command" &
  FOLLOWER_PID=$!
  trap stop_follower EXIT
  trap 'log "detached: training goes on ($PROG stop ... stops it)"; exit 130' INT
}

# Follow worker 0 and poll every worker until training ends; when one fails, stop all (exit 1).
monitor_training() {
  local status state
  follow_worker0
  if ((DRY_RUN)); then
    training_status >/dev/null
    return 0
  fi
  while :; do
    sleep "$INTERVAL"
    status=$(training_status)
    case $status in
      done)
        log "training exited 0 on every worker"
        return 0
        ;;
      failed)
        log "a worker's trainer failed: stopping every worker (their logs: $PROG logs --name $NAME ...)"
        stop_training || true
        return 1
        ;;
      unknown)
        state=$(resource_state)
        is_up "$state" || die "$NAME is $state (preempted?): '$PROG watch' re-creates it and resumes training"
        ;;
    esac
  done
}

# --- commands -----------------------------------------------------------------------------------------------------

cmd_judge() {
  stop_training
  launch_server "$(shell_quote venv/bin/python -m rrc_jax.serve "--model=$MODEL" --host=0.0.0.0 "--port=$PORT" \
    ${TRAIN_OVERRIDES[@]+"${TRAIN_OVERRIDES[@]}"})" "$REMOTE_DIR/judge.log"
  server_started rrc_jax/judge.log
}

cmd_service() {
  local judges=()
  [[ -n $JUDGES ]] && judges=(--config.inference.engine=openai "--config.inference.url=$JUDGES")
  stop_training
  ship_key 0
  launch_server "$(key_export)$(shell_quote venv/bin/python -m rrc_jax.service "--config=$CONFIG" --host=0.0.0.0 \
    "--port=$PORT" ${judges[@]+"${judges[@]}"} ${TRAIN_OVERRIDES[@]+"${TRAIN_OVERRIDES[@]}"})" \
    "$REMOTE_DIR/service.log"
  server_started rrc_jax/service.log
}

cmd_address() {
  local ip
  ip=$(query 10.0.0.2 gcloud compute tpus tpu-vm describe "$NAME" "--zone=$ZONE" "--project=$PROJECT" \
    '--format=value(networkEndpoints[0].ipAddress)')
  ((DRY_RUN)) && return 0
  [[ -n $ip ]] || die "$NAME has no internal address (is it up?)"
  printf 'http://%s:%s\n' "$ip" "$PORT"
}

cmd_create() {
  create_resource
  ((ASYNC)) || wait_until_up
}

cmd_setup() { setup_workers; }

cmd_train() {
  start_training || die "training did not start on every worker; stopped them all"
  if ((DETACH)); then
    log "training started; follow it with: $PROG logs --follow --worker 0"
    return 0
  fi
  monitor_training
}

cmd_logs() {
  local follow=""
  ((FOLLOW)) && follow=" -F"
  ssh_workers "$WORKER" "tail -n $LINES$follow $REMOTE_LOG | sed -u \"s/^/[\$(hostname)] /\""
}

cmd_ssh() { run gcloud compute tpus tpu-vm ssh "$NAME" "--zone=$ZONE" "--project=$PROJECT" "--worker=$WORKER"; }

cmd_stop() { stop_training; }

cmd_delete() { delete_resource --async; }

count_restart() {
  RESTARTS=$((RESTARTS + 1))
  ((RESTARTS <= MAX_RESTARTS)) || die "gave up after $MAX_RESTARTS restarts (--max-restarts)"
  log "restart $RESTARTS of at most $MAX_RESTARTS: $*"
}

# Delete the lost slice (waiting for the deletion, the name is reused) and request it again.
recreate_resource() {
  delete_resource
  create_resource
}

cmd_watch() {
  local state fresh=0
  RESTARTS=0
  if ((DRY_RUN)); then  # one round of recovery, as if the slice had been preempted
    resource_state >/dev/null
    recreate_resource
    setup_workers
    start_training
    training_status >/dev/null
    return 0
  fi
  while :; do
    state=$(resource_state)
    if is_lost "$state"; then
      count_restart "$NAME is $state: re-creating it"
      recreate_resource || log "re-creating $NAME failed; trying again next round"
      fresh=1
    elif is_up "$state" && ((fresh)); then
      if setup_workers && start_training; then
        fresh=0
      else
        count_restart "setup or start-up failed on $NAME"
      fi
    elif is_up "$state"; then
      case $(training_status) in
        done)
          log "training exited 0 on every worker"
          return 0
          ;;
        failed)
          count_restart "training failed or is not running: restarting it"
          start_training || log "training did not start on every worker; trying again next round"
          ;;
      esac
    else
      log "$NAME is $state"
    fi
    sleep "$INTERVAL"
  done
}

# --- flags --------------------------------------------------------------------------------------------------------

# The flags COMMAND accepts (besides -h / --help).
command_flags() {
  local common="--name --zone --project --no-queue --dry-run"
  local create="--accelerator-type --runtime-version --spot --best-effort --preemptible --interval"
  local setup="--repo --ref --wheel --copy --assets --python"
  local train="--config --workdir --interval --grace --api-key-file"
  case $1 in
    create) echo "$common $create --async" ;;
    setup) echo "$common $setup" ;;
    train) echo "$common $train --detach" ;;
    logs) echo "$common --worker --follow --lines" ;;
    ssh) echo "$common --worker" ;;
    stop) echo "$common --grace" ;;
    delete) echo "$common" ;;
    watch) echo "$common $create $setup $train --max-restarts" ;;
    judge) echo "$common --model --port --grace" ;;
    service) echo "$common --config --judges --port --api-key-file --grace" ;;
    address) echo "$common --port" ;;
  esac
}

is_command() { [[ $1 =~ ^(create|setup|train|logs|ssh|stop|delete|watch|judge|service|address)$ ]]; }

is_switch() { [[ $1 =~ ^--(no-queue|dry-run|spot|best-effort|preemptible|async|copy|detach|follow)$ ]]; }

takes_overrides() { [[ $1 =~ ^(train|watch|judge|service)$ ]]; }

set_switch() {
  case $1 in
    --no-queue) QUEUED=0 ;;
    --dry-run) DRY_RUN=1 ;;
    --spot | --best-effort | --preemptible)
      [[ -z $PROVISIONING || $PROVISIONING == "${1#--}" ]] ||
        die_usage "give one of --spot, --best-effort and --preemptible"
      PROVISIONING=${1#--}
      ;;
    --async) ASYNC=1 ;;
    --copy) COPY=1 ;;
    --detach) DETACH=1 ;;
    --follow) FOLLOW=1 ;;
  esac
}

set_flag() {
  local flag=$1 value=$2
  case $flag in
    --name) NAME=$value ;;
    --zone) ZONE=$value ;;
    --project) PROJECT=$value ;;
    --accelerator-type) ACCELERATOR_TYPE=$value ;;
    --runtime-version) RUNTIME_VERSION=$value ;;
    --repo) REPO=$value ;;
    --ref) REF=$value ;;
    --wheel) WHEEL=$value ;;
    --assets) ASSETS=$value ;;
    --python) PYTHON_VERSION=$value ;;
    --config) CONFIG=$value ;;
    --workdir) WORKDIR=$value ;;
    --worker) WORKER=$value ;;
    --interval) INTERVAL=$(whole_number "$flag" "$value") ;;
    --grace) GRACE=$(whole_number "$flag" "$value") ;;
    --lines) LINES=$(whole_number "$flag" "$value") ;;
    --max-restarts) MAX_RESTARTS=$(whole_number "$flag" "$value") ;;
    --model) MODEL=$value ;;
    --port) PORT=$(whole_number "$flag" "$value") ;;
    --judges) JUDGES=$value ;;
    --api-key-file) API_KEY_FILE=$value ;;
  esac
}

default_runtime_version() {
  case $ACCELERATOR_TYPE in
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    v4-*) echo tpu-ubuntu2204-base ;;
    *) die_usage "missing --runtime-version (no default for --accelerator-type=$ACCELERATOR_TYPE)" ;;
  esac
}

# Check the flags COMMAND needs and fill in defaults.
check_flags() {
  require NAME --name TPU_NAME
  require ZONE --zone ZONE
  if [[ $COMMAND == create || $COMMAND == watch ]]; then
    require ACCELERATOR_TYPE --accelerator-type ACCELERATOR_TYPE
    [[ -n $RUNTIME_VERSION ]] || RUNTIME_VERSION=$(default_runtime_version)
    if ((QUEUED)) && [[ $PROVISIONING == preemptible ]]; then
      die_usage "--preemptible needs --no-queue (queued resources take --spot or --best-effort)"
    fi
    if ! ((QUEUED)) && [[ $PROVISIONING == best-effort ]]; then
      die_usage "--best-effort is for queued resources (drop --no-queue)"
    fi
  fi
  if [[ $COMMAND == setup || $COMMAND == watch ]]; then resolve_source; fi
  if [[ $COMMAND == train || $COMMAND == watch ]]; then
    require CONFIG --config
    require WORKDIR --workdir
    [[ $WORKDIR == gs://* ]] || log "warning: --workdir $WORKDIR is not a gs:// path: each worker writes its own" \
      "local copy, and a re-created slice starts from scratch"
  fi
  case $COMMAND in
    logs) WORKER=${WORKER:-all} ;;
    ssh) WORKER=${WORKER:-0} ;;
    judge)
      require MODEL --model
      PORT=${PORT:-8000}
      ;;
    service)
      require CONFIG --config
      require API_KEY_FILE --api-key-file
      PORT=${PORT:-8100}
      ;;
    address) PORT=${PORT:-8000} ;;
  esac
  [[ -z $API_KEY_FILE || -r $API_KEY_FILE ]] || die_usage "--api-key-file $API_KEY_FILE is not a readable file"
  local url
  for url in ${JUDGES//,/ }; do
    [[ $url =~ ^https?://[^/]+ ]] || die_usage "--judges takes http(s) base URLs, comma-separated, not '$url'"
  done
  if [[ $WORKER == all && $COMMAND == ssh ]] || ! [[ $WORKER =~ ^([0-9]+|all)?$ ]]; then
    die_usage "--worker takes a worker number$([[ $COMMAND == logs ]] && echo ' or all'), not '$WORKER'"
  fi
  resolve_project
}

main "$@"
