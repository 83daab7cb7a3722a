# Sourced by scripts/test.sh and scripts/gpu-check.sh: the counts of a ctest log.
#
#   ctest_summary LOG   prints "FAILED TOTAL" from ctest's closing line, or nothing when the
#                       log has none. That line reads "97% tests passed, 4 tests failed out of
#                       146"; CMake 4 writes "100% tests passed out of 146" when none failed.
ctest_summary() {
  local line failed=0
  line=$(grep -E '[0-9]+% tests passed(, [0-9]+ tests? failed)? out of [0-9]+' "$1" | tail -n1)
  [ -n "$line" ] || return 0
  [[ $line =~ ([0-9]+)\ tests?\ failed ]] && failed=${BASH_REMATCH[1]}
  echo "$failed $(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")"
}
