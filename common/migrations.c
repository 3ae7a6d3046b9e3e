/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Migration sets: the ordered schema/ files that make up each database. PRAGMA user_version
 * is the number of entries applied, so entries are only ever appended, never reordered or
 * edited once released.
 */
#include <stddef.h>

#include "oq_db.h"

/* clang-format off */
const char *const oq_migrations_producer[] = {
    "common/0001_outbox.sql",
    "producer/0001_init.sql",
    "producer/0002_calls_hot_path.sql",
    "common/0002_outbox_watermark.sql",
    "common/0003_outbox_dead.sql",
    "producer/0003_redrive.sql",
    "producer/0004_settled_expiry.sql",
    "producer/0005_webhooks.sql",
    "producer/0006_tasks.sql", /* tasks (producer/tasks.c) */
    "producer/0007_task_review.sql", /* task approval and review: the task's review fence */
    "producer/0008_expires_settled.sql", /* calls_expires partial: a submit writes no entry */
    NULL,
};

const char *const oq_migrations_consumer[] = {
    "common/0001_outbox.sql",
    "consumer/0001_init.sql",
    "common/0002_outbox_watermark.sql",
    "common/0003_outbox_dead.sql",
    "consumer/0002_downstream.sql",
    "consumer/0003_dlq_code.sql",
    "consumer/0004_retention.sql",
    "consumer/0005_lease_clock.sql", /* the lease clock: one anchor per boot of the host */
    NULL,
};
/* clang-format on */
