/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file console_int.h
 * @brief Internals of the console (not installed).
 */
#ifndef OQ_CONSOLE_INT_H
#define OQ_CONSOLE_INT_H

#include <stdint.h>

#include "oq_error.h"

/**
 * @brief Run \p exe with \p argv (NULL-terminated, argv[0] included), no shell; \p out
 *        receives its stdout (NUL-terminated, caller frees), \p exit_code its exit status.
 * @locality the console's server thread.
 * @returns 0, OQ_ETIMEOUT (killed at \p timeout_ms), OQ_EIO, OQ_ENOMEM.
 */
int oq__console_run(const char *exe, char *const argv[], int64_t timeout_ms, char **out,
                    int *exit_code, oq_error_t *err);

#endif
