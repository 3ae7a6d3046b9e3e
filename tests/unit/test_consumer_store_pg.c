/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_consumer_store.c, the same test bodies, on PostgreSQL (consumer/store_pg.c): a fresh
 * database of ONCEQ_TEST_PG_URL's server (skipped without it, a failure under CI=true).
 */
#define OQ_TEST_CONSUMER_PG "oq_unit_consumer_store"
#include "test_consumer_store.c"
