#!/usr/bin/env bash
# numpy's own test suite, plain and under `pagefold run` (pytest_suite.sh with
# --package numpy; the same options).
exec "$(dirname "$0")/pytest_suite.sh" --package numpy "$@"
