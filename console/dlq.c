/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dlq.c: the console's Kafka dead letters, through `onceq dlq` itself. The DLQ topic is read
 * and redriven by main/cmd_dlq.c (assign, read to the high watermark, re-publish with the
 * message id and the onceq-redrive header, wait for the delivery report); rather than a second
 * copy of that, the console runs the very binary it is part of (/proc/self/exe, never a shell:
 * argv is built here and a ref is checked to be PARTITION:OFFSET first) and reads its stdout.
 * A child that overruns its deadline is killed; its exit code is the CLI's (0 ok, 2 refused,
 * 4 no such dead letter).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "console_int.h"
#include "oq_util.h"

#define OUT_MAX (8 * 1024 * 1024)

int oq__console_run(const char *exe, char *const argv[], int64_t timeout_ms, char **out,
                    int *exit_code, oq_error_t *err)
{
    int fd[2];
    if (pipe(fd) != 0) return oq_error_set(err, OQ_EIO, errno, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return oq_error_set(err, OQ_EIO, errno, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execv(exe, argv);
        _exit(127);
    }
    close(fd[1]);
    char *b = NULL;
    size_t n = 0, cap = 0;
    int ret = 0;
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    for (;;) {
        int64_t left = (deadline - oq_mono_us()) / 1000;
        if (left <= 0) {
            ret = oq_error_set(err, OQ_ETIMEDOUT, 0, "onceq dlq: no answer in %lld ms",
                               (long long)timeout_ms);
            break;
        }
        struct pollfd p = {fd[0], POLLIN, 0};
        if (poll(&p, 1, (int)(left > 1000 ? 1000 : left)) <= 0) continue;
        if (n + 65536 + 1 > cap) {
            char *nb = cap < OUT_MAX ? realloc(b, cap = cap ? cap * 2 : 131072) : NULL;
            if (!nb) {
                ret = oq_error_set(err, OQ_ENOMEM, 0, "onceq dlq: output too large");
                break;
            }
            b = nb;
        }
        ssize_t got = read(fd[0], b + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fd[0]);
    int st = 0;
    if (ret) kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (ret) {
        free(b);
        return ret;
    }
    if (!b && !(b = malloc(1))) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    b[n] = 0;
    *out = b;
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return 0;
}
