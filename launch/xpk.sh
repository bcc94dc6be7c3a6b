#!/usr/bin/env bash
# Run the rrc_jax trainer on several Cloud TPU slices at once with xpk, on a GKE cluster: build and push the
# trainer's image (launch/Dockerfile), create the cluster and its slices, submit the training workload (one
# container per TPU host, every slice's hosts in one JAX program), delete it. `launch/README.md` ("Several slices
# with xpk") is the guide; `launch/xpk.sh --help` and `launch/xpk.sh COMMAND --help` list the flags.
#
# Every command goes through `run`: shown on stderr as `+ xpk ...`, or with --dry-run printed on stdout (one per
# line, `+ ` and the shell-quoted words) and not run.
set -euo pipefail

PROG=${0##*/}
readonly PROG

# The helpers both launchers share (messages, run / show, flag parsing, main).
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# A cluster's or a workload's name, as xpk checks it (xpk.parser.validators.name_type): lower case letters,
# digits and hyphens, starting with a letter and ending with a letter or digit, at most 40 characters.
readonly NAME_PATTERN='^[a-z]([-a-z0-9]*[a-z0-9])?$'
readonly NAME_MAX=40

# Flags (environment defaults where noted in usage).
CLUSTER=${CLUSTER:-}
ZONE=${ZONE:-}
PROJECT=${PROJECT:-}
TPU_TYPE=${TPU_TYPE:-}
NUM_SLICES=${NUM_SLICES:-1}
IMAGE=${IMAGE:-}
CAPACITY=""  # spot, reservation or on-demand
RESERVATION=""
WORKLOAD=""
CONFIG=""
WORKDIR=""
ASSETS=""
MAX_RESTARTS=10
GRACE=""
DELETE_CLUSTER=0
DRY_RUN=0
TRAIN_OVERRIDES=()

COMMAND=""

usage() {
  case ${1:-} in
    image) cat <<'EOF'
usage: xpk.sh image --image IMAGE

Build the trainer's image from launch/Dockerfile (jax[tpu] and this checkout's rrc_jax, for linux/amd64, the
TPU hosts' platform) and push it:
  docker build --platform=linux/amd64 -f launch/Dockerfile -t IMAGE .   (in the repository's root)
  docker push IMAGE
  --image IMAGE  e.g. us-docker.pkg.dev/PROJECT/REPOSITORY/rrc-jax:TAG (env IMAGE); `docker push` needs to be
                 logged in to the registry (gcloud auth configure-docker us-docker.pkg.dev)
EOF
    ;;
    create) cat <<'EOF'
usage: xpk.sh create --cluster NAME --zone ZONE --tpu-type TYPE [--num-slices N] [--spot | --reservation NAME |
                     --on-demand]

Create the GKE cluster with N TPU slices of TYPE (a node pool each): xpk cluster create. Takes a while (tens of
minutes); run it again after a failure, it picks up what exists.
  --tpu-type TYPE       e.g. v5litepod-64, v5p-64, v6e-64 (env TPU_TYPE)
  --num-slices N        (env NUM_SLICES; default 1)
  --spot                spot capacity (preemptible at any time, far cheaper)
  --reservation NAME    a reservation's capacity
  --on-demand           on-demand capacity (the default)
EOF
    ;;
    run) cat <<'EOF'
usage: xpk.sh run --cluster NAME --zone ZONE --workload NAME --tpu-type TYPE [--num-slices N] --image IMAGE
                  --config CONFIG --workdir gs://... [--assets gs://...] [--max-restarts N] [--grace SECONDS]
                  [-- --config.KEY=VALUE ...]

Submit the training workload (xpk workload create): on every host of the N slices, the image runs
  python -m rrc_jax.train --config=CONFIG --config.workdir=WORKDIR [overrides]
in its working directory (/workspace). JAX's start-up finds the other hosts and slices itself; how the mesh spans
the slices is --config.mesh.dcn (default auto: data parallel over the slices).
  --workload NAME     the workload (JobSet) name
  --tpu-type TYPE     the slices' type and count, as the cluster's (env TPU_TYPE; NUM_SLICES, default 1)
  --num-slices N
  --image IMAGE       the image `xpk.sh image` pushed (env IMAGE)
  --config CONFIG     a packaged config (agr.py, scr.py, prc.py, drm.py) or a path in the image
  --workdir gs://...  checkpoints and metrics; a gs:// path, which every slice's hosts share and from which a
                      restarted workload resumes
  --assets gs://...   copy this prefix (models, prompt files) into /workspace/assets on every host before training;
                      the trainer's flags then name them assets/...
  --max-restarts N    restart the whole workload up to N times (default 10) when a host is lost or preempted (its
                      trainer ends by a signal); a trainer's error (exit 1, 2 or 3) ends the workload. Each restart
                      resumes from the latest checkpoint in WORKDIR.
  --grace SECONDS     how long a host's trainer gets after SIGTERM (it saves a checkpoint after its current step)
                      before it is killed (xpk's default: 30)
EOF
    ;;
    delete) cat <<'EOF'
usage: xpk.sh delete --cluster NAME --zone ZONE [--workload NAME] [--delete-cluster]

Delete the workload (xpk workload delete); with --delete-cluster, then the cluster (xpk cluster delete, which asks
before it deletes a cluster that still runs other workloads). Checkpoints and metrics stay in the workdir.
  --workload NAME     the workload to delete
  --delete-cluster    also delete the cluster
EOF
    ;;
    *) cat <<EOF
usage: $PROG COMMAND [flags] [-- --config.KEY=VALUE ...]

Run rrc_jax on several Cloud TPU slices with xpk (a GKE cluster).

commands:
  image    build the trainer's image (launch/Dockerfile) and push it
  create   create the GKE cluster and its TPU slices
  run      submit the training workload on every slice
  delete   delete the workload (--delete-cluster: and the cluster)

flags of every command but image:
  --cluster NAME     the GKE cluster (env CLUSTER)
  --zone ZONE        (env ZONE)
  --project PROJECT  (env PROJECT; default: gcloud config get-value project)
flags of every command:
  --dry-run          print the commands, one per line prefixed with "+ ", and run nothing
  -h, --help         this help; "$PROG COMMAND --help" for a command's flags
EOF
    ;;
  esac
}

# --- tools (log, show, run: common.sh) ----------------------------------------------------------------------------

# Fail unless TOOL is on PATH (not checked in dry-run): need TOOL HOW-TO-GET-IT.
need() {
  ((DRY_RUN)) || command -v "$1" >/dev/null || die "$1 not found on PATH: $2"
}

# --- commands -----------------------------------------------------------------------------------------------------

# Build in the repository's root (the build context: launch/Dockerfile copies pyproject.toml, README.md, rrc_jax/
# and configs/ from it) for the TPU hosts' platform, then push.
cmd_image() {
  need docker "https://docs.docker.com/engine/install/"
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  run docker build --platform=linux/amd64 -f launch/Dockerfile -t "$IMAGE" .
  run docker push "$IMAGE"
}

cmd_create() {
  local capacity=("--$CAPACITY")
  [[ $CAPACITY == reservation ]] && capacity=("--reservation=$RESERVATION")
  need xpk "pip install xpk (it also needs gcloud, kubectl and docker)"
  run xpk cluster create "--cluster=$CLUSTER" "--tpu-type=$TPU_TYPE" "--num-slices=$NUM_SLICES" "--zone=$ZONE" \
    "--project=$PROJECT" "${capacity[@]}"
}

# The container's command on every host. Each slice's hosts must reach the same workdir (gs://); --assets first
# copies a Cloud Storage prefix into assets/ with gcsfs (in the image: the trainer's gs:// support). `exec` makes
# the trainer the process xpk's container shell starts (recent bash releases do so by themselves for a list's last
# command; exec does on any), so that the SIGTERM it forwards on deletion or preemption reaches the trainer, which
# saves a checkpoint after its current step and exits 143.
workload_command() {
  local trainer copy
  trainer=$(shell_quote python -m rrc_jax.train "--config=$CONFIG" "--config.workdir=$WORKDIR" \
    ${TRAIN_OVERRIDES[@]+"${TRAIN_OVERRIDES[@]}"})
  if [[ -n $ASSETS ]]; then
    copy=$(shell_quote python -c \
      'import sys, gcsfs; gcsfs.GCSFileSystem().get(sys.argv[1].rstrip("/") + "/", "assets/", recursive=True)' \
      "$ASSETS")
    printf '%s && exec %s\n' "$copy" "$trainer"
  else
    printf 'exec %s\n' "$trainer"
  fi
}

cmd_run() {
  local extra=()
  [[ -n $GRACE ]] && extra+=("--termination-grace-period-seconds=$GRACE")
  need xpk "pip install xpk (it also needs gcloud, kubectl and docker)"
  run xpk workload create "--cluster=$CLUSTER" "--workload=$WORKLOAD" "--tpu-type=$TPU_TYPE" \
    "--num-slices=$NUM_SLICES" "--docker-image=$IMAGE" "--command=$(workload_command)" \
    "--max-restarts=$MAX_RESTARTS" ${extra[@]+"${extra[@]}"} "--zone=$ZONE" "--project=$PROJECT"
  ((DRY_RUN)) && return 0
  log "submitted; its state: xpk workload list --cluster=$CLUSTER --zone=$ZONE --project=$PROJECT"
  log "slice 0's first host's log (process 0; xpk has pointed kubectl at the cluster): kubectl logs -f -l" \
    "xpk.google.com/workload=$WORKLOAD,jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"
}

cmd_delete() {
  need xpk "pip install xpk"
  if [[ -n $WORKLOAD ]]; then
    run xpk workload delete "--cluster=$CLUSTER" "--workload=$WORKLOAD" "--zone=$ZONE" "--project=$PROJECT"
  fi
  if ((DELETE_CLUSTER)); then
    run xpk cluster delete "--cluster=$CLUSTER" "--zone=$ZONE" "--project=$PROJECT"
  fi
}

# --- flags --------------------------------------------------------------------------------------------------------

# The flags COMMAND accepts (besides -h / --help).
command_flags() {
  local common="--cluster --zone --project --dry-run"
  case $1 in
    image) echo "--image --dry-run" ;;
    create) echo "$common --tpu-type --num-slices --spot --reservation --on-demand" ;;
    run) echo "$common --workload --tpu-type --num-slices --image --config --workdir --assets --max-restarts --grace" ;;
    delete) echo "$common --workload --delete-cluster" ;;
  esac
}

is_command() { [[ $1 =~ ^(image|create|run|delete)$ ]]; }

is_switch() { [[ $1 =~ ^--(dry-run|spot|on-demand|delete-cluster)$ ]]; }

takes_overrides() { [[ $1 == run ]]; }

# Set the capacity (spot, reservation or on-demand); two different ones are a usage error.
set_capacity() {
  [[ -z $CAPACITY || $CAPACITY == "$1" ]] || die_usage "give one of --spot, --reservation and --on-demand"
  CAPACITY=$1
}

set_switch() {
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --spot | --on-demand) set_capacity "${1#--}" ;;
    --delete-cluster) DELETE_CLUSTER=1 ;;
  esac
}

set_flag() {
  local flag=$1 value=$2
  case $flag in
    --cluster) CLUSTER=$value ;;
    --zone) ZONE=$value ;;
    --project) PROJECT=$value ;;
    --tpu-type) TPU_TYPE=$value ;;
    --num-slices) NUM_SLICES=$value ;;
    --image) IMAGE=$value ;;
    --reservation)
      set_capacity reservation
      RESERVATION=$value
      ;;
    --workload) WORKLOAD=$value ;;
    --config) CONFIG=$value ;;
    --workdir) WORKDIR=$value ;;
    --assets) ASSETS=$value ;;
    --max-restarts) MAX_RESTARTS=$(whole_number "$flag" "$value") ;;
    --grace) GRACE=$(whole_number "$flag" "$value") ;;
  esac
}

# Fail with exit status 2 unless VALUE is a name xpk accepts for a cluster or a workload: check_name FLAG VALUE.
check_name() {
  [[ $2 =~ $NAME_PATTERN && ${#2} -le $NAME_MAX ]] ||
    die_usage "$1 takes a name of lower case letters, digits and hyphens, starting with a letter, not ending with" \
      "a hyphen, at most $NAME_MAX characters (xpk's rule), not '$2'"
}

# Check the flags COMMAND needs and fill in defaults.
check_flags() {
  if [[ $COMMAND == image ]]; then
    require IMAGE --image IMAGE
    return 0
  fi
  require CLUSTER --cluster CLUSTER
  require ZONE --zone ZONE
  check_name --cluster "$CLUSTER"
  case $COMMAND in
    create | run)
      require TPU_TYPE --tpu-type TPU_TYPE
      [[ $NUM_SLICES =~ ^[1-9][0-9]*$ ]] || die_usage "--num-slices takes a whole number >= 1, not '$NUM_SLICES'"
      ;;
  esac
  case $COMMAND in
    create) CAPACITY=${CAPACITY:-on-demand} ;;
    run)
      require WORKLOAD --workload
      check_name --workload "$WORKLOAD"
      require IMAGE --image IMAGE
      require CONFIG --config
      require WORKDIR --workdir
      [[ $WORKDIR == gs://?* ]] || die_usage "--workdir must be a gs:// path, not '$WORKDIR': every slice's hosts" \
        "write their checkpoints there and a restarted workload resumes from them; a container's own disk is" \
        "lost when it ends"
      [[ -z $ASSETS || $ASSETS == gs://?* ]] || die_usage "--assets must be a gs:// path, not '$ASSETS'"
      ;;
    delete)
      [[ -n $WORKLOAD ]] || ((DELETE_CLUSTER)) || die_usage "missing --workload (or --delete-cluster)"
      [[ -z $WORKLOAD ]] || check_name --workload "$WORKLOAD"
      ;;
  esac
  resolve_project
}

main "$@"
