# shellcheck shell=bash
# What launch/tpu.sh and launch/xpk.sh share: messages, showing and running commands, flag parsing and the entry
# point. Sourced by both (next to them), after they set PROG; the functions read the script's globals COMMAND,
# DRY_RUN, PROJECT and TRAIN_OVERRIDES, and call the script's own:
#   usage [COMMAND]          print the help (of COMMAND)
#   is_command WORD          whether WORD is one of the script's commands
#   command_flags COMMAND    the flags COMMAND accepts (besides -h / --help), space-separated
#   is_switch FLAG           whether FLAG takes no value
#   set_switch FLAG          set a switch
#   set_flag FLAG VALUE      set a flag's value
#   takes_overrides COMMAND  whether COMMAND takes arguments after -- (TRAIN_OVERRIDES)
#   check_flags              check the flags COMMAND needs and fill in defaults
#   cmd_COMMAND              run COMMAND

# --- messages and command execution -------------------------------------------------------------------------------

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }

die() {
  log "error: $*"
  exit 1
}

# A usage error: the message names the flag; exit status 2.
die_usage() {
  log "error: $*"
  log "see: $PROG ${COMMAND:+$COMMAND }--help"
  exit 2
}

# Print the arguments as one shell-quoted line: words of safe characters as they are, others in single quotes.
shell_quote() {
  local word out="" escaped="'\\''"
  for word in "$@"; do
    if [[ $word =~ ^[-A-Za-z0-9_./=:@,+%^]+$ ]]; then
      out+=" $word"
    else
      out+=" '${word//\'/$escaped}'"
    fi
  done
  printf '%s\n' "${out# }"
}

# Show a command: on stdout in dry-run, on stderr otherwise (fd 3, opened in main).
show() { printf '+ %s\n' "$(shell_quote "$@")" >&3; }

# Run a command (after showing it); in dry-run, only show it.
run() {
  show "$@"
  if ((DRY_RUN)); then return 0; fi
  "$@"
}

# --- flags --------------------------------------------------------------------------------------------------------

# Print VALUE if it is a whole number (>= 0), else fail: whole_number FLAG VALUE.
whole_number() {
  [[ $2 =~ ^[0-9]+$ ]] || die_usage "$1 takes a whole number, not '$2'"
  echo "$2"
}

parse_flags() {
  local arg flag value allowed
  allowed=" $(command_flags "$COMMAND") "
  while (($#)); do
    arg=$1
    shift
    case $arg in
      -h | --help)
        usage "$COMMAND"
        exit 0
        ;;
      --)
        takes_overrides "$COMMAND" || die_usage "$COMMAND takes no flags after --"
        # shellcheck disable=SC2034  # the script reads it
        TRAIN_OVERRIDES=("$@")
        return 0
        ;;
      --*) flag=${arg%%=*} ;;
      *) die_usage "unexpected argument '$arg'" ;;
    esac
    [[ $allowed == *" $flag "* ]] || die_usage "$COMMAND does not take $flag"
    if is_switch "$flag"; then
      [[ $arg == "$flag" ]] || die_usage "$flag takes no value"
      set_switch "$flag"
      continue
    fi
    if [[ $arg == *=* ]]; then
      value=${arg#*=}
    else
      (($#)) || die_usage "$flag needs a value"
      value=$1
      shift
    fi
    set_flag "$flag" "$value"
  done
}

# Fail with exit status 2 unless VARIABLE is set: require VARIABLE FLAG [ENV].
require() {
  [[ -n ${!1} ]] || die_usage "missing $2${3:+ (or set $3)}"
}

# --project, else gcloud's configured project (in dry-run: the placeholder $PROJECT).
resolve_project() {
  [[ -n $PROJECT ]] && return 0
  if ((DRY_RUN)); then
    PROJECT="\$PROJECT"
    return 0
  fi
  PROJECT=$(gcloud config get-value project 2>/dev/null) || true
  require PROJECT --project PROJECT
}

# --- the entry point ----------------------------------------------------------------------------------------------

main() {
  COMMAND=${1:-}
  case $COMMAND in
    -h | --help)
      usage
      exit 0
      ;;
    help)
      usage "${2:-}"
      exit 0
      ;;
    "") die_usage "missing COMMAND" ;;
  esac
  if ! is_command "$COMMAND"; then
    COMMAND=""
    die_usage "unknown command '$1'"
  fi
  shift
  parse_flags "$@"
  check_flags
  if ((DRY_RUN)); then exec 3>&1; else exec 3>&2; fi
  "cmd_$COMMAND"
}
