# Sourced by the scripts: `step NAME` prints the step and the time since the script started
# on stderr, so a long first run says what it is doing and for how long.
__progress_start=$(date +%s)
step() {
    local now elapsed
    now=$(date +%s)
    elapsed=$((now - __progress_start))
    printf '== [%02d:%02d] %s\n' $((elapsed / 60)) $((elapsed % 60)) "$*" >&2
}
