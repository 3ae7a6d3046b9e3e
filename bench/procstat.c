/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU and I/O of processes, from /proc, for the benchmarks' "per call" figures. A figure is the
 * difference of two samples around a measured run: CPU seconds (utime + stime of
 * /proc/PID/stat) and bytes the process caused to be written to storage (write_bytes of
 * /proc/PID/io: what reached the block layer or the page cache to be flushed, fsyncs
 * included, the figure that wears a disk). The PostgreSQL server is its postmaster and every
 * child of it (backends, WAL writer, checkpointer...), found by the postmaster's pid in
 * ONCEQ_BENCH_PG_PID (bench/run.sh sets it from scripts/pg.sh pid): other clusters on the
 * same machine are not counted. A process that ends between two samples is lost from the
 * second one, so runs sample processes that live through them (the daemons, the server).
 *
 * write_bytes is what a process dirtied in the page cache, counted a folio at a time: on a
 * kernel whose page cache holds large folios (6.18 here, ext4), a file first written in large
 * chunks (PostgreSQL fills a new WAL segment with zeros 256 KB at a time) counts up to 256 KB
 * for each 8 KB write that follows an fsync (measured here: a file filled in 256 KB writes, then
 * 8 KB pwrite + fdatasync: 256 KB of write_bytes each; filled in 8 KB writes: 8 KB). So the
 * benchmarks also print what reached the disks (oq__bench_disk_written), machine-wide.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

/* utime + stime (seconds) and ppid of \p pid; -1 when it is gone. */
static int proc_stat(long pid, double *cpu, long *ppid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t r = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[r] = '\0';
    char *rp = strrchr(buf, ')');
    unsigned long ut, st;
    int pp;
    if (!rp ||
        sscanf(rp + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &pp, &ut, &st) != 3)
        return -1;
    *cpu = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    *ppid = pp;
    return 0;
}

static int64_t proc_write_bytes(long pid)
{
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/%ld/io", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int64_t v = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "write_bytes: ", 13) == 0) v = strtoll(line + 13, NULL, 10);
    fclose(f);
    return v;
}

void oq__bench_procs(long root, int with_children, oq_bench_procs_t *out)
{
    memset(out, 0, sizeof *out);
    if (root <= 0) return;
    double cpu;
    long ppid;
    if (proc_stat(root, &cpu, &ppid) == 0) {
        out->cpu_s += cpu;
        out->write_bytes += proc_write_bytes(root);
        out->n++;
    }
    if (!with_children) return;
    DIR *d = opendir("/proc");
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0 || pid == root) continue;
        if (proc_stat(pid, &cpu, &ppid) != 0 || ppid != root) continue;
        out->cpu_s += cpu;
        out->write_bytes += proc_write_bytes(pid);
        out->n++;
    }
    closedir(d);
}

int64_t oq__bench_disk_written(void)
{
    DIR *d = opendir("/sys/block");
    if (!d) return -1;
    int64_t total = 0;
    int found = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char path[320];
        /* a disk of its own has a device link; loop, zram, ram and dm devices have none
         * (their writes are counted where they land, or are memory) */
        snprintf(path, sizeof path, "/sys/block/%s/device", de->d_name);
        if (access(path, F_OK) != 0) continue;
        snprintf(path, sizeof path, "/sys/block/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        /* fields: reads, merged, sectors, ms, writes, merged, sectors written (512 B), ... */
        unsigned long long v[7];
        if (fscanf(f, "%llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                   &v[5], &v[6]) == 7) {
            total += (int64_t)v[6] * 512;
            found = 1;
        }
        fclose(f);
    }
    closedir(d);
    return found ? total : -1;
}

double oq__bench_disk_delta(int64_t before, int64_t after)
{
    return before >= 0 && after >= 0 ? (double)(after - before) : -1;
}

void oq__bench_print_disk(const char *what, double bytes)
{
    if (bytes >= 0)
        printf("per %s: %.0f bytes reached the disks (every process of this machine, /sys/block; "
               "the bytes written above count page-cache folios, bench/procstat.c)\n",
               what, bytes);
}

long oq__bench_pg_pid(void)
{
    const char *s = getenv("ONCEQ_BENCH_PG_PID");
    return s && *s ? strtol(s, NULL, 10) : 0;
}

int oq__bench_free_port(void)
{
    int lo = 32768, hi = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    if (lo <= 12000) lo = 61000; /* an unusual range: above it instead */
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL) ^ (unsigned)clock();
    for (int i = 0; i < 200; i++) {
        int port = 10000 + (int)(rand_r(&seed) % (unsigned)(lo - 10000));
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return -1;
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) return port;
    }
    return -1;
}
