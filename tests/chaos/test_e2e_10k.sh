#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-labels: long
# The issue's full-size pipeline runs (label chaos, so the default suite stays short):
# 10,000 mixed calls through producer -> relay -> 3 consumers -> results -> producer, then
# the kill -9 of a consumer mid-run with 10,000 calls at 1,000/s. ONCEQ_E2E_CALLS overrides
# the size. Each part is the integration script of the same name, run at full size.
set -u
: "${ONCEQ_SRC:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
export ONCEQ_E2E_CALLS=${ONCEQ_E2E_CALLS:-10000}
bash "$ONCEQ_SRC/tests/integration/test_e2e_pipeline.sh" || exit 1
ONCEQ_E2E_RATE=${ONCEQ_E2E_RATE:-1000} bash "$ONCEQ_SRC/tests/integration/test_e2e_kill_consumer.sh" || exit 1
echo "PASS: full-size e2e ($ONCEQ_E2E_CALLS calls) and kill -9 consumer"
