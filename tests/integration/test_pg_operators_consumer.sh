#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 90
# test_pg_operators with the consumer on PostgreSQL too (one database, schema onceq): every
# operator flow of that test, its consumer side (review, inspect's join, purge --consumer-db,
# the console's review queue and resolve) through the consumer's store on PostgreSQL.
# Skipped (77) without ONCEQ_TEST_PG_URL.
OQ_OPS_CONSUMER=pg exec bash "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/test_pg_operators.sh"
