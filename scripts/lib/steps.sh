# shellcheck shell=bash
# One line per step of a set-up script, with its time; what the step's tools print (pip's output,
# mostly) goes to a log, shown when a step fails. Sourced by scripts/setup.sh and the environment
# scripts (setup_nemo_rl.sh, setup_verl.sh, setup_vllm_matrix.sh, setup_triton_interpreter.sh), each
# from the repository root:
#
#   steps_log PREFIX NAME      every line printed starts "PREFIX: "; the log is .cache/logs/NAME.log,
#                              emptied (STEP_LOG holds its path)
#   step WHAT COMMAND [ARG...] runs COMMAND with its stdout and stderr appended to the log (its stdin
#                              is the caller's: a here-document works) and prints
#                              "PREFIX: WHAT ... 12 s". A command may write a one-line result to the
#                              file named by $STEP_RESULT; the line then ends "... RESULT (12 s)".
#                              When COMMAND fails: "... failed after 12 s (exit 1)", then the log's
#                              last STEP_TAIL_LINES (60) lines and its path on stderr, and step
#                              returns COMMAND's status (under set -e the script ends there).
#   step --may-fail WHAT ...   the same, but a failure is that one line only (for a step the script
#                              retries another way, or whose failure it ignores); the log keeps it all
#   step_fail MESSAGE          "PREFIX: MESSAGE (log: PATH)" on stderr, then exit 1
#
# COMMAND is a program, or a function that returns non-zero itself when it fails: set -e does not
# apply inside it (step runs it where bash ignores set -e).

STEP_PREFIX=setup
STEP_LOG=.cache/logs/setup.log
STEP_TAIL_LINES=${STEP_TAIL_LINES:-60}

steps_log() {
  STEP_PREFIX=$1
  STEP_LOG=.cache/logs/$2.log
  mkdir -p "$(dirname "$STEP_LOG")"
  echo "# $STEP_PREFIX, $(date '+%Y-%m-%d %H:%M:%S') in $PWD" > "$STEP_LOG"
}

step() {
  local may_fail=0
  if [[ "$1" == --may-fail ]]; then
    may_fail=1
    shift
  fi
  local what=$1 start status=0 result elapsed
  shift
  printf '%s: %s ... ' "$STEP_PREFIX" "$what"
  start=$(date +%s)
  result=$(mktemp)
  {
    printf '\n=== %s: %s (%s)\n+' "$STEP_PREFIX" "$what" "$(date '+%H:%M:%S')"
    printf ' %q' "$@"
    printf '\n'
  } >> "$STEP_LOG"
  STEP_RESULT=$result "$@" >> "$STEP_LOG" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - start ))
  if [[ $status == 0 ]]; then
    if [[ -s "$result" ]]; then
      echo "$(head -n 1 "$result") ($elapsed s)"
    else
      echo "$elapsed s"
    fi
    rm -f "$result"
    return 0
  fi
  rm -f "$result"
  echo "=== exit $status after $elapsed s" >> "$STEP_LOG"
  echo "failed after $elapsed s (exit $status)"
  if [[ $may_fail == 0 ]]; then
    {
      echo "$STEP_PREFIX: the last $STEP_TAIL_LINES lines of $PWD/$STEP_LOG:"
      tail -n "$STEP_TAIL_LINES" "$STEP_LOG"
      echo "$STEP_PREFIX: $what failed (exit $status); its whole output is in $PWD/$STEP_LOG"
    } >&2
  fi
  return "$status"
}

step_fail() {
  echo "$STEP_PREFIX: $1 (log: $PWD/$STEP_LOG)" >&2
  exit 1
}
